"""The dynamic-sampling buffer (Algorithm 1, lines 3-9): filling across rounds, surplus, exhaustion, checkpoints."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.training.dynamic_sampling_buffer import DynamicSamplingBuffer, DynamicSamplingExhausted


def test_buffer_fills_trims_and_discards_surplus() -> None:
    acc = DynamicSamplingBuffer[str](target_num_groups=3, max_num_gen_batches=4)
    assert acc.should_generate_more()
    acc.add_round(["a"], num_groups_generated=4, num_all_correct=2, num_all_wrong=1, wasted_tokens=300)
    assert not acc.is_full and acc.should_generate_more()
    acc.add_round(["b", "c", "d"], num_groups_generated=4, num_all_correct=0, num_all_wrong=1, wasted_tokens=50)
    assert acc.is_full and not acc.should_generate_more()
    batch, report = acc.pop_batch()
    assert batch == ["a", "b", "c"]
    assert report.num_gen_batches == 2
    assert report.num_groups_generated == 8
    assert report.num_groups_kept == 4
    assert report.kept_group_ratio == pytest.approx(0.5)
    assert report.wasted_tokens == 350
    assert (report.num_all_correct, report.num_all_wrong) == (2, 2)
    assert not report.partial
    assert (report.num_groups_returned, report.num_groups_surplus, report.num_groups_carried_in) == (3, 1, 0)
    assert acc.num_groups == 0 and acc.should_generate_more()  # next step starts empty


def test_buffer_carries_surplus_and_checkpoints_it() -> None:
    acc = DynamicSamplingBuffer[str](target_num_groups=2, max_num_gen_batches=0, carry_over_surplus=True)
    acc.add_round(["a", "b", "c", "d", "e"], num_groups_generated=5, num_all_correct=0, num_all_wrong=0)
    assert acc.pop_batch()[0] == ["a", "b"]
    assert acc.num_groups == 3 and acc.is_full and not acc.should_generate_more()

    state = acc.state_dict(to_state=str.upper)
    assert state["groups"] == ["C", "D", "E"]
    restored = DynamicSamplingBuffer[str](target_num_groups=2, max_num_gen_batches=0, carry_over_surplus=True)
    restored.load_state_dict(state, from_state=str.lower)
    batch, report = restored.pop_batch()
    assert batch == ["c", "d"]
    assert report.num_gen_batches == 0 and report.num_groups_carried_in == 3 and report.num_groups_surplus == 1
    with pytest.raises(KeyError, match=r"missing keys .*groups"):
        restored.load_state_dict({})


def test_discarded_surplus_tokens_count_as_wasted_carried_ones_do_not() -> None:
    # Groups are strings whose length is their token count; the filter dropped 100 tokens in the round.
    for carry, discarded_tokens in ((False, len("dddd") + len("ee")), (True, 0)):
        acc = DynamicSamplingBuffer[str](target_num_groups=2, max_num_gen_batches=1, carry_over_surplus=carry)
        acc.add_round(
            ["a", "bb", "dddd", "ee"], num_groups_generated=5, num_all_correct=1, num_all_wrong=0, wasted_tokens=100
        )
        batch, report = acc.pop_batch(tokens_of=len)
        assert batch == ["a", "bb"] and report.num_groups_surplus == 2
        assert report.num_groups_discarded == (0 if carry else 2)
        assert report.discarded_tokens == discarded_tokens
        assert report.wasted_tokens == 100 + discarded_tokens
        assert acc.num_groups == (2 if carry else 0)
    # Without tokens_of the discarded groups are counted, their tokens not (the caller did not say how).
    acc = DynamicSamplingBuffer[str](target_num_groups=1, max_num_gen_batches=1)
    acc.add_round(["a", "bb"], num_groups_generated=2, num_all_correct=0, num_all_wrong=0)
    report = acc.pop_batch()[1]
    assert (report.num_groups_discarded, report.discarded_tokens, report.wasted_tokens) == (1, 0, 0)


def test_exhausted_raises_with_the_counts_and_advice() -> None:
    acc = DynamicSamplingBuffer[int](target_num_groups=4, max_num_gen_batches=2)
    acc.add_round([1], num_groups_generated=6, num_all_correct=5, num_all_wrong=0, wasted_tokens=10)
    acc.add_round([], num_groups_generated=6, num_all_correct=4, num_all_wrong=2, wasted_tokens=10)
    assert not acc.should_generate_more()
    with pytest.raises(DynamicSamplingExhausted) as info:
        acc.pop_batch()
    message = str(info.value)
    for fragment in (
        "2 generation round(s)",
        "max_num_gen_batches=2",
        "12 groups",
        "9 all-correct",
        "2 all-wrong",
        "1 kept",
        "1 of the 4",
        "harder",
        "on_exhausted='train_on_partial'",
    ):
        assert fragment in message
    assert isinstance(info.value, RuntimeError)
    assert info.value.report.partial and info.value.report.num_all_correct == 9


def test_without_filtering_uniform_groups_are_kept_and_counted() -> None:
    # filter_groups off: all 4 groups kept although 1 was all-correct and 1 all-wrong.
    acc = DynamicSamplingBuffer[int](target_num_groups=4, max_num_gen_batches=1, on_exhausted="train_on_partial")
    acc.add_round([1, 2, 3, 4], num_groups_generated=4, num_all_correct=1, num_all_wrong=1)
    batch, report = acc.pop_batch()
    assert batch == [1, 2, 3, 4] and not report.partial
    assert (report.num_all_correct, report.num_all_wrong, report.kept_group_ratio) == (1, 1, 1.0)


def test_train_on_partial_returns_what_it_has_and_says_so() -> None:
    acc = DynamicSamplingBuffer[int](target_num_groups=4, max_num_gen_batches=1, on_exhausted="train_on_partial")
    acc.add_round([7, 8], num_groups_generated=3, num_all_correct=0, num_all_wrong=1)
    batch, report = acc.pop_batch()
    assert batch == [7, 8] and report.partial and report.num_groups_returned == 2


def test_misuse_is_reported() -> None:
    with pytest.raises(ValueError, match="target_num_groups"):
        DynamicSamplingBuffer[int](target_num_groups=0, max_num_gen_batches=1)
    with pytest.raises(ValueError, match="on_exhausted"):
        DynamicSamplingBuffer[int](target_num_groups=1, max_num_gen_batches=1, on_exhausted="skip")  # type: ignore[arg-type]
    acc = DynamicSamplingBuffer[int](target_num_groups=2, max_num_gen_batches=3)
    with pytest.raises(ValueError, match=r"len\(groups_kept\)=2, .*num_groups_generated=1"):
        acc.add_round([1, 2], num_groups_generated=1, num_all_correct=0, num_all_wrong=0)
    with pytest.raises(ValueError, match="num_all_correct=2, num_all_wrong=2"):
        acc.add_round([1], num_groups_generated=3, num_all_correct=2, num_all_wrong=2)
    with pytest.raises(ValueError, match="wasted_tokens"):
        acc.add_round([1], num_groups_generated=1, num_all_correct=0, num_all_wrong=0, wasted_tokens=-1)
    with pytest.raises(RuntimeError, match="should_generate_more"):
        acc.pop_batch()
    acc.add_round([1, 2], num_groups_generated=2, num_all_correct=0, num_all_wrong=0)
    with pytest.raises(RuntimeError, match="call pop_batch"):
        acc.add_round([3], num_groups_generated=1, num_all_correct=0, num_all_wrong=0)


rounds = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(0, 4)), min_size=0, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(-1, 5),
    st.sampled_from(["error", "train_on_partial"]),
    st.booleans(),
    rounds,
)
def test_buffer_never_splits_loses_or_silently_shortens(
    target: int, max_rounds: int, on_exhausted: str, carry: bool, round_sizes: list[tuple[int, int, int]]
) -> None:
    """Drive several training steps from a random sequence of rounds; each group is a list of sample ids."""
    acc = DynamicSamplingBuffer[list[int]](target, max_rounds, on_exhausted, carry)  # type: ignore[arg-type]
    next_id = 0
    handed_out: list[int] = []
    made: dict[int, list[int]] = {}
    feed = iter(round_sizes)
    for _ in range(len(round_sizes) + 2):  # steps
        rounds_this_step = 0
        while acc.should_generate_more():
            kept, all_correct, all_wrong = next(feed, (None, 0, 0))
            if kept is None:
                return  # ran out of scripted rounds mid-step
            groups = []
            for _ in range(kept):
                group = [next_id * 10 + k for k in range(3)]
                made[id(group)] = list(group)
                groups.append(group)
                next_id += 1
            acc.add_round(
                groups,
                num_groups_generated=kept + all_correct + all_wrong,
                num_all_correct=all_correct,
                num_all_wrong=all_wrong,
            )
            rounds_this_step += 1
            assert max_rounds <= 0 or rounds_this_step <= max_rounds  # bounded when a budget is set
        try:
            batch, report = acc.pop_batch()
        except DynamicSamplingExhausted as exc:
            assert on_exhausted == "error" and 0 < max_rounds == rounds_this_step
            assert f"{exc.report.num_all_correct} all-correct" in str(exc)
            return
        assert report.num_groups_returned == len(batch)
        if report.partial:
            assert on_exhausted == "train_on_partial" and len(batch) < target
        else:
            assert len(batch) == target
        for group in batch:
            assert group == made[id(group)]  # the very object added, intact: never split or rebuilt
            handed_out.extend(group)
        assert len(handed_out) == len(set(handed_out))  # no group handed out twice
