"""GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673); verl's ``geo_mean``.

GRPO maximises the arithmetic mean of the token terms ``r_t A``; one token with an extreme ratio then dominates.
GMPO maximises their geometric mean, with the clip applied per token in log space (maximised)::

    J_GMPO = E[ 1/G sum_i sgn(A_i) (prod_t |min(r_i,t A_i, clip(r_i,t, e^-eps_low, e^eps_high) A_i)|)^(1/|o_i|) ]

which, since ``|A_i|`` factors out of the product, is ``A_i * exp( 1/|o_i| sum_t l_i,t )`` with the pessimistic
clipped log-ratio ``l_i,t = sgn(A) * min( sgn(A) log r_i,t, sgn(A) clip(log r_i,t, -eps_low, eps_high) )``.
``clip_ratio_low`` / ``clip_ratio_high`` are the log-space bounds here; the paper's choice is (e^-0.4, e^0.4), i.e.
eps_low = eps_high = 0.4, a wider range than PPO's because the geometric mean is already robust to outliers.
Every token of response i gets the loss ``-A_i,t * exp(mean_t l_i,t)``, so ``seq-mean-token-mean`` aggregation is
the paper's 1/G sum; like GSPO the row holds the whole response, so the mean is over the complete sequence.
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


# The paper's log-space clip is +-0.4, and it averages per response (verl hard-codes that aggregation for this mode).
@register_policy_loss(
    "geo_mean",
    knobs=CLIP_KNOBS,
    paper="GMPO (arXiv 2507.20673)",
    paper_defaults={"clip_ratio_low": 0.4, "clip_ratio_high": 0.4, "loss_agg_mode": "seq-mean-token-mean"},
)
def gmpo_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """GMPO: ``loss_i,t = -A_i,t * exp(1/|o_i| sum_t l_i,t)`` with ``l`` the sign-pessimistic log-space clip above.

    ``pg_clipfrac`` counts tokens where the clipped log-ratio was the one taken with ``A > 0`` (ratio above
    ``e^eps_high``); ``pg_clipfrac_lower`` with ``A < 0`` (ratio below ``e^-eps_low``).
    """
    check_same_shape(
        "geo_mean", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    check_clip_ratios("geo_mean", params.clip_ratio_low, params.clip_ratio_high)
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    sign = torch.sign(advantages)
    clipped_log_ratio = log_ratio.clamp(-params.clip_ratio_low, params.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    seq_ratio = torch.exp(masked_mean(pessimistic, response_mask, dim=1)).unsqueeze(1).expand_as(log_prob)
    loss = -advantages * seq_ratio
    took_clip = sign * clipped_log_ratio < sign * log_ratio
    return token_diagnostics(
        response_mask,
        masked_loss(loss, response_mask),
        log_ratio=log_ratio,
        ratio=seq_ratio,
        clipped=took_clip & (advantages > 0),
        clipped_lower=took_clip & (advantages < 0),
    )
