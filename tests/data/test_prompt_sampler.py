"""PromptSampler: epochs of seeded permutations (no repeats within an epoch, a new order each epoch, wrap-around in
the middle of a batch), the unshuffled order, the seed, resume from state_dict giving the identical continuation, and
the empty-input error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.data.prompt_sampler import PromptSampler
from dapo.data.prompts import PromptItem


def _items(n: int) -> list[PromptItem]:
    return [PromptItem(uid, (100 + uid, 7), str(uid), "synth") for uid in range(n)]


def _uids(batch: list[PromptItem]) -> list[int]:
    return [p.uid for p in batch]


def test_one_epoch_is_a_permutation_without_repeats() -> None:
    sampler = PromptSampler(_items(10), seed=3)
    assert len(sampler) == 10
    epoch = _uids(sampler.next_batch(4)) + _uids(sampler.next_batch(4)) + _uids(sampler.next_batch(2))
    assert sorted(epoch) == list(range(10))
    assert epoch != list(range(10))  # shuffled (seed 3 does not give the identity)
    assert sampler.state_dict() == {"epoch": 0, "position": 10}


def test_wrap_around_mid_batch_starts_a_new_epoch_with_a_new_permutation() -> None:
    sampler = PromptSampler(_items(7), seed=0)
    first = _uids(sampler.next_batch(5))
    batch = _uids(sampler.next_batch(5))  # 2 left in epoch 0, then 3 from epoch 1
    assert sampler.state_dict() == {"epoch": 1, "position": 3}
    epoch0 = first + batch[:2]
    assert sorted(epoch0) == list(range(7))
    rest = _uids(sampler.next_batch(4))
    epoch1 = batch[2:] + rest
    assert sorted(epoch1) == list(range(7))
    assert epoch1 != epoch0  # the next epoch is reshuffled
    assert sampler.state_dict() == {"epoch": 1, "position": 7}


def test_a_batch_larger_than_the_data_set_spans_several_epochs() -> None:
    sampler = PromptSampler(_items(3), seed=5)
    batch = _uids(sampler.next_batch(8))
    assert [sorted(batch[0:3]), sorted(batch[3:6])] == [[0, 1, 2], [0, 1, 2]]
    assert len(set(batch[6:8])) == 2
    assert sampler.state_dict() == {"epoch": 2, "position": 2}


def test_epochs_eventually_differ_and_each_is_a_permutation() -> None:
    sampler = PromptSampler(_items(6), seed=11)
    orders = [tuple(_uids(sampler.next_batch(6))) for _ in range(5)]
    assert all(sorted(o) == list(range(6)) for o in orders)
    assert len(set(orders)) > 1


def test_shuffle_false_keeps_the_data_order_every_epoch() -> None:
    sampler = PromptSampler(_items(5), seed=9, shuffle=False)
    assert _uids(sampler.next_batch(3)) == [0, 1, 2]
    assert _uids(sampler.next_batch(4)) == [3, 4, 0, 1]
    assert _uids(sampler.next_batch(5)) == [2, 3, 4, 0, 1]
    assert sampler.state_dict() == {"epoch": 2, "position": 2}


def test_items_are_returned_as_given() -> None:
    items = _items(4)
    sampler = PromptSampler(items, seed=1, shuffle=False)
    assert sampler.next_batch(4) == items
    assert all(a is b for a, b in zip(PromptSampler(items, seed=1, shuffle=False).next_batch(4), items))


def test_same_seed_same_order_other_seed_other_order() -> None:
    def stream(seed: int) -> list[int]:
        sampler = PromptSampler(_items(20), seed=seed)
        return _uids(sampler.next_batch(50))

    assert stream(42) == stream(42)
    assert stream(42) != stream(43)


def test_the_sampler_keeps_its_own_copy_of_the_items() -> None:
    items = _items(3)
    sampler = PromptSampler(items, seed=0, shuffle=False)
    items.clear()
    assert len(sampler) == 3 and _uids(sampler.next_batch(3)) == [0, 1, 2]


def test_next_batch_of_zero_is_empty_and_does_not_move() -> None:
    sampler = PromptSampler(_items(3), seed=0)
    assert sampler.next_batch(0) == []
    assert sampler.state_dict() == {"epoch": 0, "position": 0}


@pytest.mark.parametrize("items", [[], ()])
def test_empty_input_is_an_error(items: list[PromptItem]) -> None:
    with pytest.raises(ValueError, match="no prompts to train on"):
        PromptSampler(items, seed=0)


def test_state_dict_is_plain_ints_and_survives_a_json_round_trip() -> None:
    sampler = PromptSampler(_items(4), seed=2)
    sampler.next_batch(6)
    state = sampler.state_dict()
    assert state == {"epoch": 1, "position": 2} and all(type(v) is int for v in state.values())
    restored = PromptSampler(_items(4), seed=2)
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert _uids(restored.next_batch(5)) == _uids(sampler.next_batch(5))


@settings(max_examples=60, deadline=None)
@given(
    num_items=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    shuffle=st.booleans(),
    before=st.lists(st.integers(1, 15), max_size=5),
    after=st.lists(st.integers(1, 15), min_size=1, max_size=5),
)
def test_property_resume_gives_the_identical_continuation(
    num_items: int, seed: int, shuffle: bool, before: list[int], after: list[int]
) -> None:
    items = _items(num_items)
    original = PromptSampler(items, seed=seed, shuffle=shuffle)
    for size in before:
        original.next_batch(size)
    state = original.state_dict()

    resumed = PromptSampler(items, seed=seed, shuffle=shuffle)
    resumed.next_batch(3)  # whatever a fresh sampler did before loading does not matter
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    for size in after:
        assert _uids(resumed.next_batch(size)) == _uids(original.next_batch(size))
    assert resumed.state_dict() == original.state_dict()


@settings(max_examples=60, deadline=None)
@given(num_items=st.integers(1, 10), seed=st.integers(0, 2**31), sizes=st.lists(st.integers(1, 25), max_size=6))
def test_property_the_stream_is_a_sequence_of_full_epochs(num_items: int, seed: int, sizes: list[int]) -> None:
    sampler = PromptSampler(_items(num_items), seed=seed)
    stream: list[int] = []
    for size in sizes:
        batch = sampler.next_batch(size)
        assert len(batch) == size
        stream += _uids(batch)
    for start in range(0, len(stream), num_items):  # every epoch (the last one possibly partial) has no repeats
        epoch = stream[start : start + num_items]
        assert len(set(epoch)) == len(epoch)
        if len(epoch) == num_items:
            assert sorted(epoch) == list(range(num_items))
    total = sum(sizes)
    if total:
        assert sampler.state_dict() == {"epoch": (total - 1) // num_items, "position": (total - 1) % num_items + 1}
