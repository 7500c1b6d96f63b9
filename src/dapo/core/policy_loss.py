"""The policy-loss registry and its default entry, ``vanilla``: the DAPO clipped policy-gradient objective per token
(Eq. 10, Clip-Higher), with optional dual clip.

Only the per-token loss matrix and its diagnostics are computed by a policy loss; reducing it to a scalar is
``dapo.core.loss_aggregation.aggregate_loss`` (token-level, Eq. 12), so each half can be tested and swapped alone.

Registry: ``actor.policy_loss.loss_mode`` (verl's ``actor_rollout_ref.actor.policy_loss.loss_mode``) picks a loss with
``get_policy_loss(name)``. Every registered loss has one signature, ``(log_prob, old_log_prob, advantages,
response_mask, params) -> PolicyLossOutput``, so ``dapo.actor.update`` calls any of them the same way. An entry is
the one place its name is spelled, with what the rest of dapo reads of it: the config keys it reads (``knobs``:
what the update passes it, what ``dapo train --print-config`` shows), the paper it follows and that paper's values
for the keys a config does not set (``paper_defaults``); config validation and the explanations derive from it. The
other objectives (GSPO, CISPO, GMPO, SAPO, Clip-Cov, KL-Cov) live one per file next to this one and register
themselves when ``dapo.core`` imports them; docs/objectives.md is their table, docs/extending.md says how to add one.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from dapo.core.masked import check_same_shape, masked_mean

CLIP_KNOBS: tuple[str, ...] = ("clip_ratio_low", "clip_ratio_high")
"""The knobs of a loss that clips its ratio (token, sequence or log-space) at ``1 - eps_low`` / ``1 + eps_high``."""

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


@dataclass(frozen=True)
class PolicyLossParams:
    """Every knob a registered policy loss may read (each loss reads its own; verl's names and defaults).

    Attributes:
        clip_ratio_low, clip_ratio_high: ``eps_low`` / ``eps_high`` of the clip (token, sequence or log-space,
            depending on the loss).
        clip_ratio_c: dual-clip constant (vanilla only), None = off.
        tau_pos, tau_neg: SAPO's gate temperatures for positive / negative advantages.
        clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov's share of tokens detached and its covariance band.
        kl_cov_ratio, ppo_kl_coef: KL-Cov's share of tokens penalised and the coefficient of the penalty.
        generator: random source of Clip-Cov's token draw (None = torch's global generator).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 1.0
    generator: torch.Generator | None = None


class PolicyLossFn(Protocol):
    """What a registered policy loss looks like: ``[B, T]`` tensors (one row per whole response) in, per-token loss
    matrix and diagnostics out."""

    def __call__(
        self,
        log_prob: Tensor,
        old_log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        params: PolicyLossParams,
    ) -> PolicyLossOutput: ...


@dataclass(frozen=True)
class PolicyLoss:
    """A registered loss and what the rest of dapo needs to know about it.

    Attributes:
        name: its ``actor.policy_loss.loss_mode``.
        fn: the loss.
        knobs: the config keys it reads, relative to ``actor`` (``clip_ratio_low``, ``policy_loss.clip_cov_ratio``);
            the last part of each is the ``PolicyLossParams`` field it arrives in, and the update passes it these and
            no other (the rest keep ``PolicyLossParams``' defaults). Config validation refuses a knob that is not a
            config key, so every key named here has a schema field with its default and its checks.
        paper: the paper the loss follows, named in the notices about its defaults and aggregation; None for DAPO.
        paper_defaults: values of ``actor`` keys (top-level ones) that the paper publishes where it differs from
            DAPO's defaults; a config selecting this loss takes them for every such key it does not set itself
            (validated as if the config had set them).
        zero_advantage_no_gradient: a sample whose advantage is exactly 0 changes nothing in the update: its gradient
            is exactly 0 and it does not enter any other sample's loss (so the update may skip its forward). False
            for Clip-Cov and KL-Cov, whose token selection centres over every token of the call (and KL-Cov's
            penalty does not scale with the advantage).
    """

    name: str
    fn: PolicyLossFn
    knobs: tuple[str, ...] = ()
    paper: str | None = None
    paper_defaults: Mapping[str, float | str] = field(default_factory=dict)
    zero_advantage_no_gradient: bool = True


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(
    name: str,
    *,
    knobs: tuple[str, ...],
    paper: str | None = None,
    paper_defaults: Mapping[str, float | str] | None = None,
    zero_advantage_no_gradient: bool = True,
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` with its knobs and paper (see :class:`PolicyLoss`); a
    second, different function for it is an error."""

    if paper_defaults and paper is None:
        raise ValueError(f"policy loss {name!r}: paper_defaults need the paper they come from (paper=...)")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        existing = POLICY_LOSSES.get(name)
        if existing is not None and existing.fn is not fn:
            raise ValueError(f"policy loss {name!r} is already registered to {existing.fn!r}")
        POLICY_LOSSES[name] = PolicyLoss(
            name, fn, tuple(knobs), paper, dict(paper_defaults or {}), zero_advantage_no_gradient
        )
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered under ``name``; ``KeyError`` listing the registered names otherwise."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(unknown_policy_loss(name)) from None


def unknown_policy_loss(name: str) -> str:
    """The refusal of an unregistered loss name, listing the registered ones."""
    return f"unknown policy loss {name!r}; registered losses: {', '.join(sorted(POLICY_LOSSES))}"


def check_clip_ratios(where: str, clip_ratio_low: float, clip_ratio_high: float) -> None:
    """``eps_low`` in [0, 1) and ``eps_high`` >= 0, or ``ValueError`` naming ``where``."""
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ValueError(f"{where}: clip_ratio_low (eps_low) must be in [0, 1), got {clip_ratio_low}")
    if clip_ratio_high < 0.0:
        raise ValueError(f"{where}: clip_ratio_high (eps_high) must be >= 0, got {clip_ratio_high}")


def token_diagnostics(
    response_mask: Tensor,
    like: Tensor,
    *,
    log_ratio: Tensor,
    ratio: Tensor,
    clipped: Tensor,
    clipped_lower: Tensor | None = None,
) -> PolicyLossOutput:
    """The detached masked-mean diagnostics every loss reports, around a loss matrix filled in by the caller."""
    metric_dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        zero = torch.zeros((), dtype=metric_dtype, device=like.device)
        return PolicyLossOutput(
            loss_mat=like,
            pg_clipfrac=masked_mean(clipped.to(metric_dtype), response_mask),
            pg_clipfrac_lower=zero
            if clipped_lower is None
            else masked_mean(clipped_lower.to(metric_dtype), response_mask),
            ppo_kl=masked_mean(-log_ratio.detach().to(metric_dtype), response_mask),
            ratio_mean=masked_mean(ratio.detach().to(metric_dtype), response_mask),
        )


def masked_loss(loss: Tensor, response_mask: Tensor) -> Tensor:
    """``loss`` on the valid tokens, exactly 0 on padding (selected with ``where``: a pad value never leaks)."""
    return torch.where(response_mask.bool(), loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


@register_policy_loss("vanilla", knobs=(*CLIP_KNOBS, "clip_ratio_c"))
def vanilla_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """DAPO Eq. 10 (Clip-Higher) with dual clip: :func:`compute_policy_loss` under the registry's signature."""
    return compute_policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_ratio_low=params.clip_ratio_low,
        clip_ratio_high=params.clip_ratio_high,
        clip_ratio_c=params.clip_ratio_c,
    )


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
