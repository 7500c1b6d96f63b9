"""Cutting a mini-batch into micro-batches: pure functions from sample lengths to lists of sample indices.

A micro-batch is what fits in one forward/backward pass. What it costs depends on the layout (``dapo.actor.log_probs``):
packed padding-free into one row, it costs the sum of its samples' lengths; padded to its longest sample, it costs
(samples x longest). Two policies, each with a plan per layout:

* token budget ("dynamic batch size", verl's ``use_dynamic_bsz``): each micro-batch costs at most ``max_tokens``;
  packed, the number of micro-batches is kept small with balanced loads (:func:`pack_by_token_budget`); padded, the
  samples are cut longest-first into runs of similar length, so little of the budget is padding
  (:func:`split_sorted_by_length`);
* fixed size: ``micro_batch_size`` samples per micro-batch, consecutive when packed, of similar length when padded
  (:func:`split_fixed_size`).

The shared-prompt layout runs each distinct prompt of a micro-batch once and the responses after it, so a micro-batch
costs (distinct prompts x longest prompt) + its length-sorted response chunks; :func:`split_by_shared_prompt` keeps the
samples of a group together, so their prompt is paid for once.

Which samples share a micro-batch does not change the gradient: the loss aggregation normalises by the mini-batch's
global token / sequence counts, so the micro-batch losses add up to the mini-batch loss exactly.
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MicroBatchPlan",
    "CHUNK_MIN_SHARE",
    "pack_by_token_budget",
    "padding_micro_batches",
    "plan_micro_batches",
    "response_chunks",
    "shared_prompt_cost",
    "split_by_shared_prompt",
    "split_fixed_size",
    "split_sorted_by_length",
    "warn_oversized",
]


@dataclass(frozen=True)
class MicroBatchPlan:
    """Micro-batches as lists of sample indices (each sample exactly once), plus how many samples were over budget."""

    micro_batches: list[list[int]]
    num_oversized: int = 0


def _check_lengths(lengths: Sequence[int]) -> list[int]:
    out = [int(n) for n in lengths]
    for i, n in enumerate(out):
        if n < 0:
            raise ValueError(f"sample {i} has negative length {n}")
    return out


def _longest_first(sizes: list[int]) -> list[int]:
    """Sample indices by decreasing length, ties by index: the one order every plan here deals samples in."""
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))


def _first_fit_decreasing(order: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def _longest_first_balanced(order: list[int], lengths: list[int], num_bins: int) -> tuple[list[list[int]], int]:
    """Longest-processing-time-first: each sample (longest first) goes to the currently lightest micro-batch."""
    heap = [(0, b) for b in range(num_bins)]
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in order:
        load, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (load + lengths[i], b))
    return bins, max(load for load, _ in heap)


def pack_by_token_budget(lengths: Sequence[int], max_tokens: int) -> MicroBatchPlan:
    """Pack samples into as few micro-batches as first-fit-decreasing finds, with balanced token loads.

    1. A sample longer than ``max_tokens`` cannot share a pass; it gets a micro-batch of its own and is counted in
       ``num_oversized`` (the caller warns once per update with :func:`warn_oversized`, not once per mini-batch).
    2. First-fit-decreasing (at most 11/9 OPT + 1 bins) gives the number of micro-batches k.
    3. The same samples are re-dealt longest-first to the lightest of k micro-batches, which evens out the loads
       (balanced passes waste less time on the longest one); if that overflows the budget, the FFD packing is kept.

    Indices inside a micro-batch are ascending, and micro-batches are ordered by their first index, so the plan is
    deterministic.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens (ppo_max_token_len_per_gpu) must be >= 1, got {max_tokens}")
    sizes = _check_lengths(lengths)
    oversized = [i for i, n in enumerate(sizes) if n > max_tokens]
    fitting = [i for i in _longest_first(sizes) if sizes[i] <= max_tokens]
    bins: list[list[int]] = []
    if fitting:
        bins = _first_fit_decreasing(fitting, sizes, max_tokens)
        balanced, heaviest = _longest_first_balanced(fitting, sizes, len(bins))
        if heaviest <= max_tokens:
            bins = balanced
    micro_batches = [sorted(b) for b in bins] + [[i] for i in oversized]
    micro_batches.sort(key=lambda b: b[0])
    return MicroBatchPlan(micro_batches=micro_batches, num_oversized=len(oversized))


def split_sorted_by_length(lengths: Sequence[int], max_tokens: int) -> MicroBatchPlan:
    """Micro-batches for the padded layout: each costs (samples x its longest sample) <= ``max_tokens``.

    Samples are taken longest first (ties by index); a micro-batch starts with the longest sample left and takes the
    next ones while the padded cost stays within the budget, so the samples of a micro-batch have similar lengths and
    little compute goes to padding. A sample longer than ``max_tokens`` runs alone and is counted in
    ``num_oversized``. Indices are ascending inside a micro-batch and micro-batches are ordered by their first index.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens (ppo_max_token_len_per_gpu) must be >= 1, got {max_tokens}")
    sizes = _check_lengths(lengths)
    order = _longest_first(sizes)
    micro_batches: list[list[int]] = []
    oversized = 0
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * sizes[current[0]] > max_tokens:
            micro_batches.append(current)
            current = []
        current.append(i)
        oversized += int(sizes[i] > max_tokens)
    if current:
        micro_batches.append(current)
    micro_batches = [sorted(b) for b in micro_batches]
    micro_batches.sort(key=lambda b: b[0])
    return MicroBatchPlan(micro_batches=micro_batches, num_oversized=oversized)


# A response chunk takes the next-longest response while it is at least this share of the chunk's longest: at most
# a quarter of a row is padding, and responses of lengths 1..L fall into O(log L) chunks (passes).
CHUNK_MIN_SHARE = 0.75


def response_chunks(fed_lengths: Sequence[int], max_tokens: int | None = None) -> list[list[int]]:
    """The response passes of a shared-prompt micro-batch: indices with ``fed_lengths`` (response length - 1, the
    tokens fed after the prompt) > 0, longest first (ties by index), cut where a length drops below
    ``CHUNK_MIN_SHARE`` of its chunk's longest, and where the chunk would exceed ``max_tokens`` (rows x longest; a
    single longer row still gets a chunk). Capping never raises the padded cost: a piece is at most as wide as the
    chunk it came from."""
    order = sorted((i for i, n in enumerate(fed_lengths) if n > 0), key=lambda i: (-fed_lengths[i], i))
    chunks: list[list[int]] = []
    for i in order:
        if (
            chunks
            and fed_lengths[i] >= CHUNK_MIN_SHARE * fed_lengths[chunks[-1][0]]
            and (max_tokens is None or (len(chunks[-1]) + 1) * fed_lengths[chunks[-1][0]] <= max_tokens)
        ):
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def shared_prompt_cost(
    prompt_lengths: Sequence[int], response_lengths: Sequence[int], prompt_keys: Sequence[int], indices: Sequence[int]
) -> int:
    """Tokens a shared-prompt micro-batch of ``indices`` runs through the model: its distinct prompts, left-padded to
    the longest, then its response chunks (:func:`response_chunks`), each padded to its longest."""
    if not indices:
        return 0
    distinct = len({prompt_keys[i] for i in indices})
    fed = [response_lengths[i] - 1 for i in indices]
    return distinct * max(prompt_lengths[i] for i in indices) + sum(
        len(chunk) * fed[chunk[0]] for chunk in response_chunks(fed)
    )


def split_by_shared_prompt(
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[int],
    prompt_keys: Sequence[int],
    *,
    max_tokens: int | None = None,
    micro_batch_size: int | None = None,
) -> MicroBatchPlan:
    """Micro-batches for the shared-prompt layout, bounded by :func:`shared_prompt_cost` <= ``max_tokens`` or by
    ``micro_batch_size`` samples (exactly one of the two).

    ``prompt_keys`` says which samples share a prompt (the group index). Groups are dealt by their longest response,
    longest first, and each group's samples longest first, filling a micro-batch until the next sample would break the
    bound: a group is split only when it does not fit, and micro-batches hold responses of similar length. A sample
    that alone exceeds ``max_tokens`` runs alone and is counted in ``num_oversized``. Indices are ascending inside a
    micro-batch and micro-batches are ordered by their first index.
    """
    if (max_tokens is None) == (micro_batch_size is None):
        raise ValueError("split_by_shared_prompt: give exactly one of max_tokens and micro_batch_size")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens (ppo_max_token_len_per_gpu) must be >= 1, got {max_tokens}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size (ppo_micro_batch_size_per_gpu) must be >= 1, got {micro_batch_size}")
    prompts, responses = _check_lengths(prompt_lengths), _check_lengths(response_lengths)
    if not len(prompts) == len(responses) == len(prompt_keys):
        raise ValueError("split_by_shared_prompt: prompt_lengths, response_lengths and prompt_keys differ in length")
    members: dict[int, list[int]] = {}
    for i, key in enumerate(prompt_keys):
        members.setdefault(key, []).append(i)
    groups = [
        sorted(g, key=lambda i: (-responses[i], i))
        for g in sorted(members.values(), key=lambda g: (-max(responses[i] for i in g), g[0]))
    ]

    def fits(indices: list[int]) -> bool:
        if max_tokens is None:
            return len(indices) <= micro_batch_size  # type: ignore[operator]
        return shared_prompt_cost(prompts, responses, prompt_keys, indices) <= max_tokens

    micro_batches: list[list[int]] = []
    current: list[int] = []
    oversized = (
        0
        if max_tokens is None
        else sum(shared_prompt_cost(prompts, responses, prompt_keys, [i]) > max_tokens for i in range(len(prompts)))
    )
    for group in groups:
        if fits([*current, *group]):  # the common case: one cost per group
            current += group
            continue
        for i in group:  # the group does not fit whole: split it where it overflows
            if current and not fits([*current, i]):
                micro_batches.append(current)
                current = []
            current.append(i)
    if current:
        micro_batches.append(current)
    micro_batches = sorted((sorted(b) for b in micro_batches), key=lambda b: b[0])
    return MicroBatchPlan(micro_batches=micro_batches, num_oversized=oversized)


def split_fixed_size(num_samples: int, micro_batch_size: int) -> MicroBatchPlan:
    """Consecutive micro-batches of ``micro_batch_size`` samples (the last one may be smaller)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size (ppo_micro_batch_size_per_gpu) must be >= 1, got {micro_batch_size}")
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    return MicroBatchPlan(
        [list(range(s, min(s + micro_batch_size, num_samples))) for s in range(0, num_samples, micro_batch_size)]
    )


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    use_dynamic_bsz: bool,
    max_token_len: int,
    micro_batch_size: int | None,
    layout: str = "packed",
    prompt_lengths: Sequence[int] | None = None,
    prompt_keys: Sequence[int] | None = None,
) -> MicroBatchPlan:
    """Dispatch on the config: token budget when ``use_dynamic_bsz``, otherwise fixed ``micro_batch_size``; each
    planned for the micro-batch ``layout`` ("packed", "padded" or "shared_prompt"). ``lengths`` are the samples'
    prompt + response lengths; the shared-prompt layout also needs their ``prompt_lengths`` and ``prompt_keys``."""
    if layout not in ("packed", "padded", "shared_prompt"):
        raise ValueError(f"layout must be 'packed', 'padded' or 'shared_prompt', got {layout!r}")
    if not use_dynamic_bsz and micro_batch_size is None:
        raise ValueError("use_dynamic_bsz is False, so ppo_micro_batch_size_per_gpu must be set")
    if layout == "shared_prompt":
        if prompt_lengths is None or prompt_keys is None:
            raise ValueError("plan_micro_batches: the shared_prompt layout needs prompt_lengths and prompt_keys")
        responses = [int(n) - int(p) for n, p in zip(lengths, prompt_lengths, strict=True)]
        return split_by_shared_prompt(
            prompt_lengths,
            responses,
            prompt_keys,
            max_tokens=max_token_len if use_dynamic_bsz else None,
            micro_batch_size=None if use_dynamic_bsz else micro_batch_size,
        )
    if use_dynamic_bsz:
        if layout == "padded":
            return split_sorted_by_length(lengths, max_token_len)
        return pack_by_token_budget(lengths, max_token_len)
    assert micro_batch_size is not None
    if layout == "padded":  # samples of similar length share a micro-batch: less padding, same gradient
        sizes = _check_lengths(lengths)
        order = _longest_first(sizes)
        chunks = split_fixed_size(len(order), micro_batch_size).micro_batches
        micro_batches = sorted((sorted(order[j] for j in chunk) for chunk in chunks), key=lambda b: b[0])
        return MicroBatchPlan(micro_batches)
    return split_fixed_size(len(lengths), micro_batch_size)


def warn_oversized(num_oversized: int, max_tokens: int, where: str) -> None:
    """One ``UserWarning`` saying how many samples exceeded the token budget during ``where``; silent for 0."""
    if num_oversized > 0:
        warnings.warn(
            f"{where}: {num_oversized} sample(s) exceeded the micro-batch token budget "
            f"ppo_max_token_len_per_gpu={max_tokens}; each ran as a micro-batch of its own (more memory than "
            "planned). Set it to at least max_prompt_length + max_response_length.",
            UserWarning,
            stacklevel=3,
        )


def padding_micro_batches(counts: Sequence[int], rank: int) -> int:
    """How many zero-weight micro-batches rank ``rank`` adds so that every rank runs ``max(counts)`` passes.

    ``counts``: every rank's number of micro-batches in one mini-batch. A sharded (FSDP2) actor all-gathers in every
    forward and reduce-scatters in every backward, so the ranks must run equally many; one pass of a rank that has
    nothing left to train is wasted compute, a rank that runs fewer would leave the others waiting forever.
    """
    if not 0 <= rank < len(counts):
        raise ValueError(f"rank {rank} is not one of the {len(counts)} ranks")
    return max(counts) - counts[rank]
