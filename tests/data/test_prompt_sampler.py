"""PromptSampler: epochs of seeded permutations (no repeats within an epoch, a new order each epoch, wrap-around in
the middle of a batch), the unshuffled order, the seed, resume from state_dict giving the identical continuation, and
the empty-input error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core.dynamic_sampling import solved_in_recent_epochs
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


# ------------------------------------------------------------------------- the pass-rate record and solved skipping
def test_solved_in_recent_epochs_by_hand() -> None:
    assert not solved_in_recent_epochs([], 1)  # never seen: never solved
    assert solved_in_recent_epochs([(0, 1.0)], 1)
    assert not solved_in_recent_epochs([(0, 0.75)], 1)
    assert not solved_in_recent_epochs([(0, 1.0)], 2)  # seen in one epoch only
    assert solved_in_recent_epochs([(0, 0.5), (2, 1.0), (5, 1.0)], 2)  # epochs not seen in do not count
    assert not solved_in_recent_epochs([(0, 1.0), (2, 0.5), (5, 1.0)], 2)
    assert not solved_in_recent_epochs([(3, 1.0), (3, 0.5)], 1)  # twice in one epoch: solved only if both times were
    assert solved_in_recent_epochs([(1, 0.0), (3, 1.0), (3, 1.0)], 1)
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        solved_in_recent_epochs([(0, 1.0)], 0)


def _pass(sampler: PromptSampler, draws, solved: set[int]) -> None:
    """Score a round: prompts whose uid is in ``solved`` got every sample right, the others half."""
    sampler.record_pass_rates(draws, [1.0 if d.item.uid in solved else 0.5 for d in draws])


def test_record_and_skipping_by_hand() -> None:
    sampler = PromptSampler(_items(6), seed=0, shuffle=False, skip_solved_epochs=1)
    first = sampler.next_draws(6)
    assert [(d.index, d.epoch) for d in first] == [(i, 0) for i in range(6)]
    _pass(sampler, first, solved={1, 4})
    assert sampler.record.history(1) == [(0, 1.0)] and sampler.record.history(2) == [(0, 0.5)]
    # Epoch 1 (4 unsolved >= a batch of 3) skips 1, solved in its last epoch.
    second = sampler.next_draws(3)
    assert [(d.index, d.epoch) for d in second] == [(0, 1), (2, 1), (3, 1)]
    assert sampler.num_skipped_solved == 1
    _pass(sampler, second, solved={0})
    assert sampler.record.history(0) == [(0, 0.5), (1, 1.0)]
    # 4 skipped (epoch 0), 5 drawn; epoch 2 has 0, 1, 4 solved (3 unsolved: enough) and skips 0 and 1.
    third = sampler.next_draws(3)
    assert [(d.index, d.epoch) for d in third] == [(5, 1), (2, 2), (3, 2)]
    assert sampler.num_skipped_solved == 4 and sampler.state_dict()["fallback"] is False
    _pass(sampler, third, solved={2})
    # 4 skipped again; epoch 3 starts with 2 unsolved (3, 5) < 3 needed: the fallback draws every prompt of it.
    fourth = sampler.next_draws(3)
    assert [(d.index, d.epoch) for d in fourth] == [(5, 2), (0, 3), (1, 3)]
    assert sampler.num_skipped_solved == 5 and sampler.state_dict()["fallback"] is True


def test_k_epochs_must_all_be_solved() -> None:
    sampler = PromptSampler(_items(3), seed=0, shuffle=False, skip_solved_epochs=2)
    for _ in range(2):
        draws = sampler.next_draws(3)
        _pass(sampler, draws, solved={0})
    # prompt 0 was solved in epochs 0 and 1: skipped from epoch 2 on; prompt 1 solved only once more is not yet.
    assert _uids(sampler.next_batch(2)) == [1, 2]
    assert sampler.num_skipped_solved == 1


def test_an_epoch_with_fewer_unsolved_prompts_than_a_batch_skips_nothing() -> None:
    sampler = PromptSampler(_items(4), seed=0, shuffle=False, skip_solved_epochs=1)
    _pass(sampler, sampler.next_draws(4), solved={0, 1, 2})
    # Epoch 1 has 1 unsolved prompt but a batch of 2 is asked: the fallback samples every prompt of that epoch.
    assert _uids(sampler.next_batch(2)) == [0, 1]
    assert sampler.num_skipped_solved == 0 and sampler.state_dict()["fallback"] is True
    assert _uids(sampler.next_batch(2)) == [2, 3]  # the rest of that epoch too, solved or not
    # Every prompt solved: never a hang, the batch is filled from the whole epoch.
    all_solved = PromptSampler(_items(3), seed=0, shuffle=False, skip_solved_epochs=1)
    _pass(all_solved, all_solved.next_draws(3), solved={0, 1, 2})
    assert _uids(all_solved.next_batch(5)) == [0, 1, 2, 0, 1]


def test_without_the_record_nothing_is_recorded_or_skipped() -> None:
    sampler = PromptSampler(_items(3), seed=0, shuffle=False)
    draws = sampler.next_draws(3)
    sampler.record_pass_rates(draws, [1.0, 1.0, 1.0])
    assert sampler.record is None and _uids(sampler.next_batch(3)) == [0, 1, 2]
    assert sampler.state_dict() == {"epoch": 1, "position": 3}  # the state of a run without the record is unchanged
    with pytest.raises(ValueError, match="3 draws but 2 pass rates"):
        sampler.record_pass_rates(draws, [1.0, 1.0])
    with pytest.raises(ValueError, match="skip_solved_epochs"):
        PromptSampler(_items(3), seed=0, skip_solved_epochs=0)


def test_from_config_follows_skip_solved_prompts() -> None:
    from dapo.config import build_config

    assert PromptSampler.from_config(_items(2), build_config()).record is None
    on = build_config(
        overrides=[
            "algorithm.filter_groups.skip_solved_prompts.enable=true",
            "algorithm.filter_groups.skip_solved_prompts.epochs=3",
        ]
    )
    assert PromptSampler.from_config(_items(2), on).record is not None


def test_record_state_survives_json_and_resumes_identically() -> None:
    sampler = PromptSampler(_items(5), seed=4, skip_solved_epochs=1)
    for solved in ({0, 3}, {1}, {2, 4}):
        _pass(sampler, sampler.next_draws(4), solved)
    state = json.loads(json.dumps(sampler.state_dict()))
    restored = PromptSampler(_items(5), seed=4, skip_solved_epochs=1)
    restored.load_state_dict(state)
    assert restored.state_dict() == sampler.state_dict()
    for solved in ({0}, {3, 4}):
        a, b = sampler.next_draws(3), restored.next_draws(3)
        assert a == b
        _pass(sampler, a, solved)
        _pass(restored, b, solved)
    assert restored.state_dict() == sampler.state_dict()
    # A checkpoint of a run without the record starts an empty one; a record of another data set does not fit.
    fresh = PromptSampler(_items(5), seed=4, skip_solved_epochs=1)
    fresh.load_state_dict({"epoch": 1, "position": 2})
    assert fresh.num_skipped_solved == 0 and fresh.record.history(0) == []
    with pytest.raises(ValueError, match="records 5 prompts, this run has 4"):
        PromptSampler(_items(4), seed=4, skip_solved_epochs=1).load_state_dict(state)


@settings(max_examples=80, deadline=None)
@given(
    num_items=st.integers(1, 10),
    seed=st.integers(0, 2**31),
    epochs=st.integers(1, 3),
    rounds=st.lists(st.tuples(st.integers(1, 12), st.sets(st.integers(0, 9))), min_size=1, max_size=12),
)
def test_property_never_yields_a_skipped_prompt_and_always_fills_the_batch(
    num_items: int, seed: int, epochs: int, rounds: list[tuple[int, set[int]]]
) -> None:
    """Random rounds (batch size, which prompts come out all-correct): every batch is full; a prompt that counts as
    solved is drawn only in a fallback epoch (one that started with fewer unsolved prompts than the batch being drawn),
    so with enough unsolved prompts none is; within an epoch no prompt repeats."""
    sampler = PromptSampler(_items(num_items), seed=seed, skip_solved_epochs=epochs)
    seen_in_epoch: dict[int, set[int]] = {}
    for size, solved in rounds:
        solved_now = {i for i in range(num_items) if sampler.is_solved(i)}  # fixed while a batch is drawn
        epoch_before, fallback_before = sampler.epoch, sampler.state_dict()["fallback"]
        skipped_before = sampler.num_skipped_solved
        draws = sampler.next_draws(size)
        assert len(draws) == size
        new_epochs_fall_back = num_items - len(solved_now) < size
        for d in draws:
            assert d.item.uid == d.index and d.index not in seen_in_epoch.setdefault(d.epoch, set())
            seen_in_epoch[d.epoch].add(d.index)
            if d.index in solved_now:
                assert fallback_before if d.epoch == epoch_before else new_epochs_fall_back, (d, solved_now, size)
        if not fallback_before and not new_epochs_fall_back:
            assert not {d.index for d in draws} & solved_now
        assert sampler.num_skipped_solved >= skipped_before
        _pass(sampler, draws, solved)
