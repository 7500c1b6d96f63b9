"""Equal micro-batch counts for a sharded (FSDP2) actor: every rank plans every rank's cut of the same mini-batch, and
the ranks with fewer micro-batches pad with zero-weight passes; a zero-weight pass leaves the gradient unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dapo.actor.micro_batching import padding_micro_batches
from dapo.actor.mini_batch_plan import cut_micro_batches, rank_shares, sharded_share
from dapo.actor.update import accumulate_mini_batch_gradients
from dapo.distributed.world import World
from tests.actor.actor_helpers import actor_config, plan_of, random_batch
from tests.harness.models import ACTOR, tiny_qwen2


def test_padding_brings_every_rank_to_the_largest_count() -> None:
    counts = [3, 5, 0, 5]
    assert [padding_micro_batches(counts, r) for r in range(4)] == [2, 0, 5, 0]
    with pytest.raises(ValueError, match="rank 4"):
        padding_micro_batches(counts, 4)


def test_every_rank_ends_with_the_same_number_of_passes() -> None:
    batch = random_batch(5, 3, seed=11, max_prompt=6, max_response=12, masked=(4,))
    advantages = batch.advantages.clone()
    advantages[:3] = 0.0  # group 0 trains nothing: its rank needs fewer micro-batches
    batch = dataclasses.replace(batch, advantages=advantages)
    cfg = actor_config(ppo_mini_batch_size=5, ppo_max_token_len_per_gpu=24, layout="padded")
    for world_size in (2, 3, 8):  # 8 ranks for 5 groups: some shares are empty and run padding only
        plans = [sharded_share(batch, cfg, World(rank=r, world_size=world_size), "padded") for r in range(world_size)]
        totals = {len(p.cut.micro_batches) + p.num_padding for p in plans}
        assert len(totals) == 1
        assert [len(p.share) for p in plans] == [len(s) for s in rank_shares(batch, world_size)]
        assert all(len(p.filler) == 1 for p in plans)
        assert sum(p.num_padding for p in plans) > 0
    assert len(cut_micro_batches(batch, cfg, "padded").micro_batches) > 0


def test_zero_weight_passes_leave_the_gradient_exactly_unchanged() -> None:
    batch = random_batch(2, 2, seed=3)
    batch = batch.with_old_log_probs([torch.zeros(len(r)) - 0.5 for r in batch.response_ids])
    cfg = actor_config()
    grads = []
    for padding in (None, (batch.select([1]), 2)):
        model = tiny_qwen2(1, ACTOR)
        plan = plan_of(model, batch, cfg, norm_length=8, padding=padding)
        result = accumulate_mini_batch_gradients(model, plan, cfg, temperature=1.0)
        grads.append([p.grad.clone() for p in model.parameters()])
        assert result.num_micro_batches == 1  # padding passes are not counted as trained micro-batches
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
