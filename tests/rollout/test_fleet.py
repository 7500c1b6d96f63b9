"""The fleet's dealing and merging (dapo.rollout.fleet): shares tile the call in order with sizes within one of each
other, and merging the engines' outputs gives back the call's output prompt by prompt; the real M-engine run is
tests/distributed/test_async_torchrun.py."""

from __future__ import annotations

import pytest

import torch

from dapo.rollout.base import RolloutOutput
from dapo.rollout.fleet import deal, merge


@pytest.mark.parametrize(("num_prompts", "engines"), [(6, 2), (7, 2), (7, 3), (1, 3), (0, 2), (12, 5)])
def test_shares_tile_the_call_in_order_and_differ_by_at_most_one(num_prompts: int, engines: int) -> None:
    shares = deal(num_prompts, engines)
    assert len(shares) == engines
    assert [i for s in shares for i in range(s.start, s.stop)] == list(range(num_prompts))
    sizes = [s.stop - s.start for s in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # the first engines take the extra


def test_merge_puts_every_sample_back_under_its_prompt_with_its_versions() -> None:
    """Two engines, prompts 0-2 and 3-4, n = 2: each engine numbers its prompts from 0; the merge must shift them."""
    shares = deal(5, 2)

    def output(share: slice) -> RolloutOutput:
        idx = [i for i in range(share.stop - share.start) for _ in range(2)]
        ids = [[100 * (share.start + i) + j] for i, j in zip(idx, [0, 1] * len(idx))]
        return RolloutOutput(
            idx, ids, [[-0.5]] * len(ids), ["stop"] * len(ids), token_versions=[[share.start]] * len(ids)
        )

    merged = merge([output(s) for s in shares], shares)
    assert merged.prompt_index == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert merged.response_ids == [[0], [1], [100], [101], [200], [201], [300], [301], [400], [401]]
    assert merged.token_versions == [[0]] * 6 + [[3]] * 4
    untracked = RolloutOutput([0], [[1]], [[-1.0]], ["length"])
    assert merge([untracked, untracked], [slice(0, 1), slice(1, 2)]).token_versions is None


def test_merge_keeps_each_samples_routes_with_it() -> None:
    """R3: each engine's per-sample routes stay with their samples in the merged order; an engine without routes
    leaves the merge without (the actor routes live rather than replay half a batch)."""

    def output(first_id: int, routed: bool) -> RolloutOutput:
        routes = [torch.full((2, 1, 1), first_id + j, dtype=torch.int16) for j in range(2)] if routed else None
        return RolloutOutput([0, 0], [[first_id], [first_id + 1]], [[-0.5]] * 2, ["stop"] * 2, routed_experts=routes)

    merged = merge([output(10, True), output(20, True)], [slice(0, 1), slice(1, 2)])
    assert [int(r[0, 0, 0]) for r in merged.routed_experts] == [10, 11, 20, 21]
    assert merge([output(10, True), output(20, False)], [slice(0, 1), slice(1, 2)]).routed_experts is None
