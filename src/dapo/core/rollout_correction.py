"""Train/inference mismatch correction between the rollout engine and the actor: truncated importance sampling (TIS),
IcePop's two-sided band, and rejection sampling (verl's ``algorithm.rollout_correction``).

The engine that samples (vLLM, a bf16 kernel, a batch of a different shape) is not bit-for-bit the actor that is
trained, so the samples come from a behaviour policy mu that differs slightly from pi_theta_old. Truncated importance
sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", as
implemented by verl's ``rollout_is``) reweights each token's PPO loss by

    token level:     w_t = min(pi_old(y_t) / mu(y_t), C)
    sequence level:  w   = min(prod_t pi_old(y_t) / mu(y_t), C)     (the same weight on every token of a response)

with the weights detached (they scale the gradient, they are not differentiated). C, the truncation threshold, bounds
the variance the correction can add; verl's default is 2.0. ``pi_old`` is the actor's recomputed log-prob and ``mu``
the engine's reported one (see ``dapo.rollout.base`` for what the engine reports).

IcePop (the Ling team's Ring-1T report, 2025): with a band ``[lower, upper]`` instead of one threshold, a
token (or sequence) whose ratio leaves the band gets weight 0 instead of a truncated one: it is masked out of the
gradient, not shrunk (``rollout_is_threshold="0.5_2.0"`` in verl's spelling).

Rejection sampling (``rollout_rs``; verl's modes, after Liu, Li et al. 2025, "When speed kills stability", and
Geo-RS): a token or a whole response leaves the loss (and its normalisers) when a divergence statistic of
``log rho_t = log pi_old(y_t) - log mu(y_t)`` leaves its bound::

    k1: rho itself, two-sided  lower <= rho <= upper      k2: 0.5 (log rho)^2 <= upper
    k3: rho - 1 - log rho <= upper (>= 0, Schulman's k3)

aggregated as ``token_*`` (each token alone), ``seq_sum_*`` (the sum over the response; for k1 the product of the
token ratios), ``seq_mean_*`` (the mean; for k1 the geometric mean of the ratios, Geo-RS, length-invariant) or
``seq_max_*`` (the worst token; k2 and k3 only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape, masked_mean

ROLLOUT_IS_LEVELS: tuple[str, ...] = ("token", "sequence")
ROLLOUT_RS_MODES: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
RolloutISLevel = Literal["token", "sequence"]

LOG_RATIO_CLAMP = 20.0
"""log(pi_old / mu) is clamped before ``exp`` (per token, and for the sequence sum) so a broken sample cannot
overflow; any such weight is truncated to C anyway."""


@dataclass(frozen=True)
class ImportanceWeights:
    """Detached ``[B, T]`` weights (0 on padding) and their statistics over the valid tokens.

    Attributes:
        weights: the truncated (TIS) or band-masked (IcePop) weights.
        mean, max, min: of the *untruncated* ratio over valid tokens (how far the engine is from the actor).
        truncated_fraction: share of valid tokens whose ratio exceeded the threshold (the band's upper bound).
        masked_fraction: share of valid tokens given weight 0 by the band (IcePop; 0 for TIS).
        eff_sample_size: ``1 / mean(w_norm^2)`` with ``w_norm = w / mean(w)`` over valid tokens, in (0, 1]: 1 when
            every weight is equal, small when a few tokens carry the update.
        std: standard deviation of the applied weights over valid tokens.
    """

    weights: Tensor
    mean: float
    max: float
    min: float
    truncated_fraction: float
    masked_fraction: float = 0.0
    eff_sample_size: float = float("nan")
    std: float = float("nan")


def truncated_importance_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: RolloutISLevel,
    threshold: float = 2.0,
    lower: float | None = None,
) -> ImportanceWeights:
    """Truncated importance weights between the actor (``old_log_prob``) and the sampler (``rollout_log_prob``).

    Args:
        old_log_prob: ``[B, T]`` log pi_old of the sampled tokens.
        rollout_log_prob: ``[B, T]`` log mu of the same tokens, as the engine reported them.
        response_mask: ``[B, T]``, nonzero on real response tokens.
        level: "token" (one weight per token) or "sequence" (the product over the response, one weight per sample).
        threshold: C > 0, the upper truncation bound (the band's upper end with ``lower``).
        lower: IcePop's lower end of the band (0 < lower <= threshold): ratios outside ``[lower, threshold]`` get
            weight 0 and ratios inside keep their value; None = TIS (truncate at ``threshold``).
    """
    check_same_shape(
        "truncated_importance_weights",
        old_log_prob=old_log_prob,
        rollout_log_prob=rollout_log_prob,
        response_mask=response_mask,
    )
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"truncated_importance_weights: level must be one of {ROLLOUT_IS_LEVELS}, got {level!r}")
    if not threshold > 0:
        raise ValueError(f"truncated_importance_weights: threshold must be > 0, got {threshold}")
    if lower is not None and not 0 < lower <= threshold:
        raise ValueError(f"truncated_importance_weights: need 0 < lower <= threshold, got {lower} and {threshold}")
    mask = response_mask.bool()
    with torch.no_grad():
        log_ratio = torch.where(mask, (old_log_prob - rollout_log_prob).float(), 0.0)
        if level == "token":
            ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        else:
            seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            ratio = torch.exp(seq_log_ratio).expand_as(log_ratio)
        if lower is None:
            weights = torch.where(mask, ratio.clamp(max=threshold), 0.0)
            out_of_band = torch.zeros_like(mask)
        else:
            out_of_band = mask & ((ratio < lower) | (ratio > threshold))
            weights = torch.where(mask & ~out_of_band, ratio, 0.0)
        valid = ratio[mask]
        if valid.numel() == 0:
            return ImportanceWeights(weights, float("nan"), float("nan"), float("nan"), 0.0)
        applied = weights[mask].double()
        normalised = applied / applied.mean() if float(applied.mean()) > 0 else applied
        return ImportanceWeights(
            weights=weights,
            mean=float(masked_mean(ratio, mask)),
            max=float(valid.max()),
            min=float(valid.min()),
            truncated_fraction=float((valid > threshold).float().mean()),
            masked_fraction=float(out_of_band[mask].float().mean()),
            eff_sample_size=float(1.0 / normalised.square().mean()) if float(applied.mean()) > 0 else 0.0,
            std=float(applied.std(unbiased=False)),
        )


@dataclass(frozen=True)
class RejectionMask:
    """Which tokens rejection sampling keeps in the loss.

    Attributes:
        keep: ``[B, T]`` bool, False on rejected tokens (for a ``seq_*`` mode, on every token of a rejected response)
            and on padding.
        keep_sequence: ``[B]`` bool, False for a response with at least one rejected token (or none valid).
        masked_fraction: share of valid tokens rejected.
        seq_masked_fraction: share of responses (with >= 1 valid token) that lost at least one token.
    """

    keep: Tensor
    keep_sequence: Tensor
    masked_fraction: float
    seq_masked_fraction: float


def rejection_mask(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    mode: str,
    upper: float,
    lower: float | None = None,
) -> RejectionMask:
    """Rejection sampling between pi_old and the sampler mu (see the module docstring for the statistics).

    Args:
        old_log_prob, rollout_log_prob, response_mask: as in :func:`truncated_importance_weights`.
        mode: one of ``ROLLOUT_RS_MODES``.
        upper: the upper bound (k1: of the ratio; k2/k3: of the divergence), > 0.
        lower: k1 only, the lower bound of the ratio (default ``1 / upper``); k2/k3 take none.
    """
    check_same_shape(
        "rejection_mask", old_log_prob=old_log_prob, rollout_log_prob=rollout_log_prob, response_mask=response_mask
    )
    if mode not in ROLLOUT_RS_MODES:
        raise ValueError(f"rejection_mask: mode must be one of {', '.join(ROLLOUT_RS_MODES)}, got {mode!r}")
    if not upper > 0:
        raise ValueError(f"rejection_mask: upper must be > 0, got {upper}")
    k1 = mode.endswith("k1")
    if not k1 and lower is not None:
        raise ValueError(f"rejection_mask: {mode} bounds a divergence from above only; got a lower bound {lower}")
    if k1:
        lower = 1.0 / upper if lower is None else lower
        if not 0 < lower <= upper:
            raise ValueError(f"rejection_mask: need 0 < lower <= upper, got {lower} and {upper}")
    mask = response_mask.bool()
    with torch.no_grad():
        log_ratio = torch.where(mask, (old_log_prob - rollout_log_prob).double(), 0.0)
        log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        if k1:
            stat = log_ratio  # compared in log space: log lower <= stat <= log upper
        elif mode.endswith("k2"):
            stat = 0.5 * log_ratio.square()
        else:
            stat = torch.expm1(log_ratio) - log_ratio
        level = mode.split("_k")[0]
        if level == "token":
            per_token = stat
        elif level == "seq_sum":
            per_token = torch.where(mask, stat, 0.0).sum(dim=1, keepdim=True).expand_as(stat)
        elif level == "seq_mean":
            per_token = masked_mean(stat, mask, dim=1).unsqueeze(1).expand_as(stat)
        else:  # seq_max (k2, k3 >= 0, so 0 on padding never wins over a real token)
            per_token = torch.where(mask, stat, 0.0).max(dim=1, keepdim=True).values.expand_as(stat)
        if k1:
            assert lower is not None
            inside = (per_token >= math.log(lower)) & (per_token <= math.log(upper))
        else:
            inside = per_token <= upper
        keep = mask & inside
        has_valid = mask.any(dim=1)
        keep_sequence = has_valid & ~(mask & ~inside).any(dim=1)
        num_valid = int(mask.sum())
        num_seqs = int(has_valid.sum())
        return RejectionMask(
            keep=keep,
            keep_sequence=keep_sequence,
            masked_fraction=float((mask & ~inside).sum()) / num_valid if num_valid else 0.0,
            seq_masked_fraction=float((has_valid & ~keep_sequence).sum()) / num_seqs if num_seqs else 0.0,
        )
