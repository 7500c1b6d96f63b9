"""Weight push and the stale-weights probe: an engine on its own copy of the weights follows every push (gap ~0),
an engine that drops pushes is caught after one real update, and the probe's numbers are the actual log-prob gap."""

from __future__ import annotations

import copy

import pytest
import torch

from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.training.errors import TrainingError
from dapo.training.weight_sync import WeightSync, actor_log_probs_of
from tests.harness.models import tiny_qwen2
from tests.rollout.rollout_helpers import EOS, PAD, teacher_forced_logprobs

PROBE = list(range(2, 40))


class PushDroppingEngine(HFRolloutEngine):
    """The failure the probe exists for: an engine that keeps generating from the weights it started with."""

    def update_weights(self, named_tensors) -> None:  # noqa: D102 - deliberately ignores the push
        for _ in named_tensors:
            pass


def perturb(model: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    """A stand-in for one optimizer step: every weight moves a little."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)


def test_actor_log_probs_equal_a_teacher_forced_pass() -> None:
    model = tiny_qwen2(1)
    expected = teacher_forced_logprobs(model, PROBE[:10], PROBE[10:20], 1.0)
    torch.testing.assert_close(actor_log_probs_of(model, PROBE[:10], PROBE[10:20]), expected)


def test_shared_module_engine_has_no_gap() -> None:
    actor = tiny_qwen2(1)
    sync = WeightSync(HFRolloutEngine(actor, eos_token_ids=EOS, pad_token_id=PAD), actor, PROBE, threshold=1e-4)
    perturb(actor)
    metrics = sync.push(step=1)
    assert metrics["rollout/probe_logprob_diff"] < 1e-5
    assert metrics["rollout/probe_logprob_diff_max"] >= metrics["rollout/probe_logprob_diff"]


def test_engine_on_its_own_copy_follows_every_push() -> None:
    actor = tiny_qwen2(1)
    engine = HFRolloutEngine(copy.deepcopy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=1e-4)
    for step in range(1, 4):
        perturb(actor, seed=step)
        assert sync.push(step)["rollout/probe_logprob_diff"] < 1e-5
        # the copy really holds the new weights, not just the same log-probs by chance
        for (name, p), q in zip(actor.named_parameters(), engine.model.parameters()):
            assert torch.equal(p, q), name


def test_stale_engine_stops_the_run_with_a_message_naming_stale_weights() -> None:
    actor = tiny_qwen2(1)
    engine = PushDroppingEngine(copy.deepcopy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=0.01)
    assert sync.push(step=0)["rollout/probe_logprob_diff"] < 1e-5  # identical weights before any update
    perturb(actor)
    expected_gap = (
        (
            actor_log_probs_of(actor, sync.prompt, sync.response)
            - teacher_forced_logprobs(engine.model, sync.prompt, sync.response, 1.0)
        )
        .abs()
        .mean()
    )
    assert expected_gap > 0.01  # the update is visible in the probe
    with pytest.raises(TrainingError, match=r"step 1: .*rollout.probe_logprob_threshold=0.01.*stale weights"):
        sync.push(step=1)


def test_without_a_threshold_the_gap_is_only_logged() -> None:
    actor = tiny_qwen2(1)
    engine = PushDroppingEngine(copy.deepcopy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=None)
    perturb(actor)
    gap = sync.push(step=1)["rollout/probe_logprob_diff"]
    expected = (
        (
            actor_log_probs_of(actor, sync.prompt, sync.response)
            - teacher_forced_logprobs(engine.model, sync.prompt, sync.response, 1.0)
        )
        .abs()
        .mean()
    )
    assert gap == pytest.approx(float(expected), rel=1e-5)


def test_disabled_probe_still_pushes() -> None:
    actor = tiny_qwen2(1)
    engine = HFRolloutEngine(copy.deepcopy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=1e-4, enabled=False)
    perturb(actor)
    assert sync.push(step=1) == {}
    assert all(torch.equal(p, q) for p, q in zip(actor.parameters(), engine.model.parameters()))


def test_probe_needs_two_tokens() -> None:
    actor = tiny_qwen2(1)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        WeightSync(HFRolloutEngine(actor, eos_token_ids=EOS, pad_token_id=PAD), actor, [5], threshold=None)


def test_non_finite_weights_are_named_as_such_not_as_a_stale_engine() -> None:
    """NaN weights make both sides' log-probs NaN: the message says non-finite and points at the learning rate."""
    model = tiny_qwen2(2)
    engine = HFRolloutEngine(model, eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, model, PROBE, threshold=1e-3)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingError, match="non-finite") as caught:
        sync.push(step=3)
    assert "step 3" in str(caught.value) and "actor.optim.lr" in str(caught.value)
    assert "stale" not in str(caught.value)


def bf16_copy(actor: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(actor).to(torch.bfloat16)


def test_a_bf16_engine_is_judged_by_its_excess_over_the_first_push() -> None:
    # A bf16 engine against an fp32 actor carries a numerical gap of its own; the first push (same weights) measures
    # it, and pushes that reach the engine stay within the threshold of it however many updates follow.
    actor = tiny_qwen2(1)
    engine = HFRolloutEngine(bf16_copy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=0.05)
    floor = sync.push(step=0)["rollout/probe_logprob_diff"]
    assert sync.numerical_gap == floor and floor > 1e-4  # bf16 rounding, far above an fp32 engine's ~1e-7
    for step in range(1, 4):
        perturb(actor, scale=0.005, seed=step)
        sync.push(step)  # measured: 0.022-0.043 against the first push's 0.024 (a stale engine: 0.12, 0.20, 0.24)
        for (name, p), q in zip(actor.named_parameters(), engine.model.parameters()):
            assert torch.equal(p.detach().to(torch.bfloat16), q), name


def test_a_stale_bf16_engine_is_still_caught() -> None:
    actor = tiny_qwen2(1)
    engine = PushDroppingEngine(bf16_copy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=0.05)
    floor = sync.push(step=0)["rollout/probe_logprob_diff"]
    perturb(actor, scale=0.005)
    with pytest.raises(TrainingError, match=rf"step 1: .* more than the {floor:.4g} of the run's first push.*stale"):
        sync.push(step=1)


def test_an_engine_that_is_off_from_the_start_is_refused_at_the_first_push() -> None:
    actor = tiny_qwen2(1)
    other = tiny_qwen2(2)  # another model entirely
    sync = WeightSync(PushDroppingEngine(other, eos_token_ids=EOS, pad_token_id=PAD), actor, PROBE, threshold=0.05)
    with pytest.raises(TrainingError, match="step 0: right after loading the actor's weights .* does not compute"):
        sync.push(step=0)


def test_the_actor_side_of_the_probe_runs_in_the_engines_precision() -> None:
    # A bf16 engine is compared with the actor under bf16 autocast (on SmolLM2 after 30 steps: 0.061 instead of the
    # 0.199 against the fp32 forward, whose gap grows as training sharpens the model).
    actor = tiny_qwen2(1)
    engine = HFRolloutEngine(bf16_copy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=None, engine_dtype=torch.bfloat16)
    gap = sync.push(step=0)["rollout/probe_logprob_diff"]
    engine_lp = torch.tensor(engine.log_probs_of(sync.prompt, sync.response))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = actor(input_ids=torch.tensor([sync.prompt + sync.response])).logits[0, len(sync.prompt) - 1 : -1]
    autocast_lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(sync.response)[:, None])[:, 0]
    fp32_lp = actor_log_probs_of(actor, sync.prompt, sync.response)
    assert gap == pytest.approx(float((engine_lp - autocast_lp).abs().mean()), rel=1e-5)
    assert gap != pytest.approx(float((engine_lp - fp32_lp).abs().mean()), rel=1e-3)


def test_a_low_precision_engine_is_judged_by_whether_it_follows_the_actor() -> None:
    # Updates large enough to grow the bf16 gap well past the threshold (a fixed bound would stop this healthy run)
    # still pass: each push moves the engine as far as the update moved the actor.
    actor = tiny_qwen2(1)
    engine = HFRolloutEngine(bf16_copy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=0.01, engine_dtype=torch.bfloat16)
    sync.push(step=0)
    for step in range(1, 4):
        perturb(actor, scale=0.05, seed=step)
        metrics = sync.push(step)
        assert metrics["rollout/probe_engine_moved"] > 0.5 * metrics["rollout/probe_actor_moved"] > 0


def test_a_stale_low_precision_engine_is_caught_by_not_moving() -> None:
    actor = tiny_qwen2(1)
    engine = PushDroppingEngine(bf16_copy(actor), eos_token_ids=EOS, pad_token_id=PAD)
    sync = WeightSync(engine, actor, PROBE, threshold=0.05, engine_dtype=torch.bfloat16)
    sync.push(step=0)
    perturb(actor, scale=0.005)
    with pytest.raises(
        TrainingError,
        match=r"step 1: the update moved the actor's log-probs .* bfloat16 rollout "
        r"engine's by 0: the engine is generating from stale weights",
    ):
        sync.push(step=1)


def test_a_low_precision_engine_of_another_model_is_refused_at_the_first_push() -> None:
    actor = tiny_qwen2(1)
    other = bf16_copy(tiny_qwen2(2))
    sync = WeightSync(
        PushDroppingEngine(other, eos_token_ids=EOS, pad_token_id=PAD),
        actor,
        PROBE,
        threshold=0.05,
        engine_dtype=torch.bfloat16,
    )
    with pytest.raises(TrainingError, match="more than a precision accounts for"):
        sync.push(step=0)
