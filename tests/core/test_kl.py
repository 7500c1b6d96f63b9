"""KL estimators and entropy."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import entropy_from_logits, kl_penalty

LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [
        # log pi = log 0.5, log ref = log 0.25: log pi - log ref = ln 2.
        ("k1", LN2),
        ("kl", LN2),
        ("abs", LN2),
        ("k2", 0.5 * LN2**2),
        ("mse", 0.5 * LN2**2),
        # k3: x = log ref - log pi = -ln 2: exp(x) - x - 1 = 0.5 + ln 2 - 1.
        ("k3", 0.5 + LN2 - 1.0),
        ("low_var_kl", 0.5 + LN2 - 1.0),
    ],
)
def test_hand_computed_estimators(kl_type: str, expected: float) -> None:
    log_prob = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    assert kl_penalty(log_prob, ref, kl_type).item() == pytest.approx(expected)


def test_k3_is_clamped() -> None:
    # x = -30 -> clamped to -20: exp(-20) + 20 - 1 = 19 -> clamped to 10.  x = +15: exp(15) - 16 -> 10.
    log_prob = torch.tensor([[0.0, -15.0]])
    ref = torch.tensor([[-30.0, 0.0]])
    assert kl_penalty(log_prob, ref, "k3").tolist() == [[10.0, 10.0]]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(-8, 0), st.floats(-8, 0)), min_size=1, max_size=10))
def test_k3_is_nonnegative_and_zero_only_at_equality(pairs: list[tuple[float, float]]) -> None:
    log_prob = torch.tensor([[p for p, _ in pairs]], dtype=torch.float64)
    ref = torch.tensor([[r for _, r in pairs]], dtype=torch.float64)
    k3 = kl_penalty(log_prob, ref, "k3")
    assert (k3 >= 0).all()
    assert torch.equal(kl_penalty(log_prob, log_prob, "k3"), torch.zeros_like(k3))


def test_unknown_kl_type_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="'k4'; allowed: k1, kl"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_entropy_hand_computed() -> None:
    # Uniform over 4 -> ln 4. Logits (0, ln 3) -> probs (1/4, 3/4): -(1/4 ln 1/4 + 3/4 ln 3/4).
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4.0))
    two = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)
    assert entropy_from_logits(two).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # Shifting every logit by 1000 changes nothing (stability).
    assert entropy_from_logits(two + 1000.0).item() == pytest.approx(entropy_from_logits(two).item())


def test_entropy_with_masked_vocabulary_is_finite_in_value_and_gradient() -> None:
    logits = torch.tensor([[0.0, 0.0, float("-inf")]], requires_grad=True)
    h = entropy_from_logits(logits)
    h.sum().backward()
    assert h.item() == pytest.approx(LN2)
    assert torch.isfinite(logits.grad).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 50), st.floats(0.1, 30.0))
def test_entropy_matches_definition_and_bounds(seed: int, vocab: int, scale: float) -> None:
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    probs = torch.softmax(logits, dim=-1)
    reference = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
    h = entropy_from_logits(logits)
    assert h.shape == (3,)
    torch.testing.assert_close(h, reference)
    assert (h >= -1e-12).all() and (h <= math.log(vocab) + 1e-12).all()


def test_k3_tiny_log_ratio_is_not_negative() -> None:
    # Regression: exp(x) - x - 1 rounded to a negative number at x = 3.6e-10.
    k3 = kl_penalty(
        torch.tensor([[-3.636875890972621e-10]], dtype=torch.float64), torch.tensor([[0.0]], dtype=torch.float64), "k3"
    )
    assert k3.item() >= 0.0
