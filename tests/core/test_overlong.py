"""Soft overlong punishment (Eq. 13) and overlong filtering."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import compute_soft_overlong_penalty, overlong_filter_mask


def test_hand_computed_penalty() -> None:
    # L_max = 20, L_cache = 4: free up to 16, then (16 - |y|) / 4, -1 at 20 and beyond.
    lengths = torch.tensor([0, 16, 17, 18, 19, 20, 21, 100])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    got = compute_soft_overlong_penalty(lengths, max_response_length=20, overlong_buffer_len=4)
    torch.testing.assert_close(got, expected)
    assert got.dtype == torch.float32
    halved = compute_soft_overlong_penalty(lengths, max_response_length=20, overlong_buffer_len=4, penalty_factor=0.5)
    torch.testing.assert_close(halved, expected * 0.5)


def test_buffer_as_long_as_the_limit() -> None:
    # L_cache = L_max: every token costs 1 / L_max.
    got = compute_soft_overlong_penalty(torch.tensor([0, 5, 10]), max_response_length=10, overlong_buffer_len=10)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.5, -1.0]))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 4096).flatmap(lambda l_max: st.tuples(st.just(l_max), st.integers(1, l_max))),
    st.floats(0.0, 5.0),
    st.lists(st.integers(0, 5000), min_size=1, max_size=16),
)
def test_penalty_is_zero_then_linear_then_saturated(limits: tuple[int, int], factor: float, lengths: list[int]) -> None:
    l_max, l_cache = limits
    got = compute_soft_overlong_penalty(
        torch.tensor(lengths), max_response_length=l_max, overlong_buffer_len=l_cache, penalty_factor=factor
    )
    for length, value in zip(lengths, got.tolist(), strict=True):
        if length <= l_max - l_cache:
            assert value == 0.0
        elif length <= l_max:
            assert value == pytest.approx(factor * (l_max - l_cache - length) / l_cache, abs=1e-6)
        else:
            assert value == pytest.approx(-factor)
    at_limit = compute_soft_overlong_penalty(
        torch.tensor([l_max]), max_response_length=l_max, overlong_buffer_len=l_cache, penalty_factor=factor
    )
    assert at_limit.item() == pytest.approx(-factor)


@pytest.mark.parametrize(
    ("lengths", "kwargs", "match"),
    [
        (torch.tensor([1]), {"max_response_length": 10, "overlong_buffer_len": 0}, r"0 < overlong_buffer_len"),
        (torch.tensor([1]), {"max_response_length": 10, "overlong_buffer_len": 11}, "overlong_buffer_len=11"),
        (torch.tensor([1]), {"max_response_length": 10, "overlong_buffer_len": 2, "penalty_factor": -1.0}, "penalty"),
        (torch.tensor([1.0]), {"max_response_length": 10, "overlong_buffer_len": 2}, "integer"),
        (torch.tensor([-3]), {"max_response_length": 10, "overlong_buffer_len": 2}, ">= 0"),
    ],
)
def test_bad_input_is_rejected(lengths: torch.Tensor, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_soft_overlong_penalty(lengths, **kwargs)


def test_overlong_filter_keeps_untruncated_samples() -> None:
    truncated = torch.tensor([False, True, False, True])
    assert overlong_filter_mask(truncated).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="bool"):
        overlong_filter_mask(torch.tensor([0, 1]))
