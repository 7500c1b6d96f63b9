"""Data parallelism over whole prompt groups: who trains on what, and summing gradients across ranks.

A group is never split across ranks (its samples share one advantage normalisation and one Eq. 11 decision). Every
rank holds the whole scored batch (gathered after generation), so the token-mean denominator of a mini-batch is known
everywhere without a collective, and an update on N ranks equals the single-process update on the same batch: each
rank backpropagates the loss of its share divided by the mini-batch's *global* token count, and the gradients are
summed (not averaged) over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.distributed.world import World


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
