"""scripts/pretrain_tiny_model.py: its pieces (loss, sampler, answer check) and a tiny deterministic end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dapo.data.synth import generate_synth_problems
from tests.harness.models import ACTOR, tiny_qwen2

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_tiny_model.py"
# The model the script's pieces run on: tied embeddings, as the embedded model's; its vocabulary is the tokenizer's.
PRETRAIN = {**ACTOR, "intermediate_size": 64, "tie_word_embeddings": True, "max_position_embeddings": 512}


@pytest.fixture(scope="module")
def pretrain() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pretrain_tiny_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(pretrain: ModuleType, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("tok")
    pretrain.save_tokenizer(pretrain.train_tokenizer(generate_synth_problems(200, seed=0), 400), folder)
    return pretrain.load_tokenizer(folder)


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("7 + 5 = 12\nAnswer: 12", 12, True),
        ("Answer: 12\n", 12, True),
        ("Answer: -3", -3, True),
        ("7 + 5 = 12\nAnswer: 13", 12, False),
        ("Answer: 12\n12 + 1 = 13", 12, False),  # the answer must be on the last line
        ("Answer: 120", 12, False),
        ("12", 12, False),
        ("", 12, False),
    ],
)
def test_is_correct_checks_the_last_answer_line(
    pretrain: ModuleType, response: str, answer: int, expected: bool
) -> None:
    assert pretrain.is_correct(response, answer) is expected


def test_top_p_filter_keeps_the_smallest_nucleus(pretrain: ModuleType) -> None:
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    kept = lambda p: torch.isfinite(pretrain.top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(1.0) == [True, True, True]
    assert kept(0.7) == [True, True, False]  # 0.5 < 0.7 needs the second token; 0.8 >= 0.7 stops
    assert kept(0.5) == [True, False, False]
    assert kept(0.01) == [True, False, False]  # never empty
    shuffled = torch.tensor([[math.log(0.2), math.log(0.5), math.log(0.3)]])
    assert torch.isfinite(pretrain.top_p_filter(shuffled, 0.7))[0].tolist() == [False, True, True]


def test_common_prefix_length(pretrain: ModuleType) -> None:
    assert pretrain.common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert pretrain.common_prefix_length([[1, 2], [1, 2]]) == 2
    assert pretrain.common_prefix_length([[9, 2], [1, 2]]) == 0


def test_shared_prefix_loss_equals_full_sequence_loss(pretrain: ModuleType, tokenizer) -> None:  # type: ignore[no-untyped-def]
    examples = [pretrain.encode_example(tokenizer, p) for p in generate_synth_problems(6, seed=3)]
    prefix_len = pretrain.common_prefix_length([ids for ids, _ in examples])
    assert prefix_len > 20  # the start of the DAPO template is shared
    model = tiny_qwen2(0, PRETRAIN, vocab_size=len(tokenizer))
    shared = pretrain.sft_loss(
        model, examples[0][0][:prefix_len], pretrain.collate_suffixes(examples, prefix_len, tokenizer.pad_token_id)
    )
    (g_shared,) = torch.autograd.grad(shared, model.model.embed_tokens.weight)
    full = pretrain.sft_loss(model, [], pretrain.collate_suffixes(examples, 0, tokenizer.pad_token_id))
    (g_full,) = torch.autograd.grad(full, model.model.embed_tokens.weight)
    torch.testing.assert_close(shared, full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_shared, g_full, rtol=1e-4, atol=1e-6)


def test_labels_cover_exactly_the_response_and_im_end(pretrain: ModuleType, tokenizer) -> None:  # type: ignore[no-untyped-def]
    problem = generate_synth_problems(1, seed=4)[0]
    ids, labels = pretrain.encode_example(tokenizer, problem)
    supervised = [t for t in labels if t != -100]
    assert tokenizer.decode(supervised) == problem.solution + "<|im_end|>"
    assert ids[len(ids) - len(supervised) :] == supervised
    assert tokenizer.decode(ids[: len(ids) - len(supervised)]).endswith("<|im_start|>assistant\n")


def test_greedy_sampler_matches_generate_with_left_padding(pretrain: ModuleType, tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = tiny_qwen2(0, PRETRAIN, vocab_size=len(tokenizer))
    problems = generate_synth_problems(3, seed=5)
    prompts = [pretrain.prompt_ids(tokenizer, p) for p in problems]
    assert len({len(p) for p in prompts}) > 1  # different lengths -> left padding is exercised
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ours = pretrain.sample_responses(
        model,
        prompts,
        num_samples=2,
        greedy=True,
        top_p=1.0,
        eos_id=eos,
        pad_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
        max_new_tokens=8,
    )
    for i, prompt in enumerate(prompts):
        reference = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=8,
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt) :].tolist()
        cut = reference.index(eos) + 1 if eos in reference else len(reference)
        assert ours[2 * i] == ours[2 * i + 1] == reference[:cut]


def test_sampler_is_seeded(pretrain: ModuleType, tokenizer) -> None:  # type: ignore[no-untyped-def]
    model = tiny_qwen2(0, PRETRAIN, vocab_size=len(tokenizer))
    prompts = [pretrain.prompt_ids(tokenizer, p) for p in generate_synth_problems(2, seed=6)]
    run = lambda seed: pretrain.sample_responses(  # noqa: E731
        model,
        prompts,
        num_samples=3,
        greedy=False,
        top_p=1.0,
        eos_id=2,
        pad_id=0,
        generator=torch.Generator().manual_seed(seed),
        max_new_tokens=6,
    )
    assert run(1) == run(1)
    assert run(1) != run(2)


TINY_ARGS = [
    "--steps",
    "3",
    "--batch-size",
    "4",
    "--num-train",
    "64",
    "--num-val",
    "3",
    "--samples",
    "2",
    "--hidden-size",
    "32",
    "--intermediate-size",
    "64",
    "--num-layers",
    "1",
    "--num-heads",
    "2",
    "--num-kv-heads",
    "1",
    "--vocab-size",
    "400",
    "--warmup-steps",
    "1",
    "--threads",
    "1",
]


def run_script(pretrain: ModuleType, args: list[str]) -> int:
    """main() seeds torch and sets its thread count: keep both from leaking into the rest of the test session."""
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng():
            return pretrain.main(args)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_script_writes_a_loadable_folder_deterministically(pretrain: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    assert run_script(pretrain, [*TINY_ARGS, "--out", str(out)]) == 0
    first = (out / "model.safetensors").read_bytes()
    report = json.loads((out / "pretrain_report.json").read_text())
    assert report["steps"] == 3 and report["num_train_problems"] == 64
    assert set(report["validation"]) >= {"greedy_acc", "pass@1_topp1.0", "pass@2_topp1.0", "pass@1_topp0.7"}

    # a second run replaces the folder atomically and reproduces the same weights
    (out / "stale-file").write_text("from an older build")
    assert run_script(pretrain, [*TINY_ARGS, "--out", str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() == first
    assert not (out / "stale-file").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no temp or backup folders left behind

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    assert tok.chat_template and "add_generation_prompt" in tok.chat_template
