"""Clipped policy-gradient loss (Eq. 10, Clip-Higher) with dual clip."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import compute_policy_loss

F64 = torch.float64


def test_hand_computed_clip_higher() -> None:
    # old_log_prob = 0 so ratio = exp(log_prob); eps_low 0.2, eps_high 0.28 -> clip range [0.8, 1.28].
    #  r=1.0, A=+1: max(-1.0, -1.0)  = -1.0   (clip not strictly active)
    #  r=1.5, A=+1: max(-1.5, -1.28) = -1.28  (clipped)
    #  r=0.5, A=-1: max( 0.5,  0.8)  =  0.8   (clipped)
    #  r=1.1, A=-1: max( 1.1,  1.1)  =  1.1
    #  5th token is padding (mask 0) with a huge ratio that must not show anywhere.
    ratios = [1.0, 1.5, 0.5, 1.1, 50.0]
    log_prob = torch.tensor([[math.log(r) for r in ratios]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 5, dtype=F64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = compute_policy_loss(log_prob, old, adv, mask)

    torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.0, -1.28, 0.8, 1.1, 0.0]], dtype=F64))
    assert out.pg_clipfrac.item() == pytest.approx(0.5)
    assert out.pg_clipfrac_lower.item() == 0.0
    assert out.ppo_kl.item() == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 4)
    assert out.ratio_mean.item() == pytest.approx((1.0 + 1.5 + 0.5 + 1.1) / 4)

    out.loss_mat.sum().backward()
    # d(-A r)/d log_prob = -A r where unclipped is active; 0 where clipped or padding.
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, 0.0, 0.0, 1.1, 0.0]], dtype=F64))


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    # c = 3. A=-1, r=5: max(5, 1.28) = 5 -> min(5, 3) = 3 (dual clip active, no gradient).
    #        A=-1, r=2: max(2, 1.28) = 2 < 3 -> 2.   A=+2, r=5: never dual-clipped: max(-10, -2.56) = -2.56.
    log_prob = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0)]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 2.0]], dtype=F64)
    out = compute_policy_loss(log_prob, torch.zeros(1, 3, dtype=F64), adv, torch.ones(1, 3), clip_ratio_c=3.0)
    torch.testing.assert_close(out.loss_mat, torch.tensor([[3.0, 2.0, -2.56]], dtype=F64))
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 3)
    assert out.pg_clipfrac.item() == pytest.approx(1 / 3)  # only the A=+2 token: its clipped term is the max
    out.loss_mat.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 2.0, 0.0]], dtype=F64))


def test_metrics_are_detached_and_zero_without_valid_tokens() -> None:
    log_prob = torch.randn(2, 3, requires_grad=True)
    out = compute_policy_loss(log_prob, torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3))
    for metric in (out.pg_clipfrac, out.pg_clipfrac_lower, out.ppo_kl, out.ratio_mean):
        assert not metric.requires_grad
        assert metric.item() == 0.0
    assert out.loss_mat.requires_grad
    assert torch.equal(out.loss_mat, torch.zeros(2, 3))


def test_output_is_frozen() -> None:
    out = compute_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))
    with pytest.raises(AttributeError):
        out.loss_mat = torch.ones(1, 1)  # type: ignore[misc]


def test_log_ratio_is_clamped_before_exp() -> None:
    out = compute_policy_loss(torch.tensor([[100.0]]), torch.tensor([[0.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert out.ratio_mean.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert torch.isfinite(out.loss_mat).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_ratio_c": 1.0}, "clip_ratio_c .* must be > 1, got 1.0"),
        ({"clip_ratio_c": 0.5}, "clip_ratio_c"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
    ],
)
def test_bad_clip_ratios_are_rejected(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), **kwargs)


def test_shape_mismatch_names_the_tensors() -> None:
    with pytest.raises(ValueError, match=r"advantages=\(1, 3\)"):
        compute_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))


log_ratios = st.floats(-3.0, 3.0, allow_nan=False)
advs = st.floats(-4.0, 4.0, allow_nan=False).filter(lambda a: abs(a) > 1e-3)


@settings(max_examples=120, deadline=None)
@given(log_ratios, advs, st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.floats(1.01, 10.0))
def test_clip_gradient_and_dual_clip_bound(
    log_ratio: float, a: float, eps_low: float, eps_high: float, c: float
) -> None:
    log_prob = torch.tensor([[log_ratio]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[a]], dtype=F64)
    out = compute_policy_loss(
        log_prob,
        torch.zeros(1, 1, dtype=F64),
        adv,
        torch.ones(1, 1),
        clip_ratio_low=eps_low,
        clip_ratio_high=eps_high,
        clip_ratio_c=c,
    )
    out.loss_mat.sum().backward()
    grad = log_prob.grad.item()
    r = math.exp(log_ratio)
    loss = out.loss_mat.item()
    margin = 1e-9
    if a > 0 and r > 1 + eps_high + margin:
        assert grad == 0.0  # positive advantage, ratio above 1 + eps_high: no further push up
    elif a < 0 and r < 1 - eps_low - margin:
        assert grad == 0.0  # negative advantage, ratio below 1 - eps_low: no further push down
    elif a > 0 and r < 1 + eps_high - margin:
        assert grad == pytest.approx(-a * r)  # inside (or below) the range: plain -A*r gradient
    if a < 0:
        assert loss <= c * abs(a) + 1e-9  # dual clip bounds the loss of negative-advantage tokens
    # Without dual clip the loss is the pessimistic max of the two surrogate terms (Eq. 10).
    plain = compute_policy_loss(
        log_prob.detach(),
        torch.zeros(1, 1, dtype=F64),
        adv,
        torch.ones(1, 1),
        clip_ratio_low=eps_low,
        clip_ratio_high=eps_high,
    ).loss_mat.item()
    clipped_r = min(max(r, 1 - eps_low), 1 + eps_high)
    assert plain == pytest.approx(max(-a * r, -a * clipped_r))
