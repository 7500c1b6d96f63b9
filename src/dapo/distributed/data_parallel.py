"""Data parallelism over whole prompt groups: who generates what, who trains on what, and summing gradients.

Generation: every rank draws the same generation batch (same sampler state), generates and scores only its
contiguous share of the prompts (:func:`generation_share`), and the scored groups are gathered in rank order
(:func:`gather_in_rank_order`), which is batch order again: every rank then holds the identical list, and dynamic
sampling, the sampler's records and the metrics are computed identically everywhere, with no further collective.

A group is never split across ranks (its samples share one advantage normalisation and one Eq. 11 decision). Every
rank holds the whole scored batch (gathered after generation), so the token-mean denominator of a mini-batch is known
everywhere without a collective, and an update on N ranks equals the single-process update on the same batch: each
rank backpropagates the loss of its share divided by the mini-batch's *global* token count, and the gradients are
summed (not averaged) over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from dapo.distributed.world import World

T = TypeVar("T")


def generation_share(num_prompts: int, world: World) -> slice:
    """This rank's contiguous slice of a generation batch of ``num_prompts``: sizes differ by at most one (the first
    ``num_prompts % world_size`` ranks take one more), and the slices of ranks 0..N-1 tile the batch in order.

    Contiguous, not strided, so that gathering the shares in rank order gives back the batch order. Response lengths
    are not known before generating, so the split balances prompts, not tokens (the update balances tokens).
    """
    base, extra = divmod(num_prompts, world.world_size)
    start = world.rank * base + min(world.rank, extra)
    return slice(start, start + base + (1 if world.rank < extra else 0))


def gather_in_rank_order(items: Sequence[T], world: World) -> list[T]:
    """Every rank's ``items`` concatenated in rank order, on every rank (one object all-gather; identity alone)."""
    if not world.distributed:
        return list(items)
    return [item for part in world.all_gather_objects(list(items)) for item in part]


def balanced_group_shares(group_tokens: Sequence[int], world_size: int) -> list[list[int]]:
    """Assign whole groups to ranks so that token counts are balanced: longest group first onto the lightest rank.

    Returns, per rank, the group indices it trains on, in ascending order (groups stay in batch order). Deterministic,
    so every rank computes the same plan from the same batch.
    """
    if world_size < 1:
        raise ValueError(f"balanced_group_shares: world_size must be >= 1, got {world_size}")
    loads = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for g in sorted(range(len(group_tokens)), key=lambda i: (-group_tokens[i], i)):
        r = min(range(world_size), key=lambda k: (loads[k], k))
        shares[r].append(g)
        loads[r] += group_tokens[g]
    return [sorted(s) for s in shares]


def sum_gradients(model: torch.nn.Module, world: World) -> None:
    """Sum ``.grad`` over ranks for a replicated (unsharded) model; FSDP2 modules reduce-scatter in backward instead.

    A parameter without a gradient on this rank (its share used no such path) contributes zeros.
    """
    if not world.distributed:
        return
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        world.all_reduce_sum(p.grad)


def replicas_differ(model: torch.nn.Module, world: World) -> list[str]:
    """Names of the parameters whose values are not the same on every rank (empty alone, and when replicas agree).

    A replicated model stays bitwise equal across ranks only if every rank applies the same summed gradients; rank 0
    checkpoints it as the whole state, so the trainer checks this before saving. One fp64 sum and absolute sum per
    parameter are compared, not the weights, which catches a diverged replica at the cost of a small all-gather.
    """
    if not world.distributed:
        return []
    named = [(name, p) for name, p in model.named_parameters()]
    with torch.no_grad():
        mine = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for _, p in named]).cpu()
    ranks = world.all_gather_objects(mine)
    return [name for i, (name, _) in enumerate(named) if any(not torch.equal(r[i], ranks[0][i]) for r in ranks)]
