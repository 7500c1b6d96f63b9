"""The DAPO clipped policy-gradient objective per token (Eq. 10, Clip-Higher), with optional dual clip.

Only the per-token loss matrix and its diagnostics are computed here; reducing it to a scalar is
``dapo.core.loss_aggregation.aggregate_loss`` (token-level, Eq. 12), so each half can be tested and swapped alone.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape, masked_mean

LOG_RATIO_CLAMP = 20.0
"""``|log pi - log pi_old|`` is clamped to this before ``exp`` so a stale or broken sample cannot overflow the ratio."""


@dataclass(frozen=True)
class PolicyLossOutput:
    """Per-token loss and detached diagnostics, each a masked mean over the valid tokens (0 when there are none).

    Attributes:
        loss_mat: ``[B, T]`` per-token loss, 0 on padding; differentiable w.r.t. ``log_prob``.
        pg_clipfrac: fraction of tokens where the clipped term is the active max (``-A*clip(r) > -A*r``).
        pg_clipfrac_lower: fraction of tokens where the dual clip bound ``-A*c`` is active (``A < 0``); 0 without it.
        ppo_kl: k1 estimate of KL(pi_old || pi): mean of ``old_log_prob - log_prob``.
        ratio_mean: mean importance ratio ``pi / pi_old``.
    """

    loss_mat: Tensor
    pg_clipfrac: Tensor
    pg_clipfrac_lower: Tensor
    ppo_kl: Tensor
    ratio_mean: Tensor


def compute_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float | None = None,
) -> PolicyLossOutput:
    """Per-token clipped surrogate loss, DAPO Eq. 10 with decoupled ``eps_low`` / ``eps_high`` (Clip-Higher).

    ``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and
    ``loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))``: Eq. 10's ``min`` negated, to be minimised.
    With ``clip_ratio_c`` (dual-clip PPO, c > 1) tokens with ``A < 0`` get ``min(loss, -A * c)``: the loss of a
    negative-advantage token whose ratio has exploded is bounded by ``c * |A|``.

    Args:
        log_prob: ``[B, T]`` log-probs of the sampled tokens under the current policy (requires grad).
        old_log_prob: ``[B, T]`` log-probs under the policy that generated the samples.
        advantages: ``[B, T]`` token advantages (see ``broadcast_advantage``).
        response_mask: ``[B, T]``, nonzero on the tokens that enter the loss.
        clip_ratio_low: ``eps_low``, in [0, 1).
        clip_ratio_high: ``eps_high``, >= 0.
        clip_ratio_c: dual-clip constant ``c`` (> 1), or None for no dual clip.
    """
    check_same_shape(
        "compute_policy_loss",
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
    )
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ValueError(f"compute_policy_loss: clip_ratio_low (eps_low) must be in [0, 1), got {clip_ratio_low}")
    if clip_ratio_high < 0.0:
        raise ValueError(f"compute_policy_loss: clip_ratio_high (eps_high) must be >= 0, got {clip_ratio_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"compute_policy_loss: clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")

    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped

    if clip_ratio_c is None:
        dual_clip_active = torch.zeros_like(clip_active)
    else:
        dual_bound = -advantages * clip_ratio_c
        dual_clip_active = (advantages < 0) & (loss > dual_bound)
        loss = torch.where(dual_clip_active, dual_bound, loss)

    loss_mat = torch.where(response_mask.bool(), loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    with torch.no_grad():
        metric_dtype = torch.float32 if loss.dtype != torch.float64 else torch.float64
        return PolicyLossOutput(
            loss_mat=loss_mat,
            pg_clipfrac=masked_mean(clip_active.to(metric_dtype), response_mask),
            pg_clipfrac_lower=masked_mean(dual_clip_active.to(metric_dtype), response_mask),
            ppo_kl=masked_mean(-log_ratio.detach().to(metric_dtype), response_mask),
            ratio_mean=masked_mean(ratio.detach().to(metric_dtype), response_mask),
        )
