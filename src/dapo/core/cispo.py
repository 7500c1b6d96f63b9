"""CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, Sec. 3.1).

The objective (maximised)::

    J_CISPO = E[ 1 / sum_i |o_i| * sum_i sum_t sg( r_hat_i,t ) A_i,t log pi(o_i,t) ]
    r_hat_i,t = clip(r_i,t, 1 - eps_low, 1 + eps_high),   r_i,t = pi(o_i,t) / pi_old(o_i,t)

The importance weight is clipped and detached, and the gradient flows through ``log pi`` of every token: unlike
PPO's clip, which zeroes the gradient of a token whose ratio left the trust region (often the rare "fork" tokens of a
reflection), CISPO only bounds how much that token's gradient is weighted. The paper's normaliser 1/sum|o_i| is
``token-mean`` aggregation. The paper drops the lower bound (only eps_high is tuned); here eps_low must stay in
[0, 1) like every clip of this tree, so eps_low = 0.999 is "no lower clip" in effect, and eps_high of a few units
(the paper's range) or Clip-Higher's 0.28 bound the upward weight.
"""

from torch import Tensor

from dapo.core.masked import check_same_shape
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


# The paper puts no lower bound on the IS weight: 0.999 is the nearest eps_low < 1.
@register_policy_loss(
    "cispo", knobs=CLIP_KNOBS, paper="CISPO (arXiv 2506.13585)", paper_defaults={"clip_ratio_low": 0.999}
)
def cispo_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """CISPO: ``loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi_t``.

    ``pg_clipfrac`` is the share of tokens whose weight was clipped (they keep a gradient, unlike in DAPO Eq. 10).
    """
    check_same_shape(
        "cispo", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    check_clip_ratios("cispo", params.clip_ratio_low, params.clip_ratio_high)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    weight = ratio.clamp(1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high)
    loss = -weight * advantages * log_prob
    return token_diagnostics(
        response_mask, masked_loss(loss, response_mask), log_ratio=log_ratio, ratio=ratio, clipped=weight != ratio
    )
