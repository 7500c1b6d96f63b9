"""GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071): one importance ratio per response.

The objective (maximised)::

    J_GSPO = E[ 1/G sum_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i ) ]

with the length-normalised sequence ratio::

    s_i = (pi(y_i | x) / pi_old(y_i | x)) ^ (1 / |y_i|) = exp( 1/|y_i| sum_t log(pi(y_i,t) / pi_old(y_i,t)) )

GSPO-token gives each token ``s_i,t = sg[s_i] * pi(y_i,t) / sg[pi(y_i,t)]``: the same value as ``s_i``
and, when every token of a response carries the response's advantage (outcome rewards), the same gradient; it exists
so that a per-token advantage can be used.

Micro-batching: ``s_i`` needs every token of response i. Here a response is always one whole row of the ``[B, T]``
tensors (the actor's micro-batches are sets of whole samples, never a cut through one), so the row sum is the
sequence sum; the ratio therefore does not depend on which micro-batch, padding width or neighbours a response has
(``tests/core/test_objectives.py`` proves it). The paper's recommended clip range is tiny because the ratio is a
per-token geometric mean: eps_low = 3e-4, eps_high = 4e-4.
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

# GSPO clips its sequence-level ratio at 3e-4 / 4e-4 and averages per response, 1/G sum_i (verl hard-codes that
# aggregation for both modes).
GSPO_PAPER_DEFAULTS: dict[str, float | str] = {
    "clip_ratio_low": 3e-4,
    "clip_ratio_high": 4e-4,
    "loss_agg_mode": "seq-mean-token-mean",
}


def sequence_log_ratio(log_prob: Tensor, old_log_prob: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, 1]`` ``1/|y_i| sum_t (log pi - log pi_old)`` over each row's valid tokens (0 for a row without any)."""
    return masked_mean(log_prob - old_log_prob, response_mask, dim=1).unsqueeze(1)


def _clipped_sequence_loss(
    ratio: Tensor, advantages: Tensor, response_mask: Tensor, log_ratio: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    return token_diagnostics(
        response_mask, masked_loss(loss, response_mask), log_ratio=log_ratio, ratio=ratio, clipped=clipped > unclipped
    )


@register_policy_loss("gspo", knobs=CLIP_KNOBS, paper="GSPO (arXiv 2507.18071)", paper_defaults=GSPO_PAPER_DEFAULTS)
def gspo_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """GSPO: ``loss_i,t = max(-A_i,t s_i, -A_i,t clip(s_i, 1 - eps_low, 1 + eps_high))`` on every valid token
    of response i, with ``s_i`` the geometric mean of its token ratios (differentiated through all of them).

    Aggregated with ``seq-mean-token-mean`` this is exactly ``-J_GSPO`` (the 1/G sum over responses).
    """
    check_same_shape(
        "gspo", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    check_clip_ratios("gspo", params.clip_ratio_low, params.clip_ratio_high)
    seq_log_ratio = sequence_log_ratio(log_prob, old_log_prob, response_mask)
    ratio = torch.exp(seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).expand_as(log_prob)
    return _clipped_sequence_loss(ratio, advantages, response_mask, log_prob - old_log_prob, params)


@register_policy_loss(
    "gspo_token", knobs=CLIP_KNOBS, paper="GSPO (arXiv 2507.18071)", paper_defaults=GSPO_PAPER_DEFAULTS
)
def gspo_token_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """GSPO-token: ``s_i,t = sg[s_i] * pi(y_i,t) / sg[pi(y_i,t)]`` in the clipped objective; its value is
    ``s_i`` and its gradient reaches token t only through ``log pi(y_i,t)``, weighted by ``A_i,t``."""
    check_same_shape(
        "gspo_token", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    check_clip_ratios("gspo_token", params.clip_ratio_low, params.clip_ratio_high)
    seq_log_ratio = sequence_log_ratio(log_prob, old_log_prob, response_mask).detach()
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return _clipped_sequence_loss(
        torch.exp(token_log_ratio), advantages, response_mask, log_prob - old_log_prob, params
    )
