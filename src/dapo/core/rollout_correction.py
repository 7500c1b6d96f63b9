"""Train/inference mismatch correction: truncated importance sampling between the rollout engine and the actor.

The engine that samples (vLLM, a bf16 kernel, a batch of a different shape) is not bit-for-bit the actor that is
trained, so the samples come from a behaviour policy mu that differs slightly from pi_theta_old. Truncated importance
sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", as
implemented by verl's ``rollout_is``) reweights each token's PPO loss by

    token level:     w_t = min(pi_old(y_t) / mu(y_t), C)
    sequence level:  w   = min(prod_t pi_old(y_t) / mu(y_t), C)     (the same weight on every token of a response)

with the weights detached (they scale the gradient, they are not differentiated). C, the truncation threshold, bounds
the variance the correction can add; verl's default is 2.0. ``pi_old`` is the actor's recomputed log-prob and ``mu``
the engine's reported one (see ``dapo.rollout.base`` for what the engine reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape, masked_mean

ROLLOUT_IS_LEVELS: tuple[str, ...] = ("token", "sequence")
RolloutISLevel = Literal["token", "sequence"]

LOG_RATIO_CLAMP = 20.0
"""log(pi_old / mu) is clamped before ``exp`` (per token, and for the sequence sum) so a broken sample cannot
overflow; any such weight is truncated to C anyway."""


@dataclass(frozen=True)
class ImportanceWeights:
    """Detached ``[B, T]`` weights (0 on padding) and their statistics over the valid tokens.

    Attributes:
        weights: the truncated weights.
        mean, max, min: of the *untruncated* ratio over valid tokens (how far the engine is from the actor).
        truncated_fraction: share of valid tokens whose ratio exceeded the threshold.
    """

    weights: Tensor
    mean: float
    max: float
    min: float
    truncated_fraction: float


def truncated_importance_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: RolloutISLevel,
    threshold: float = 2.0,
) -> ImportanceWeights:
    """Truncated importance weights between the actor (``old_log_prob``) and the sampler (``rollout_log_prob``).

    Args:
        old_log_prob: ``[B, T]`` log pi_old of the sampled tokens.
        rollout_log_prob: ``[B, T]`` log mu of the same tokens, as the engine reported them.
        response_mask: ``[B, T]``, nonzero on real response tokens.
        level: "token" (one weight per token) or "sequence" (the product over the response, one weight per sample).
        threshold: C > 0, the upper truncation bound.
    """
    check_same_shape("truncated_importance_weights", old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob,
                     response_mask=response_mask)
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"truncated_importance_weights: level must be one of {ROLLOUT_IS_LEVELS}, got {level!r}")
    if not threshold > 0:
        raise ValueError(f"truncated_importance_weights: threshold must be > 0, got {threshold}")
    mask = response_mask.bool()
    with torch.no_grad():
        log_ratio = torch.where(mask, (old_log_prob - rollout_log_prob).float(), 0.0)
        if level == "token":
            ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        else:
            seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            ratio = torch.exp(seq_log_ratio).expand_as(log_ratio)
        weights = torch.where(mask, ratio.clamp(max=threshold), 0.0)
        valid = ratio[mask]
        if valid.numel() == 0:
            return ImportanceWeights(weights, float("nan"), float("nan"), float("nan"), 0.0)
        return ImportanceWeights(
            weights=weights,
            mean=float(masked_mean(ratio, mask)),
            max=float(valid.max()),
            min=float(valid.min()),
            truncated_fraction=float((valid > threshold).float().mean()),
        )
