"""Loss aggregation modes (token-level Eq. 12 and the sequence-level variants) and the micro-batching contract."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import LOSS_AGG_MODES, aggregate_loss, count_loss_normalizers

F64 = torch.float64
# Row 0: 3 valid tokens (1, 2, 3). Row 1: 1 valid token (4). Row 2: no valid token (e.g. overlong-filtered).
# Padding holds 100 so any leak shows.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [100.0, 100.0, 100.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 10 / 4 valid tokens
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),  # mean of per-sequence means over the 2 sequences with tokens
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 3)),  # Dr. GRPO: / (num_seqs * T)
    ],
)
def test_hand_computed_modes(mode: str, expected: float) -> None:
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_global_normalizers_are_used_when_given() -> None:
    assert aggregate_loss(LOSS, MASK, "token-mean", global_num_tokens=8).item() == pytest.approx(10 / 8)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean", global_num_seqs=4).item() == pytest.approx(6 / 4)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", global_num_seqs=5).item() == pytest.approx(10 / 5)
    value = aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", global_num_seqs=4, norm_length=10).item()
    assert value == pytest.approx(10 / 40)


def test_count_loss_normalizers() -> None:
    assert count_loss_normalizers(MASK) == (4, 2)
    assert count_loss_normalizers(torch.zeros(2, 3, dtype=torch.bool)) == (0, 0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_no_valid_token_gives_zero_and_finite_gradient(mode: str) -> None:
    loss_mat = torch.full((2, 3), 7.0, requires_grad=True)
    value = aggregate_loss(loss_mat, torch.zeros(2, 3), mode)
    value.backward()
    assert value.item() == 0.0
    assert torch.equal(loss_mat.grad, torch.zeros(2, 3))
    assert aggregate_loss(loss_mat, torch.zeros(2, 3), mode, global_num_tokens=0, global_num_seqs=0).item() == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss_agg_mode": "seq-mean"}, "unknown loss_agg_mode 'seq-mean'; allowed: token-mean"),
        ({"loss_agg_mode": "token-mean", "global_num_tokens": -1}, "global_num_tokens"),
        ({"loss_agg_mode": "seq-mean-token-sum", "global_num_seqs": -2}, "global_num_seqs"),
        ({"loss_agg_mode": "seq-mean-token-sum-norm", "norm_length": 0}, "norm_length"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        aggregate_loss(LOSS, MASK, **kwargs)


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"loss_mask=\(3, 2\)"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")


@st.composite
def batches_and_cuts(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    b = draw(st.integers(1, 8))
    t = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=gen, dtype=F64)
    lengths = torch.tensor(draw(st.lists(st.integers(0, t), min_size=b, max_size=b)))
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    cuts = sorted(draw(st.sets(st.integers(1, b - 1), max_size=b - 1))) if b > 1 else []
    return loss, mask, cuts


@settings(max_examples=60, deadline=None)
@given(batches_and_cuts(), st.sampled_from(LOSS_AGG_MODES))
def test_micro_batch_sum_equals_uncut_value_and_gradient(
    batch: tuple[torch.Tensor, torch.Tensor, list[int]], mode: str
) -> None:
    loss, mask, cuts = batch
    whole = loss.clone().requires_grad_(True)
    uncut = aggregate_loss(whole, mask, mode)
    uncut.backward()

    num_tokens, num_seqs = count_loss_normalizers(mask)
    pieces = loss.clone().requires_grad_(True)
    bounds = [0, *cuts, loss.shape[0]]
    total = sum(
        aggregate_loss(
            pieces[lo:hi],
            mask[lo:hi],
            mode,
            global_num_tokens=num_tokens,
            global_num_seqs=num_seqs,
            norm_length=loss.shape[1],
        )
        for lo, hi in itertools.pairwise(bounds)
    )
    total.backward()
    torch.testing.assert_close(total, uncut)
    torch.testing.assert_close(pieces.grad, whole.grad)
    assert torch.equal(whole.grad[~mask], torch.zeros_like(whole.grad[~mask]))  # padding never gets gradient
