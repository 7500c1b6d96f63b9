"""Algorithm 1, lines 10-12: advantages, the actor's old log-probs, optional rollout correction, then mu passes of
mini-batch updates maximising J_DAPO (Eq. 8, token-level Eq. 12)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.log_probs import compute_log_probs_and_entropy_batch
from dapo.actor.update import NonFiniteLossError, update_policy
from dapo.config import DapoConfig
from dapo.core.rollout_correction import truncated_importance_weights
from dapo.infra.timing import PhaseTimer
from dapo.model.loading import Policy
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.errors import TrainingError
from dapo.training.step_metrics import batch_metrics, policy_metrics
from dapo.training.train_batch import build_train_batch
from dapo.training.weight_sync import actor_log_probs_of


def with_rollout_correction(batch: TrainBatch, cfg: DapoConfig) -> tuple[TrainBatch, dict[str, float]]:
    """Attach truncated importance weights pi_old / mu (``algorithm.rollout_correction``) when they are asked for."""
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is is None:
        return batch, {}
    assert batch.old_log_probs is not None and batch.rollout_log_probs is not None
    old = pad_per_token(batch.old_log_probs)
    roll = pad_per_token(batch.rollout_log_probs)
    mask = batch.loss_mask()
    iw = truncated_importance_weights(old, roll, mask, level=rc.rollout_is, threshold=rc.rollout_is_threshold)
    weights = [iw.weights[i, :n] for i, n in enumerate(batch.response_lengths)]
    return batch.with_is_weights(weights), {
        "rollout_corr/is_weight_mean": iw.mean,
        "rollout_corr/is_weight_max": iw.max,
        "rollout_corr/is_weight_min": iw.min,
        "rollout_corr/is_truncated_fraction": iw.truncated_fraction,
    }


def check_actor_logits(policy: Policy, groups: Sequence[ScoredGroup], step: int) -> None:
    """Stop here, not in the next rollout's sampler, when the updated weights give NaN / inf log-probs (finite but
    huge weights overflow the logits before any weight is NaN)."""
    sample = next(((g.prompt.input_ids, r) for g in groups for r in g.response_ids if r), None)
    if sample is None:
        return
    prompt, response = list(sample[0])[-32:], list(sample[1])[:32]
    if not bool(torch.isfinite(actor_log_probs_of(policy.model, prompt, response)).all()):
        largest = max(float(p.detach().abs().max()) for p in policy.model.parameters())
        raise TrainingError(
            f"step {step}, phase update_actor: after the update the actor's logits are non-finite (largest weight "
            f"magnitude {largest:.3g}); the next rollout would sample from garbage. The last complete checkpoint is "
            "untouched; lower actor.optim.lr"
        )


def update_actor(groups: Sequence[ScoredGroup], policy: Policy, optimizer, scheduler, cfg: DapoConfig, step: int,
                 timer: PhaseTimer) -> dict[str, float]:
    batch = build_train_batch(groups, cfg)  # line 10: group-relative advantages (Eq. 9)

    with timer("old_log_prob"):  # pi_theta_old: the actor recomputes the log-probs of the sampled tokens
        old_log_probs, entropies = compute_log_probs_and_entropy_batch(
            policy.model, batch, cfg.actor, temperature=cfg.rollout.temperature
        )
    batch, metrics = with_rollout_correction(batch.with_old_log_probs(old_log_probs), cfg)

    with timer("update_actor"):  # lines 11-12: mu passes of mini-batch updates
        try:
            metrics.update(update_policy(policy.model, optimizer, scheduler, batch, cfg.actor,
                                         temperature=cfg.rollout.temperature,
                                         norm_length=cfg.data.max_response_length))
        except NonFiniteLossError as exc:
            raise TrainingError(f"step {step}, phase update_actor: {str(exc).rstrip('.')}. The last complete "
                                f"checkpoint is untouched; lower actor.optim.lr or use actor.dtype=fp32") from exc

    check_actor_logits(policy, groups, step)
    metrics.update(batch_metrics(groups, batch.advantages, max_response_length=cfg.data.max_response_length))
    metrics.update(policy_metrics(old_log_probs, entropies, batch.rollout_log_probs))
    return metrics
