"""The teacher's log-probs of the student's tokens, turned into what the update trains on (docs/distillation.md).

PG OPD (``use_policy_gradient``): per token, ``sg(-D_t)`` (with k1: ``log nu - log pi_s``, clamped) becomes the
token's advantage in the policy-gradient loss (``TrainBatch.token_advantages``); with ``use_task_rewards`` it is
added, times ``distillation_loss_coef``, to the reward's group-relative advantage (Eq. 9), else it is the whole
advantage. GKD OPD (direct): the teacher's log-probs ride in the batch and the update adds ``coef * D`` to its loss
(``dapo.actor.direct_distillation.DirectDistillation``); without the task reward the reward's advantages are zeroed.

``log pi_s`` is pi_old, the student that sampled (recomputed by the actor at the rollout temperature, or the
engine's own log-probs in bypass mode); only action tokens count (``TrainBatch.loss_mask``: a multi-turn
trajectory's tool output is context the teacher reads but is not scored on).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.direct_distillation import DirectDistillation
from dapo.config import DapoConfig
from dapo.core.distillation_losses import get_distillation_loss, pg_distillation_advantages
from dapo.distillation.teachers import TeacherSet

__all__ = ["direct_distillation_of", "with_distillation"]


def direct_distillation_of(cfg: DapoConfig) -> DirectDistillation | None:
    """The loss term the update adds for GKD OPD (None for PG OPD or with distillation off)."""
    ds = cfg.distillation
    loss = ds.distillation_loss
    if not ds.enabled or loss.use_policy_gradient:
        return None
    return DirectDistillation(
        loss.loss_mode,
        coef=loss.distillation_loss_coef if loss.use_task_rewards else 1.0,
        log_prob_min_clamp=loss.log_prob_min_clamp,
        loss_max_clamp=loss.loss_max_clamp,
    )


def with_distillation(
    batch: TrainBatch, routes: Sequence[str | None], teachers: TeacherSet, cfg: DapoConfig
) -> tuple[TrainBatch, dict[str, float]]:
    """``batch`` (with ``old_log_probs``: the student that sampled) carrying the teacher's signal, and the
    ``distill/*`` metrics: ``reverse_kl`` (mean over action tokens of log pi_s - log nu, the k1 estimate of
    KL(pi_s || nu)), ``teacher_log_prob_mean``, ``student_log_prob_mean``, ``advantage_mean`` (PG OPD), and
    ``timing_s/teacher`` (seconds the teachers took)."""
    assert batch.old_log_probs is not None, "the student's log-probs (pi_old) come first"
    loss = cfg.distillation.distillation_loss
    mode = get_distillation_loss(loss.loss_mode)
    t0 = time.perf_counter()
    teacher = teachers.log_probs(batch, routes)
    topk = teachers.top_log_probs(batch, routes, loss.topk) if mode.kind == "topk" else None
    seconds = time.perf_counter() - t0
    mask = batch.loss_mask()
    student = pad_per_token([lp.float().cpu() for lp in batch.old_log_probs], mask.shape[1])
    teacher_padded = pad_per_token(teacher, mask.shape[1])
    tokens = max(int(mask.sum()), 1)
    metrics = {
        "distill/reverse_kl": float(torch.where(mask, student - teacher_padded, 0.0).sum()) / tokens,
        "distill/teacher_log_prob_mean": float(torch.where(mask, teacher_padded, 0.0).sum()) / tokens,
        "distill/student_log_prob_mean": float(torch.where(mask, student, 0.0).sum()) / tokens,
        "timing_s/teacher": seconds,
    }
    if loss.use_policy_gradient:
        signal = pg_distillation_advantages(
            student,
            teacher_padded,
            mask,
            loss.loss_mode,
            log_prob_min_clamp=loss.log_prob_min_clamp,
            loss_max_clamp=loss.loss_max_clamp,
        )
        metrics["distill/advantage_mean"] = float(signal.sum()) / tokens
        if loss.use_task_rewards:
            reward = batch.advantages.float().unsqueeze(1).expand_as(signal)
            per_token = torch.where(mask, reward + loss.distillation_loss_coef * signal, 0.0)
        else:
            per_token = signal
        lengths = batch.response_lengths
        return dataclasses.replace(batch, token_advantages=[per_token[i, :n] for i, n in enumerate(lengths)]), metrics
    advantages = batch.advantages if loss.use_task_rewards else torch.zeros_like(batch.advantages)
    batch = dataclasses.replace(batch, advantages=advantages, teacher_log_probs=teacher)
    if topk is not None:
        batch = dataclasses.replace(batch, teacher_topk_log_probs=topk[0], teacher_topk_ids=topk[1])
    return batch, metrics
