"""Multi-turn trajectories in the actor: tool-output tokens (action_mask False) are context. They get no
policy-gradient, no entropy, and are not counted by the token-level loss (Eq. 12), which stays exact over the model's
own tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from actor_helpers import actor_config, plan_of, random_batch
from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import compute_log_probs_batch
from dapo.actor.update import FirstPassRecord, accumulate_mini_batch_gradients
from tests.harness.models import ACTOR, tiny_qwen2

TEMPERATURE = 1.0


def with_tool_tokens(batch: TrainBatch, seed: int = 0) -> TrainBatch:
    """Each response's first token is the model's; later tokens are tool output with probability 1/2."""
    g = torch.Generator().manual_seed(seed)
    masks = []
    for r in batch.response_ids:
        m = torch.rand(r.numel(), generator=g) < 0.5
        m[0] = True
        masks.append(m)
    return dataclasses.replace(batch, action_mask=masks)


def test_loss_mask_is_the_hand_computed_and_of_response_sample_and_action_masks() -> None:
    batch = TrainBatch(
        prompt_ids=[[1, 2], [3]],
        response_ids=[[4, 5, 6, 7], [8, 9, 10]],
        advantages=torch.tensor([1.0, -1.0]),
        sample_mask=torch.tensor([True, True]),
        group_index=torch.tensor([0, 0]),
        action_mask=[torch.tensor([True, True, False, True]), torch.tensor([True, False, True])],
    )
    assert batch.loss_mask().tolist() == [[True, True, False, True], [True, False, True, False]]
    dropped = dataclasses.replace(batch, sample_mask=torch.tensor([True, False]))
    assert dropped.loss_mask().tolist() == [[True, True, False, True], [False] * 4]
    assert batch.select([1]).action_mask[0].tolist() == [True, False, True]
    assert dataclasses.replace(batch, action_mask=None).loss_mask().tolist() == [[True] * 4, [True] * 3 + [False]]


def test_a_mask_of_the_wrong_shape_or_dtype_is_refused() -> None:
    batch = random_batch(1, 2)
    with pytest.raises(ValueError, match=r"TrainBatch.action_mask\[0\] must be a bool tensor"):
        dataclasses.replace(
            batch,
            action_mask=[
                torch.ones(batch.response_ids[0].numel() + 1, dtype=torch.bool),
                torch.ones(batch.response_ids[1].numel(), dtype=torch.bool),
            ],
        )
    with pytest.raises(ValueError, match=r"TrainBatch.action_mask\[1\] must be a bool tensor"):
        dataclasses.replace(
            batch,
            action_mask=[
                torch.ones(batch.response_ids[0].numel(), dtype=torch.bool),
                torch.ones(batch.response_ids[1].numel()),
            ],
        )
    with pytest.raises(ValueError, match="action_mask has 1 entries for 2 samples"):
        dataclasses.replace(batch, action_mask=[torch.ones(batch.response_ids[0].numel(), dtype=torch.bool)])


def test_token_level_loss_counts_only_the_models_tokens() -> None:
    """On-policy (ratio 1) the clipped loss of a token is -A, so Eq. 12 is -sum_i A_i n_i / sum_i n_i with n_i the
    model tokens of sample i: hand-computed here from the masks alone."""
    model = tiny_qwen2(0, ACTOR)
    batch = with_tool_tokens(random_batch(2, 3, seed=1, max_response=10), seed=2)
    n = torch.tensor([int(m.sum()) for m in batch.action_mask], dtype=torch.float32)
    expected = float(-(batch.advantages * n).sum() / n.sum())
    cfg = actor_config(loss_agg_mode="token-mean", entropy_coeff=0.0)
    result = accumulate_mini_batch_gradients(
        model, plan_of(model, batch, cfg, norm_length=16), cfg, temperature=TEMPERATURE, on_policy=True
    )
    assert result.num_tokens == int(n.sum()) < sum(batch.response_lengths)
    assert result.pg_loss == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_tool_tokens_carry_no_gradient_whatever_their_log_probs() -> None:
    """Garbage old/rollout log-probs at tool positions (the rollout reports 0.0 there) change nothing; removing the
    mask does change the gradient, so the test can fail."""
    cfg = actor_config(loss_agg_mode="token-mean", entropy_coeff=0.01)
    batch = with_tool_tokens(random_batch(2, 2, seed=3, max_response=10), seed=4)
    model = tiny_qwen2(1, ACTOR)
    with torch.no_grad():
        old = compute_log_probs_batch(model, batch, cfg, TEMPERATURE)
    garbage = [torch.where(m, lp, torch.full_like(lp, 5.0)) for lp, m in zip(old, batch.action_mask)]

    def gradient(b: TrainBatch) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        accumulate_mini_batch_gradients(model, plan_of(model, b, cfg, norm_length=16), cfg, temperature=TEMPERATURE)
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    masked = gradient(batch.with_old_log_probs([lp - 0.1 for lp in old]))
    torch.testing.assert_close(
        gradient(batch.with_old_log_probs([lp - 0.1 for lp in garbage])), masked, atol=1e-7, rtol=0
    )
    unmasked = gradient(dataclasses.replace(batch, action_mask=None).with_old_log_probs([lp - 0.1 for lp in old]))
    assert (unmasked - masked).abs().max() > 1e-4


def test_the_entropy_metric_record_holds_only_the_models_tokens() -> None:
    model = tiny_qwen2(2, ACTOR)
    batch = with_tool_tokens(random_batch(2, 2, seed=5, max_response=9), seed=6)
    record = FirstPassRecord()
    cfg = actor_config()
    accumulate_mini_batch_gradients(
        model, plan_of(model, batch, cfg, norm_length=16), cfg, temperature=TEMPERATURE, on_policy=True, record=record
    )
    assert sorted(e.numel() for e in record.entropies) == sorted(int(m.sum()) for m in batch.action_mask)
