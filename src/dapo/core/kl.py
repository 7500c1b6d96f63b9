"""Per-token KL estimators against a reference policy, and the entropy of the token distribution.

DAPO drops the KL term (Section 2.3: the policy is meant to move away from the initial model), so both are off by
default; they serve GRPO-style runs and the monitoring of entropy collapse (the motivation of Clip-Higher, Sec. 3.1).
"""

from collections.abc import Callable

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape

LOG_RATIO_CLAMP = 20.0
"""``|log ref - log pi|`` is clamped to this before ``exp`` in k3."""
K3_CLAMP = 10.0
"""The k3 estimate (>= 0) is capped at 10 so one far-off token cannot dominate the penalty."""


def _k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1: ``log pi - log ref``, unbiased for KL(pi || ref) on samples of pi, high variance, can be negative."""
    return log_prob - ref_log_prob


def _abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """``|log pi - log ref|``."""
    return (log_prob - ref_log_prob).abs()


def _k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2: ``0.5 * (log pi - log ref)^2``, low variance, biased (Schulman, "Approximating KL Divergence")."""
    return 0.5 * (log_prob - ref_log_prob).square()


def _k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3: ``exp(log ref - log pi) - (log ref - log pi) - 1`` >= 0, unbiased and low variance (Schulman); clamped."""
    log_ratio = (ref_log_prob - log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # expm1 avoids the cancellation of exp(x) - 1 for tiny x, and the floor at 0 removes the rounding residue that
    # could make a mathematically non-negative estimate negative (found by a property test at x = 3.6e-10).
    return (torch.expm1(log_ratio) - log_ratio).clamp(0.0, K3_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": _k1,
    "kl": _k1,
    "abs": _abs,
    "k2": _k2,
    "mse": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kl_type: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs, ``[B, T]`` -> ``[B, T]``.

    ``kl_type``: ``"k1"``/``"kl"``, ``"abs"``, ``"k2"``/``"mse"``, or ``"k3"``/``"low_var_kl"`` (GRPO's estimator).
    """
    check_same_shape("kl_penalty", log_prob=log_prob, ref_log_prob=ref_log_prob)
    try:
        estimator = KL_ESTIMATORS[kl_type]
    except KeyError:
        raise ValueError(f"kl_penalty: unknown kl_type {kl_type!r}; allowed: {', '.join(KL_ESTIMATORS)}") from None
    return estimator(log_prob, ref_log_prob)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy ``H = logsumexp(z) - sum_v softmax(z)_v z_v`` over the last dim, ``[..., V]`` -> ``[...]``.

    The logsumexp form never takes the log of a probability, so it is stable for large logits; logits of ``-inf``
    (masked vocabulary entries) have probability 0 and contribute 0, not NaN, to the value and the gradient.
    """
    if logits.dim() == 0:
        raise ValueError("entropy_from_logits: logits must have a vocabulary dimension, got a scalar")
    probs = torch.softmax(logits, dim=-1)
    finite_logits = torch.where(probs > 0, logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
    return torch.logsumexp(logits, dim=-1) - (probs * finite_logits).sum(dim=-1)
