"""SAPO, Soft Adaptive Policy Optimization (Qwen team 2025, arXiv 2511.20347): a smooth gate instead of the clip.

The hard clip of DAPO Eq. 10 makes a token's gradient jump to exactly 0 when its ratio leaves
``[1 - eps_low, 1 + eps_high]``. SAPO replaces ``r A`` by a soft, temperature-controlled gate (maximised)::

    J_SAPO = E[ f_tau(r_t) A_t ],   f_tau(r) = 4/tau * sigmoid( tau (r - 1) ),   tau = tau_pos if A_t > 0 else tau_neg

Its derivative w.r.t. ``log pi`` is ``4 r sigmoid(tau (r-1)) (1 - sigmoid(tau (r-1)))``: exactly ``r = 1`` times the
policy gradient on-policy (as the unclipped surrogate), decaying smoothly as the ratio moves away from 1, faster for
larger tau. The paper uses tau_neg > tau_pos (negative-advantage tokens, which push probability onto many other
tokens, are damped harder): tau_pos = 1.0, tau_neg = 1.05, verl's defaults; it aggregates per sequence
(``seq-mean-token-mean``). No clip ratio is read.
"""

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape
from dapo.core.policy_loss import (
    LOG_RATIO_CLAMP,
    PolicyLossOutput,
    PolicyLossParams,
    masked_loss,
    register_policy_loss,
    token_diagnostics,
)


def sapo_gate(ratio: Tensor, tau: Tensor | float) -> Tensor:
    """``f_tau(r) = 4/tau * sigmoid(tau (r - 1))``: value 2/tau and slope 1 at ``r = 1``."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


# The paper averages per response (verl hard-codes that aggregation for this mode).
@register_policy_loss(
    "sapo",
    knobs=("tau_pos", "tau_neg"),
    paper="SAPO (arXiv 2511.20347)",
    paper_defaults={"loss_agg_mode": "seq-mean-token-mean"},
)
def sapo_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """SAPO: ``loss_t = -f_tau(r_t) * A_t`` with ``tau = tau_pos`` where ``A_t > 0``, else ``tau_neg``.

    ``pg_clipfrac`` is 0 (nothing is clipped).
    """
    check_same_shape(
        "sapo", log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=response_mask
    )
    if not (params.tau_pos > 0 and params.tau_neg > 0):
        raise ValueError(f"sapo: tau_pos and tau_neg must be > 0, got {params.tau_pos} and {params.tau_neg}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    # The temperatures in the input's dtype: a Python float given to torch.where becomes a float32 tensor, which
    # rounds 1.05 to 1.0499999523 before any cast to float64 could keep it.
    tau = torch.where(
        advantages > 0,
        torch.tensor(params.tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.tensor(params.tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    loss = -sapo_gate(ratio, tau) * advantages
    return token_diagnostics(
        response_mask,
        masked_loss(loss, response_mask),
        log_ratio=log_ratio,
        ratio=ratio,
        clipped=torch.zeros_like(response_mask, dtype=torch.bool),
    )
