"""The distillation loss modes on hand-computed values (dapo.core.distillation_losses)."""

from __future__ import annotations

import math

import pytest
import torch

from dapo.core.distillation_losses import (
    DISTILLATION_LOSSES,
    forward_kl_topk,
    pg_distillation_advantages,
    sampled_token_divergence,
)

S = torch.tensor([[math.log(0.5), math.log(0.25)]])  # the student's log-probs of its two sampled tokens
T = torch.tensor([[math.log(0.25), math.log(0.5)]])  # the teacher's of the same tokens
LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("k1", [LN2, -LN2]),  # log pi_s - log nu
        ("kl", [LN2, -LN2]),
        ("abs", [LN2, LN2]),
        ("k2", [0.5 * LN2**2, 0.5 * LN2**2]),
        ("mse", [0.5 * LN2**2, 0.5 * LN2**2]),
        ("k3", [0.5 - (-LN2) - 1.0, 2.0 - LN2 - 1.0]),  # exp(t - s) - (t - s) - 1
        ("low_var_kl", [0.5 + LN2 - 1.0, 1.0 - LN2]),
    ],
)
def test_single_sample_estimators_by_hand(mode: str, want: list[float]) -> None:
    torch.testing.assert_close(sampled_token_divergence(S, T, mode), torch.tensor([want]))
    assert DISTILLATION_LOSSES[mode].kind == "sampled"


def test_pg_advantage_is_teacher_minus_student_clamped_masked_and_detached() -> None:
    student = S.clone().requires_grad_(True)
    mask = torch.tensor([[True, False]])
    adv = pg_distillation_advantages(student, T, mask, "k1")
    torch.testing.assert_close(adv, torch.tensor([[-LN2, 0.0]]))  # log 0.25 - log 0.5; the masked token: 0
    assert not adv.requires_grad  # a reward, stop-gradient
    clamped = pg_distillation_advantages(S, T, torch.ones_like(mask), "k1", loss_max_clamp=0.5)
    torch.testing.assert_close(clamped, torch.tensor([[-0.5, 0.5]]))
    floored = pg_distillation_advantages(
        torch.tensor([[-30.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]), "k1", log_prob_min_clamp=-5.0
    )
    torch.testing.assert_close(floored, torch.tensor([[4.0]]))  # -1 - max(-30, -5)


def test_equal_log_probs_give_exactly_zero_for_every_mode() -> None:
    for mode, loss in DISTILLATION_LOSSES.items():
        if loss.kind == "sampled":
            assert torch.equal(sampled_token_divergence(S, S.clone(), mode), torch.zeros_like(S)), mode


def test_forward_kl_topk_by_hand() -> None:
    # teacher top-2: probs 0.5, 0.25; student at those ids: 0.25, 0.25
    teacher = torch.log(torch.tensor([[0.5, 0.25]]))
    student = torch.log(torch.tensor([[0.25, 0.25]])).requires_grad_(True)
    value = forward_kl_topk(student, teacher)
    torch.testing.assert_close(value, torch.tensor([0.5 * LN2 + 0.0]))
    value.sum().backward()  # d/d log pi_s(v) = -nu(v)
    torch.testing.assert_close(student.grad, torch.tensor([[-0.5, -0.25]]))
    # the student puts more mass there than the teacher: the truncated sum is negative and clamped to 0
    assert float(forward_kl_topk(torch.log(torch.tensor([[0.6, 0.3]])), teacher)) == 0.0
