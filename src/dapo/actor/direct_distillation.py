"""The distillation term the update backpropagates directly (GKD OPD), as the actor sees it: which divergence, its
weight and clamps. Built from the config by ``dapo.distillation.signal``; read by the mini-batch plan (every sample
trains under it) and by the update (the loss term)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DirectDistillation:
    """A distillation loss backpropagated directly (GKD OPD; ``distillation.distillation_loss.use_policy_gradient``
    false): ``coef * D`` joins the loss, D the per-token divergence ``mode`` names
    (``dapo.core.distillation_losses``) between the student's log-probs, with gradient, and the batch's
    ``teacher_log_probs`` (or ``teacher_topk_*``), aggregated with ``actor.loss_agg_mode`` like the policy loss."""

    mode: str
    coef: float = 1.0
    log_prob_min_clamp: float | None = None
    loss_max_clamp: float | None = None
