"""On-policy distillation losses: how a teacher's log-probs of the student's own tokens become a training signal.

The student samples y ~ pi_s; the teacher nu scores exactly those tokens. Per token t of a response, with
s_t = (x, y_<t), two families (verl's docs/algo/opd.md names; Agarwal et al. 2024 "GKD"; Lu & Thinking Machines 2025
"On-Policy Distillation"):

* single-sample estimators of the reverse KL KL(pi_s || nu) at the sampled token, from ``log pi_s(y_t|s_t)`` and
  ``log nu(y_t|s_t)`` only (``dapo.core.kl.KL_ESTIMATORS``: k1 = log pi_s - log nu, abs, k2, k3). Used either as a
  per-token reward ``r_t = -D_t`` under stop-gradient fed to the policy-gradient loss (PG OPD: with k1,
  ``r_t = log nu - log pi_s``, the negative reverse-KL estimate), or as a loss backpropagated directly;
* ``forward_kl_topk``: sum over the teacher's top-k tokens v of nu(v) (log nu(v) - log pi_s(v)), the forward KL
  truncated to the teacher's top-k support, backpropagated directly (GKD OPD). Being truncated it can be negative
  (both masses < 1); negative per-token values are clamped to 0, as verl does.

Each mode is a registered :class:`DistillationLoss` (``DISTILLATION_LOSSES``); the names are the config's
``distillation.distillation_loss.loss_mode``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dapo.core.kl import KL_ESTIMATORS
from dapo.core.masked import check_same_shape

__all__ = [
    "DISTILLATION_LOSSES",
    "DistillationLoss",
    "forward_kl_topk",
    "get_distillation_loss",
    "pg_distillation_advantages",
    "sampled_token_divergence",
]


def _clamped(values: Tensor, clamp: float | None) -> Tensor:
    return values if clamp is None else values.clamp(-clamp, clamp)


def sampled_token_divergence(
    student_log_prob: Tensor,
    teacher_log_prob: Tensor,
    mode: str,
    *,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> Tensor:
    """``[B, T]`` per-token estimate D_t of KL(pi_s || nu) at the sampled token, estimator ``mode`` (k1, abs, k2, k3
    and their verl aliases). ``log_prob_min_clamp`` floors both log-probs first (a near-zero probability would make
    log nu - log pi_s explode); ``loss_max_clamp`` bounds D_t to [-c, c]. Differentiable in ``student_log_prob``."""
    check_same_shape("sampled_token_divergence", student_log_prob=student_log_prob, teacher_log_prob=teacher_log_prob)
    if mode not in KL_ESTIMATORS:
        raise ValueError(
            f"distillation loss_mode {mode!r} is not a single-sample estimator; allowed: {', '.join(KL_ESTIMATORS)}"
        )
    if log_prob_min_clamp is not None:
        student_log_prob = student_log_prob.clamp(min=log_prob_min_clamp)
        teacher_log_prob = teacher_log_prob.clamp(min=log_prob_min_clamp)
    return _clamped(KL_ESTIMATORS[mode](student_log_prob, teacher_log_prob), loss_max_clamp)


def pg_distillation_advantages(
    student_log_prob: Tensor,
    teacher_log_prob: Tensor,
    mask: Tensor,
    mode: str,
    *,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> Tensor:
    """PG OPD's per-token advantage ``sg(-D_t)``, 0 where ``mask`` is False (padding, tool output, filtered samples).

    With k1 this is ``clamp(log nu(y_t) - log pi_s(y_t))``: positive where the teacher likes the student's token more
    than the student does. Detached: the signal is a reward, and differentiating through it would cancel the teacher
    term (verl docs/algo/opd.md, "PG OPD")."""
    check_same_shape("pg_distillation_advantages", student_log_prob=student_log_prob, mask=mask)
    divergence = sampled_token_divergence(
        student_log_prob.detach(),
        teacher_log_prob.detach(),
        mode,
        log_prob_min_clamp=log_prob_min_clamp,
        loss_max_clamp=loss_max_clamp,
    )
    return torch.where(mask, -divergence, torch.zeros((), dtype=divergence.dtype, device=divergence.device))


def forward_kl_topk(
    student_topk_log_prob: Tensor,
    teacher_topk_log_prob: Tensor,
    *,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> Tensor:
    """``[..., k] -> [...]``: sum_v nu(v) (log nu(v) - log pi_s(v)) over the teacher's top-k tokens v (GKD OPD).

    ``student_topk_log_prob[..., j]`` is the student's log-prob of the teacher's j-th most likely token. The truncated
    sum can be negative (the student may put more mass on those k tokens than the teacher); such values are clamped
    to 0 (verl's ``forward_kl_topk``), which also stops their gradient. Differentiable in the student's log-probs."""
    check_same_shape(
        "forward_kl_topk", student_topk_log_prob=student_topk_log_prob, teacher_topk_log_prob=teacher_topk_log_prob
    )
    if log_prob_min_clamp is not None:
        student_topk_log_prob = student_topk_log_prob.clamp(min=log_prob_min_clamp)
        teacher_topk_log_prob = teacher_topk_log_prob.clamp(min=log_prob_min_clamp)
    teacher_prob = teacher_topk_log_prob.exp()
    per_token = (teacher_prob * (teacher_topk_log_prob - student_topk_log_prob)).sum(dim=-1).clamp(min=0.0)
    return per_token if loss_max_clamp is None else per_token.clamp(max=loss_max_clamp)


@dataclass(frozen=True)
class DistillationLoss:
    """One ``loss_mode``: ``kind`` "sampled" (needs the teacher's log-prob of the sampled token; ``fn`` is
    :func:`sampled_token_divergence` with the mode bound) or "topk" (needs the teacher's top-k log-probs and the
    student's at those ids; ``fn`` is :func:`forward_kl_topk`)."""

    name: str
    kind: str
    fn: Callable[..., Tensor]


def _sampled(mode: str) -> Callable[..., Tensor]:
    def divergence(student_log_prob: Tensor, teacher_log_prob: Tensor, **clamps: float | None) -> Tensor:
        return sampled_token_divergence(student_log_prob, teacher_log_prob, mode, **clamps)

    return divergence


DISTILLATION_LOSSES: dict[str, DistillationLoss] = {
    **{mode: DistillationLoss(mode, "sampled", _sampled(mode)) for mode in KL_ESTIMATORS},
    "forward_kl_topk": DistillationLoss("forward_kl_topk", "topk", forward_kl_topk),
}


def get_distillation_loss(mode: str) -> DistillationLoss:
    try:
        return DISTILLATION_LOSSES[mode]
    except KeyError:
        raise ValueError(
            f"unknown distillation loss_mode {mode!r}; allowed: {', '.join(DISTILLATION_LOSSES)}"
        ) from None
