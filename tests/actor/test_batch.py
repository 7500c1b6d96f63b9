"""TrainBatch: validation, selection, group-preserving mini-batch cuts, loss mask and padding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actor_helpers import random_batch
from dapo.actor.batch import TrainBatch, pad_per_token


def _batch(**overrides: object) -> TrainBatch:
    fields: dict[str, object] = dict(
        prompt_ids=[[1, 2], [3]],
        response_ids=[[4, 5, 6], [7]],
        advantages=torch.tensor([1.0, -1.0]),
        sample_mask=torch.tensor([True, False]),
        group_index=torch.tensor([0, 0]),
    )
    fields.update(overrides)
    return TrainBatch(**fields)  # type: ignore[arg-type]


def test_lists_of_ints_become_long_tensors_and_lengths_are_reported() -> None:
    batch = _batch()
    assert all(t.dtype == torch.long for t in batch.prompt_ids + batch.response_ids)
    assert batch.prompt_lengths == [2, 1]
    assert batch.response_lengths == [3, 1]
    assert batch.sequence_lengths == [5, 2]
    assert len(batch) == 2 and batch.num_groups == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(response_ids=[[4]]), "2 prompts but 1 responses"),
        (dict(response_ids=[[4], []]), r"response_ids\[1\] is empty"),
        (dict(prompt_ids=[[1], [0.5]]), r"prompt_ids\[1\] must hold integer token ids"),
        (dict(advantages=torch.tensor([1.0])), r"advantages must be a tensor of shape \(2,\)"),
        (dict(advantages=torch.tensor([1.0, float("nan")])), r"non-finite values at samples \[1\]"),
        (dict(advantages=torch.tensor([1, 2])), "must be floating point"),
        (dict(sample_mask=torch.tensor([1, 0])), "sample_mask must be bool"),
        (dict(group_index=torch.tensor([0.0, 0.0])), "group_index must be long"),
        (dict(old_log_probs=[torch.zeros(3)]), "old_log_probs has 1 entries for 2 samples"),
        (
            dict(ref_log_probs=[torch.zeros(3), torch.zeros(2)]),
            r"ref_log_probs\[1\] must be a float tensor of shape \(1,\)",
        ),
    ],
)
def test_bad_input_is_rejected_with_a_message_naming_the_field(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _batch(**overrides)


def test_groups_must_be_contiguous() -> None:
    with pytest.raises(ValueError, match="must be contiguous"):
        random_batch(2, 2).select([0, 2, 1, 3])


def test_select_keeps_every_field_aligned() -> None:
    batch = random_batch(3, 2, seed=1)
    batch = batch.with_old_log_probs([torch.full((n,), float(i)) for i, n in enumerate(batch.response_lengths)])
    picked = batch.select([4, 5, 0])
    assert picked.group_index.tolist() == [2, 2, 0]
    for out_row, src in enumerate([4, 5, 0]):
        assert torch.equal(picked.prompt_ids[out_row], batch.prompt_ids[src])
        assert torch.equal(picked.response_ids[out_row], batch.response_ids[src])
        assert picked.advantages[out_row] == batch.advantages[src]
        assert picked.old_log_probs is not None and float(picked.old_log_probs[out_row][0]) == float(src)
    with pytest.raises(IndexError, match="index 6 out of range for 6 samples"):
        batch.select([6])


def test_loss_mask_by_hand() -> None:
    mask = _batch(sample_mask=torch.tensor([True, True])).loss_mask()
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert _batch().loss_mask().tolist() == [[True, True, True], [False, False, False]]


def test_pad_per_token() -> None:
    out = pad_per_token([torch.tensor([1.0, 2.0]), torch.tensor([3.0])], width=3, pad_value=-1.0)
    assert out.tolist() == [[1.0, 2.0, -1.0], [3.0, -1.0, -1.0]]
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_per_token([torch.zeros(4)], width=2)


@settings(max_examples=40, deadline=None)
@given(
    group_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=9),
    per_mini=st.integers(1, 5),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_mini_batches_hold_whole_groups_and_cover_the_batch_once(
    group_sizes: list[int], per_mini: int, shuffle: bool, seed: int
) -> None:
    n = sum(group_sizes)
    group_index = torch.repeat_interleave(torch.arange(len(group_sizes)) * 7, torch.tensor(group_sizes))
    batch = TrainBatch(
        prompt_ids=[[i % 5] for i in range(n)],
        response_ids=[[i] for i in range(n)],  # response token = original position, to track samples
        advantages=torch.zeros(n),
        sample_mask=torch.ones(n, dtype=torch.bool),
        group_index=group_index,
    )
    minis = batch.split_into_mini_batches(per_mini, shuffle=shuffle, generator=torch.Generator().manual_seed(seed))
    expected_count = -(-len(group_sizes) // per_mini)
    assert len(minis) == expected_count
    seen = sorted(int(r[0]) for m in minis for r in m.response_ids)
    assert seen == list(range(n))
    for i, mini in enumerate(minis):
        is_last = i == expected_count - 1
        assert mini.num_groups == (len(group_sizes) - per_mini * (expected_count - 1) if is_last else per_mini)
        for gid in torch.unique(mini.group_index).tolist():
            assert int((mini.group_index == gid).sum()) == int((group_index == gid).sum())  # never split
