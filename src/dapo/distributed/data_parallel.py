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

Sharded actors (``actor.strategy=fsdp2``, ``dapo.distributed.fsdp``) are handled here too, without this module knowing
the wrapper: :func:`is_sharded` recognises one by torch's ``FSDPModule``, :func:`forward_through` runs a forward pass
through its root, and the gradient helpers work on the local shards (every rank holds a different one, so they
reduce over ranks where a replicated model would not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch.distributed.tensor import DTensor

from dapo.distributed.world import World

T = TypeVar("T")


def check_tensor_parallel(world: World, tensor_parallel: int) -> None:
    """Refuse a tensor-parallel size that does not tile the world into whole engine groups."""
    if tensor_parallel < 1 or world.world_size % tensor_parallel != 0:
        raise ValueError(
            f"rollout.tensor_model_parallel_size ({tensor_parallel}) must divide the number of ranks "
            f"({world.world_size}): every rank belongs to exactly one rollout engine"
        )


def engine_index(world: World, tensor_parallel: int = 1) -> tuple[int, int]:
    """(which engine this rank serves, how many engines): ranks ``k*tp .. k*tp + tp - 1`` form engine ``k``, a
    tensor-parallel group that decodes the same prompts with the same seeds (vLLM's layout: tensor parallel is the
    innermost dimension of the world, so a group is consecutive ranks, on one node when tp divides the node's GPUs)."""
    check_tensor_parallel(world, tensor_parallel)
    return world.rank // tensor_parallel, world.world_size // tensor_parallel


def generation_share(num_prompts: int, world: World, tensor_parallel: int = 1) -> slice:
    """This rank's contiguous slice of a generation batch of ``num_prompts``: the share of its engine (every rank of a
    tensor-parallel group gets the same one). Sizes differ by at most one (the first ``num_prompts % engines`` engines
    take one more), and the slices of engines 0..E-1 tile the batch in order.

    Contiguous, not strided, so that gathering the shares in rank order gives back the batch order. Response lengths
    are not known before generating, so the split balances prompts, not tokens (the update balances tokens).
    """
    index, count = engine_index(world, tensor_parallel)
    base, extra = divmod(num_prompts, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def is_engine_leader(world: World, tensor_parallel: int = 1) -> bool:
    """Whether this rank is the first of its rollout engine's ranks: the one whose outputs are scored and gathered."""
    return world.rank % tensor_parallel == 0


def gather_in_rank_order(
    items: Sequence[T], world: World, tensor_parallel: int = 1, *, generated: Any = None
) -> list[T]:
    """Every engine's ``items`` concatenated in engine order, on every rank (one object all-gather; identity alone).

    With tensor parallel the items of each group's first rank are taken (its peers generated the same share and need
    not score it: they may pass nothing). ``generated``, what each rank's engine returned (the response token ids),
    is compared among the ranks of a group first: ranks that sampled differently would leave the group's engines in
    disagreement with the batch that is trained on, an error and never a silent choice."""
    if not world.distributed:
        return list(items)
    check_tensor_parallel(world, tensor_parallel)
    parts = world.all_gather_objects((list(items), generated))
    for first in range(0, world.world_size, tensor_parallel):
        for peer in range(first + 1, first + tensor_parallel):
            if parts[peer][1] != parts[first][1]:
                raise RuntimeError(
                    f"ranks {first} and {peer} of one tensor-parallel rollout engine generated "
                    "different outputs for the same prompts and seeds: the engine's ranks have diverged"
                )
    return [item for part, _ in parts[::tensor_parallel] for item in part]


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


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 root (``dapo.distributed.fsdp.shard_actor``): its parameters are shards."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def forward_through(model: torch.nn.Module, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(model, *args, **kwargs)``; for a sharded model, ``fn`` runs on the causal LM inside ONE forward of the
    FSDP2 root, so the root's all-gather and reduce-scatter run once per call, the same number on every rank, however
    many chunks ``fn`` computes (see ``dapo.distributed.fsdp``)."""
    if is_sharded(model):
        return model(*args, run=fn, **kwargs)
    return fn(model, *args, **kwargs)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a ``DTensor``, the tensor itself otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float, world: World) -> float:
    """Clip the gradients of ``params`` to a total L2 norm of ``max_norm``; return the norm before clipping.

    Replicated parameters: ``torch.nn.utils.clip_grad_norm_`` (every rank holds the whole summed gradient). Sharded
    ones: the squares of the local shards are summed over ranks first, so every rank clips with the norm of the
    whole gradient, as one process would (the same formula: coefficient ``max_norm / (norm + 1e-6)``, at most 1).
    """
    if not any(isinstance(p, DTensor) for p in params):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [local_part(p.grad) for p in params if p.grad is not None]
    # One reduction on the shards' device and one host sync, not one per parameter.
    squares = (
        torch.stack([g.detach().double().pow(2).sum() for g in grads]).sum()
        if grads
        else torch.zeros((), dtype=torch.float64, device=params[0].device)
    )
    total = math.sqrt(float(world.all_reduce_sum(squares)))
    coefficient = min(max_norm / (total + 1e-6), 1.0)
    if math.isfinite(total) and coefficient < 1.0:
        for g in grads:
            g.mul_(coefficient)
    return total


def first_non_finite(model: torch.nn.Module, world: World) -> str | None:
    """The name of the first trainable parameter holding a NaN or inf on any rank, or None; the same on every rank.

    Replicated: one host sync for the whole model. Sharded: each rank checks its shards and the flags are summed, so
    all ranks raise alike (a rank raising alone would leave the others waiting in their next collective).
    """
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(local_part(p)).all() for _, p in named])
    if is_sharded(model):
        bad = world.all_reduce_sum((~finite).to(torch.float32).cpu())
        finite = bad == 0
    if bool(finite.all()):
        return None
    return named[int((~finite).nonzero()[0])][0]


def sum_gradients(model: torch.nn.Module, world: World) -> None:
    """Sum ``.grad`` over ranks for a replicated (unsharded) model; FSDP2 shards are summed by their reduce-scatter
    in backward already, and are skipped.

    A parameter without a gradient on this rank (its share used no such path) contributes zeros.
    """
    if not world.distributed:
        return
    for p in model.parameters():
        if not p.requires_grad or isinstance(p, DTensor):
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
    # Shards differ by design (each rank holds another slice); only replicated parameters must agree.
    named = [(name, p) for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if not named:
        return []
    with torch.no_grad():
        mine = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for _, p in named]).cpu()
    ranks = world.all_gather_objects(mine)
    return [name for i, (name, _) in enumerate(named) if any(not torch.equal(r[i], ranks[0][i]) for r in ranks)]
