"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617, Sec. 4): the entropy-collapse counters that, like DAPO's Clip-Higher, act on few tokens.

The paper shows that the change of policy entropy is driven by the covariance, over tokens, between a token's
log-probability and its advantage; a few tokens with a very large covariance drive the collapse. Both methods
compute the centred per-token covariance over the batch's valid tokens::

    Cov_t = ( log pi(y_t) - mean(log pi) ) * ( A_t - mean(A) )

* Clip-Cov: of the tokens with ``omega_low < Cov_t < omega_high`` (and not already clipped by the PPO clip), a random
  ``r * N`` are drawn and their gradient is detached (their loss value stays; they are not updated);
  the rest get PPO's clipped loss. Paper/verl: r = 2e-4, omega = (1, 5).
* KL-Cov: the top ``k * N`` tokens by ``Cov_t`` get ``-A_t r_t + beta |log r_t|`` (a KL penalty to pi_old), the
  others the unclipped ``-A_t r_t``. Paper/verl: k = 2e-4 (Qwen2.5-7B; 2e-3 at 32B), beta = 1.

N is the number of valid tokens in the call, and the means are over them: the batch of the call, which in the actor
update is one micro-batch, as in verl (at least one token is drawn whenever a candidate exists).
"""

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape, masked_mean
from dapo.core.policy_loss import (
    CLIP_KNOBS,
    LOG_RATIO_CLAMP,
    PolicyLossOutput,
    PolicyLossParams,
    check_clip_ratios,
    masked_loss,
    register_policy_loss,
    token_diagnostics,
)


def token_covariance(log_prob: Tensor, advantages: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, T]`` detached ``(log pi_t - mean log pi) (A_t - mean A)``, means over the valid tokens; -inf on padding."""
    with torch.no_grad():
        lp = log_prob.detach()
        cov = (lp - masked_mean(lp, response_mask)) * (advantages - masked_mean(advantages, response_mask))
        return torch.where(response_mask.bool(), cov, torch.full_like(cov, -torch.inf))


def _selected_count(ratio: float, response_mask: Tensor) -> int:
    return max(int(ratio * int(response_mask.bool().sum())), 1)


@register_policy_loss(
    "clip_cov",
    knobs=(*CLIP_KNOBS, "policy_loss.clip_cov_ratio", "policy_loss.clip_cov_lb", "policy_loss.clip_cov_ub"),
    zero_advantage_no_gradient=False,
)
def clip_cov_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """Clip-Cov: PPO's clipped loss (``eps_low`` / ``eps_high``) with the gradient of a random ``clip_cov_ratio``
    share of the tokens whose covariance lies in ``(clip_cov_lb, clip_cov_ub)`` detached. ``pg_clipfrac`` =
    PPO-clipped or detached tokens."""
    check_same_shape(
        "clip_cov", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    check_clip_ratios("clip_cov", params.clip_ratio_low, params.clip_ratio_high)
    if not (params.clip_cov_ratio > 0 and params.clip_cov_lb < params.clip_cov_ub):
        raise ValueError(
            f"clip_cov: need clip_cov_ratio > 0 and clip_cov_lb < clip_cov_ub, got "
            f"{params.clip_cov_ratio}, {params.clip_cov_lb}, {params.clip_cov_ub}"
        )
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    cov = token_covariance(log_prob, advantages, response_mask)
    candidates = (cov > params.clip_cov_lb) & (cov < params.clip_cov_ub) & response_mask.bool() & ~clip_active
    positions = candidates.flatten().nonzero().flatten()
    detach = torch.zeros_like(candidates)
    if positions.numel():
        order = torch.randperm(positions.numel(), generator=params.generator).to(positions.device)
        chosen = positions[order[: _selected_count(params.clip_cov_ratio, response_mask)]]
        detach.view(-1)[chosen] = True
    loss = torch.where(detach, loss.detach(), loss)
    return token_diagnostics(
        response_mask, masked_loss(loss, response_mask), log_ratio=log_ratio, ratio=ratio, clipped=clip_active | detach
    )


@register_policy_loss(
    "kl_cov", knobs=("policy_loss.kl_cov_ratio", "policy_loss.ppo_kl_coef"), zero_advantage_no_gradient=False
)
def kl_cov_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """KL-Cov: ``-A_t r_t`` on every token, plus ``ppo_kl_coef * |log r_t|`` on the top ``kl_cov_ratio`` share by
    covariance. No clip. ``pg_clipfrac`` = the share of tokens penalised."""
    check_same_shape(
        "kl_cov", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    if not (params.kl_cov_ratio > 0 and params.ppo_kl_coef >= 0):
        raise ValueError(
            f"kl_cov: need kl_cov_ratio > 0 and ppo_kl_coef >= 0, got {params.kl_cov_ratio}, {params.ppo_kl_coef}"
        )
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss = -advantages * ratio
    penalised = torch.zeros_like(response_mask, dtype=torch.bool)
    if bool(response_mask.bool().any()):
        cov = token_covariance(log_prob, advantages, response_mask).flatten()
        top = torch.topk(
            cov, min(_selected_count(params.kl_cov_ratio, response_mask), int(response_mask.bool().sum()))
        ).indices
        penalised.view(-1)[top] = True
    loss = torch.where(penalised, loss + params.ppo_kl_coef * log_ratio.abs(), loss)
    return token_diagnostics(
        response_mask, masked_loss(loss, response_mask), log_ratio=log_ratio, ratio=ratio, clipped=penalised
    )
