"""The committed tiny model (src/dapo/assets/tiny-qwen2): loads offline, is Qwen2 + ChatML, and can do the task."""

from __future__ import annotations

import re

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import dapo
from dapo.data.synth import default_synth_config, generate_synth_problems, synth_records

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
MAX_ASSET_BYTES = 10 * 1024 * 1024

pytestmark = pytest.mark.skipif(not (ASSET / "model.safetensors").exists(), reason="tiny model not built yet")


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(ASSET, local_files_only=True)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return AutoModelForCausalLM.from_pretrained(ASSET, local_files_only=True, dtype=torch.float32).eval()


def test_asset_is_small_and_complete() -> None:
    files = {f.name: f.stat().st_size for f in ASSET.iterdir() if f.is_file()}
    for required in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "pretrain_report.json",
    ):
        assert required in files, f"{required} missing from {ASSET}"
    assert sum(files.values()) <= MAX_ASSET_BYTES, files
    assert not [d for d in ASSET.iterdir() if d.is_dir()], "no sub-folders (no leftover temp dirs)"


def test_config_is_a_standard_small_qwen2() -> None:
    config = AutoConfig.from_pretrained(ASSET, local_files_only=True)
    assert config.model_type == "qwen2"
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert config.max_position_embeddings >= 512
    assert config.tie_word_embeddings is True
    assert config.hidden_size % config.num_attention_heads == 0
    assert config.num_attention_heads % config.num_key_value_heads == 0


def test_special_tokens_and_eos(tokenizer, model) -> None:  # type: ignore[no-untyped-def]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in (None, tokenizer.unk_token_id)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == pad
    assert model.config.eos_token_id == im_end and model.config.pad_token_id == pad
    generation = GenerationConfig.from_pretrained(ASSET, local_files_only=True)
    assert generation.eos_token_id == im_end and generation.pad_token_id == pad
    assert len(tokenizer) <= model.config.vocab_size
    # special tokens are atomic, never split into bytes
    assert tokenizer.encode("<|im_start|>user<|im_end|>", add_special_tokens=False)[
        0
    ] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_chat_template_is_chatml_with_generation_prompt(tokenizer) -> None:  # type: ignore[no-untyped-def]
    messages = synth_records(generate_synth_problems(1, seed=0))[0]["prompt"]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    without = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert without == f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.decode(ids) == text  # round trip, byte-level
    assert len(ids) < 128, "the DAPO template should be compact under this vocabulary"


def test_digits_are_single_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    for number in ("0", "7", "42", "1234567890", "-305"):
        pieces = [tokenizer.decode([i]) for i in tokenizer.encode(number, add_special_tokens=False)]
        assert [p for p in pieces if any(c.isdigit() for c in p)] == [c for c in number if c.isdigit()], pieces
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("12 + 15 = 27\nAnswer: 27", add_special_tokens=False)]
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p)), pieces


def test_report_records_how_the_model_was_trained() -> None:
    report = json.loads((ASSET / "pretrain_report.json").read_text())
    assert report["synth_config"] == default_synth_config().to_dict()
    assert report["train_seed"] != report["val_seed"]
    assert report["num_train_problems"] > 0
    validation = report["validation"]
    for key in ("greedy_acc", "pass@1_topp1.0", "pass@8_topp1.0", "pass@1_topp0.7", "pass@8_topp0.7"):
        assert 0.0 <= validation[key] <= 1.0
    assert validation["pass@1_topp1.0"] <= validation["pass@8_topp1.0"]


def test_model_greedily_solves_some_easy_problems(tokenizer, model) -> None:  # type: ignore[no-untyped-def]
    """Behaviour check: the SFT model writes the worked-solution format and gets some answers right."""
    problems = generate_synth_problems(16, seed=2024, config=default_synth_config())
    tokenizer.padding_side = "left"
    texts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        for r in synth_records(problems)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, max_new_tokens=48)
    responses = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    finals = [r.strip().splitlines()[-1] if r.strip() else "" for r in responses]
    # The SFT data states the result in two formats, only "Answer: N" being rewarded (see the pretraining script):
    # greedy decoding follows the majority format, so check the formats are learned and the arithmetic is right.
    stated = [re.fullmatch(r"(?:Answer: |The answer is )(-?\d+)\.?", f) for f in finals]
    assert sum(m is not None for m in stated) >= 14, responses
    correct = sum(m is not None and int(m.group(1)) == p.answer for m, p in zip(stated, problems))
    assert correct >= 8, list(zip(finals, [p.answer for p in problems]))
