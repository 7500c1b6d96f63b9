"""Truncated importance sampling between the rollout engine and the actor: token- and sequence-level weights on
hand-computed ratios, truncation at C, zero weight on padding, the statistics of the untruncated ratio, argument
errors, detached weights, and properties (weights in [0, C], exactly 1 when the two policies agree)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core.rollout_correction import LOG_RATIO_CLAMP, ROLLOUT_IS_LEVELS, truncated_importance_weights

# Row 0: three valid tokens with ratios pi_old / mu = (1, 3, 0.5), then one padding position.
# Row 1: two valid tokens with ratios (2, 2), then two padding positions.
# mu is a fixed log-prob per token and pi_old = mu + log(ratio), so old - rollout is exactly log(ratio) up to rounding.
RATIOS = torch.tensor([[1.0, 3.0, 0.5, 1.0], [2.0, 2.0, 1.0, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
ROLLOUT = torch.tensor([[-0.5, -1.0, -2.0, -0.1], [-3.0, -0.25, -1.5, -0.7]], dtype=torch.float64)
OLD = ROLLOUT + RATIOS.log()


def _with_garbage_padding(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Padding positions get wildly mismatched log-probs: they must change nothing."""
    pad = ~mask.bool()
    return torch.where(pad, torch.full_like(old, 50.0), old), torch.where(pad, torch.full_like(rollout, -50.0), rollout)


def test_token_level_hand_computed() -> None:
    old, rollout = _with_garbage_padding(OLD, ROLLOUT, MASK)
    out = truncated_importance_weights(old, rollout, MASK, level="token", threshold=2.0)
    # min(ratio, 2) on valid tokens, 0 on padding.
    expected = torch.tensor([[1.0, 2.0, 0.5, 0.0], [2.0, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(out.weights, expected)
    # Statistics of the untruncated ratio over the 5 valid tokens (1, 3, 0.5, 2, 2).
    assert out.mean == pytest.approx(8.5 / 5)
    assert out.max == pytest.approx(3.0)
    assert out.min == pytest.approx(0.5)
    assert out.truncated_fraction == pytest.approx(1 / 5)  # only the 3 exceeds C; a ratio of 2 (== C) is not cut


def test_sequence_level_hand_computed() -> None:
    old, rollout = _with_garbage_padding(OLD, ROLLOUT, MASK)
    out = truncated_importance_weights(old, rollout, MASK, level="sequence", threshold=2.0)
    # Row 0: 1 * 3 * 0.5 = 1.5 on each of its 3 tokens. Row 1: 2 * 2 = 4, truncated to 2, on its 2 tokens.
    expected = torch.tensor([[1.5, 1.5, 1.5, 0.0], [2.0, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(out.weights, expected)
    # Token-weighted statistics of the sequence ratio: (3 * 1.5 + 2 * 4) / 5 = 2.5.
    assert out.mean == pytest.approx(2.5)
    assert out.max == pytest.approx(4.0)
    assert out.min == pytest.approx(1.5)
    assert out.truncated_fraction == pytest.approx(2 / 5)


def test_truncation_threshold_is_the_upper_bound() -> None:
    out = truncated_importance_weights(OLD, ROLLOUT, MASK, level="token", threshold=1.0)
    expected = torch.tensor([[1.0, 1.0, 0.5, 0.0], [1.0, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(out.weights, expected)
    # Ratios 3, 2, 2 exceed 1; the ratio that is exactly 1 does not count as truncated.
    assert out.truncated_fraction == pytest.approx(3 / 5)
    assert out.max == pytest.approx(3.0)  # stats stay those of the untruncated ratio

    loose = truncated_importance_weights(OLD, ROLLOUT, MASK, level="token", threshold=10.0)
    torch.testing.assert_close(loose.weights, (RATIOS * MASK).float())
    assert loose.truncated_fraction == 0.0


def test_padding_gets_weight_zero_whatever_its_log_probs() -> None:
    old, rollout = _with_garbage_padding(OLD, ROLLOUT, MASK)
    for level in ROLLOUT_IS_LEVELS:
        clean = truncated_importance_weights(OLD, ROLLOUT, MASK, level=level)
        dirty = truncated_importance_weights(old, rollout, MASK, level=level)
        assert torch.equal(dirty.weights[~MASK.bool()], torch.zeros(3))
        torch.testing.assert_close(dirty.weights, clean.weights)
        assert (dirty.mean, dirty.max, dirty.min, dirty.truncated_fraction) == pytest.approx(
            (clean.mean, clean.max, clean.min, clean.truncated_fraction)
        )


def test_bool_and_float_masks_agree() -> None:
    for mask in (MASK.bool(), MASK.float()):
        out = truncated_importance_weights(OLD, ROLLOUT, mask, level="token")
        torch.testing.assert_close(out.weights, torch.tensor([[1.0, 2.0, 0.5, 0.0], [2.0, 2.0, 0.0, 0.0]]))


def test_no_valid_token_gives_zero_weights_and_nan_stats() -> None:
    mask = torch.zeros(2, 4, dtype=torch.long)
    out = truncated_importance_weights(OLD, ROLLOUT, mask, level="token")
    assert torch.equal(out.weights, torch.zeros(2, 4))
    assert math.isnan(out.mean) and math.isnan(out.max) and math.isnan(out.min)
    assert out.truncated_fraction == 0.0


def test_huge_log_ratio_is_clamped_not_overflowed() -> None:
    old = torch.tensor([[500.0, 0.0], [-500.0, 0.0]])
    rollout = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    tok = truncated_importance_weights(old, rollout, mask, level="token", threshold=2.0)
    torch.testing.assert_close(tok.weights, torch.tensor([[2.0, 1.0], [math.exp(-LOG_RATIO_CLAMP), 1.0]]))
    assert math.isfinite(tok.max) and tok.max == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-5)
    seq = truncated_importance_weights(old, rollout, mask, level="sequence", threshold=2.0)
    torch.testing.assert_close(seq.weights, torch.tensor([[2.0, 2.0], [math.exp(-LOG_RATIO_CLAMP)] * 2]))
    assert torch.isfinite(seq.weights).all()


def test_weights_are_detached_and_float32() -> None:
    old = OLD.clone().to(torch.bfloat16).requires_grad_(True)
    out = truncated_importance_weights(old, ROLLOUT.to(torch.bfloat16), MASK, level="token")
    assert not out.weights.requires_grad and out.weights.grad_fn is None
    assert out.weights.dtype == torch.float32


@pytest.mark.parametrize("level", ["tokens", "seq", "", None])
def test_unknown_level_is_an_error(level: object) -> None:
    with pytest.raises(ValueError, match="level must be one of"):
        truncated_importance_weights(OLD, ROLLOUT, MASK, level=level)  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [0.0, -1.0, float("nan")])
def test_non_positive_threshold_is_an_error(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold must be > 0"):
        truncated_importance_weights(OLD, ROLLOUT, MASK, level="token", threshold=threshold)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="truncated_importance_weights: tensors must have the same shape"):
        truncated_importance_weights(OLD, ROLLOUT[:, :3], MASK, level="token")
    with pytest.raises(ValueError, match="same shape"):
        truncated_importance_weights(OLD, ROLLOUT, MASK[:1], level="sequence")


@st.composite
def _inputs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 6))
    logp = st.floats(-8.0, 0.0, allow_nan=False)
    old = torch.tensor(draw(st.lists(logp, min_size=b * t, max_size=b * t))).view(b, t)
    rollout = torch.tensor(draw(st.lists(logp, min_size=b * t, max_size=b * t))).view(b, t)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).view(b, t)
    threshold = draw(st.floats(0.01, 10.0))
    return old, rollout, mask, threshold


@settings(max_examples=60, deadline=None)
@given(_inputs(), st.sampled_from(ROLLOUT_IS_LEVELS))
def test_property_weights_in_zero_c_and_zero_on_padding(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float], level: str
) -> None:
    old, rollout, mask, threshold = inputs
    out = truncated_importance_weights(old, rollout, mask, level=level, threshold=threshold)  # type: ignore[arg-type]
    assert out.weights.shape == old.shape
    assert bool((out.weights >= 0).all()) and bool((out.weights <= threshold).all())
    assert bool((out.weights[~mask] == 0).all())
    assert 0.0 <= out.truncated_fraction <= 1.0
    if mask.any():
        assert out.min <= out.mean * (1 + 1e-5) and out.mean <= out.max * (1 + 1e-5)
    if level == "token":
        expected = torch.where(mask, torch.exp(old - rollout).clamp(max=threshold), 0.0)
        torch.testing.assert_close(out.weights, expected)
    else:  # one weight per row, repeated on its valid tokens
        for row in range(old.shape[0]):
            valid = out.weights[row][mask[row]]
            if valid.numel():
                assert bool((valid == valid[0]).all())


@settings(max_examples=40, deadline=None)
@given(_inputs(), st.sampled_from(ROLLOUT_IS_LEVELS))
def test_property_weights_are_one_when_the_policies_agree(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float], level: str
) -> None:
    old, _rollout, mask, threshold = inputs
    threshold = max(threshold, 1.0)  # a weight of 1 is only representable when C >= 1
    out = truncated_importance_weights(
        old,
        old.clone(),
        mask,
        level=level,
        threshold=threshold,  # type: ignore[arg-type]
    )
    assert torch.equal(out.weights, mask.float())
    assert out.truncated_fraction == 0.0
    if mask.any():
        assert out.mean == out.max == out.min == 1.0


# ------------------------------------------------------------ IcePop's band, weight statistics, rejection sampling
from dapo.core.rollout_correction import ROLLOUT_RS_MODES, rejection_mask  # noqa: E402


def test_icepop_band_masks_instead_of_truncating() -> None:
    # Band [0.6, 2.5] on the valid ratios (1, 3, 0.5 | 2, 2): 3 and 0.5 leave it -> weight 0; the others keep theirs.
    old, rollout = _with_garbage_padding(OLD, ROLLOUT, MASK)
    out = truncated_importance_weights(old, rollout, MASK, level="token", threshold=2.5, lower=0.6)
    torch.testing.assert_close(out.weights, torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]]))
    assert out.masked_fraction == pytest.approx(2 / 5)
    # Applied weights (1, 0, 0, 2, 2): mean 1, mean square 9/5 -> ESS 5/9, population std sqrt(9/5 - 1).
    assert out.eff_sample_size == pytest.approx(5 / 9)
    assert out.std == pytest.approx(math.sqrt(0.8))


def test_tis_effective_sample_size_by_hand() -> None:
    # Truncated weights (1, 2, 0.5, 2, 2), mean 1.5: mean of (w / 1.5)^2 = 13.25 / 2.25 / 5 -> ESS = 11.25 / 13.25.
    out = truncated_importance_weights(OLD, ROLLOUT, MASK, level="token", threshold=2.0)
    assert out.eff_sample_size == pytest.approx(11.25 / 13.25)
    assert out.masked_fraction == 0.0


@pytest.mark.parametrize(
    ("mode", "upper", "lower", "keep_row0", "keep_row1"),
    [
        # k1 on the ratio itself, two-sided.
        ("token_k1", 2.5, 0.6, [True, False, False], [True, True]),
        ("seq_sum_k1", 2.0, 0.5, [True] * 3, [False] * 2),  # products 1.5 and 4
        ("seq_mean_k1", 1.9, None, [True] * 3, [False] * 2),  # geometric means 1.5^(1/3) = 1.145 and 2; lower 1/1.9
        # k2 = 0.5 log(r)^2: row 0 (0, 0.6035, 0.2402), row 1 (0.2402, 0.2402).
        ("token_k2", 0.3, None, [True, False, True], [True, True]),
        ("seq_sum_k2", 0.5, None, [False] * 3, [True] * 2),  # sums 0.8437 and 0.4805
        ("seq_max_k2", 0.3, None, [False] * 3, [True] * 2),  # maxima 0.6035 and 0.2402
        # k3 = r - 1 - log r: row 0 (0, 0.9014, 0.1931), row 1 (0.3069, 0.3069).
        ("token_k3", 0.5, None, [True, False, True], [True, True]),
        ("seq_mean_k3", 0.35, None, [False] * 3, [True] * 2),  # means 0.3648 and 0.3069
        ("seq_max_k3", 0.95, None, [True] * 3, [True] * 2),
    ],
)
def test_rejection_modes_by_hand(
    mode: str, upper: float, lower: float | None, keep_row0: list[bool], keep_row1: list[bool]
) -> None:
    old, rollout = _with_garbage_padding(OLD, ROLLOUT, MASK)
    out = rejection_mask(old, rollout, MASK, mode=mode, upper=upper, lower=lower)
    want = torch.tensor([keep_row0 + [False], keep_row1 + [False, False]])
    assert torch.equal(out.keep, want)
    assert out.masked_fraction == pytest.approx((5 - int(want.sum())) / 5)
    seqs_hit = int(not all(keep_row0)) + int(not all(keep_row1))
    assert out.seq_masked_fraction == pytest.approx(seqs_hit / 2)
    assert torch.equal(out.keep_sequence, torch.tensor([all(keep_row0), all(keep_row1)]))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ROLLOUT_RS_MODES), st.integers(0, 1000))
def test_rejection_keeps_everything_when_the_policies_agree(mode: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(3, 5, generator=g, dtype=torch.float64) - 1.0
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    out = rejection_mask(lp, lp, mask, mode=mode, upper=1e-3 if not mode.endswith("k1") else 1.001)
    assert torch.equal(out.keep, mask.bool()) and out.masked_fraction == 0.0


def test_rejection_argument_errors() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        rejection_mask(OLD, ROLLOUT, MASK, mode="seq_max_k1", upper=2.0)
    with pytest.raises(ValueError, match="from above only"):
        rejection_mask(OLD, ROLLOUT, MASK, mode="token_k2", upper=2.0, lower=0.1)
    with pytest.raises(ValueError, match="lower <= upper"):
        rejection_mask(OLD, ROLLOUT, MASK, mode="token_k1", upper=2.0, lower=3.0)
