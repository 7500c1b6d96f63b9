"""Dynamic Sampling (Eq. 11): the per-group keep decision and the counts, in one pass."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import filter_informative_groups

# Group 5 all correct, group 2 all wrong, group 9 mixed (kept), group 4 a single correct answer (never kept).
ACC = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 1, 1], dtype=torch.float32)
GROUPS = torch.tensor([5, 5, 5, 2, 2, 2, 9, 9, 9, 4])


def test_hand_computed_decisions_and_counts() -> None:
    result = filter_informative_groups(ACC, GROUPS)
    assert result.group_ids.tolist() == [2, 4, 5, 9]
    assert result.keep.tolist() == [False, False, False, True]
    assert result.keep_sample.tolist() == [False] * 6 + [True] * 3 + [False]
    assert (result.num_groups, result.num_all_correct, result.num_all_wrong, result.num_kept) == (4, 2, 1, 1)
    same = filter_informative_groups(ACC.bool(), GROUPS)
    assert same.keep.tolist() == result.keep.tolist() and same.num_all_correct == 2


def test_shaped_reward_is_rejected() -> None:
    with pytest.raises(ValueError, match="raw 0/1 or bool accuracy"):
        filter_informative_groups(torch.tensor([1.0, -0.5]), torch.tensor([0, 0]))


def test_bad_shapes_and_types_are_rejected() -> None:
    with pytest.raises(ValueError, match="same length"):
        filter_informative_groups(torch.tensor([1.0, 0.0]), torch.tensor([0]))
    with pytest.raises(TypeError, match="integer tensor"):
        filter_informative_groups(torch.tensor([1.0]), torch.tensor([0.5]))


def test_empty_round() -> None:
    result = filter_informative_groups(torch.tensor([]), torch.tensor([], dtype=torch.long))
    assert (result.num_groups, result.num_kept, result.num_all_correct, result.num_all_wrong) == (0, 0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), min_size=1, max_size=30))
def test_decisions_match_per_group_counts(samples: list[tuple[bool, int]]) -> None:
    acc = torch.tensor([a for a, _ in samples])
    group_index = torch.tensor([g * 13 - 20 for _, g in samples])
    result = filter_informative_groups(acc, group_index)
    for position, g in enumerate(result.group_ids.tolist()):
        members = group_index == g
        num_correct, size = int(acc[members].sum()), int(members.sum())
        assert result.keep[position].item() == (0 < num_correct < size)
        assert bool((result.keep_sample[members] == result.keep[position]).all())
    assert result.num_groups == result.num_all_correct + result.num_all_wrong + result.num_kept
    assert result.num_groups == len(set(group_index.tolist()))
