"""Algorithm 1, lines 10-12: advantages, the actor's old log-probs, optional rollout correction, then mu passes of
mini-batch updates maximising J_DAPO (Eq. 8, token-level Eq. 12).

pi_old (the denominator of Eq. 8's ratio) comes from one of three places (``actor.recompute_old_log_prob``):
``recompute`` runs the actor over the whole batch before the update; ``current`` uses the update's own forward when
the update is a single optimizer step (the weights are still pi_old's when the forward runs, so the ratio is exactly
1, as recomputing would give); ``rollout`` takes the engine's sampling log-probs, which are the actor's own when the
Transformers engine samples from the actor's fp32 module without top-p/top-k (gap ~4e-7, logged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.log_probs import compute_log_probs_and_entropy_batch
from dapo.actor.update import FirstPassRecord, NonFiniteLossError, actions_of, update_policy
from dapo.config import DapoConfig
from dapo.core.rollout_correction import rejection_mask, truncated_importance_weights
from dapo.distributed.data_parallel import forward_through, local_part
from dapo.distillation.signal import direct_distillation_of, with_distillation
from dapo.distillation.teacher import TeacherError
from dapo.distillation.teachers import TeacherSet
from dapo.distributed.world import World
from dapo.infra.timing import PhaseTimer
from dapo.model.loading import Policy
from dapo.model.router_replay import tape_of
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.errors import TrainingError
from dapo.training.routing_replay_pass import replayed_old_log_probs
from dapo.training.step_metrics import batch_metrics, policy_metrics
from dapo.training.train_batch import build_train_batch
from dapo.training.weight_sync import actor_log_probs_of


def with_rollout_correction(batch: TrainBatch, cfg: DapoConfig) -> tuple[TrainBatch, dict[str, float]]:
    """Apply ``algorithm.rollout_correction`` between pi_old and the engine's mu when asked for: importance weights
    pi_old / mu (TIS or IcePop) over every token of each response, then rejection sampling masks the loss (rejected
    tokens leave it and its normalisers). The order matters for ``rollout_is=sequence`` with a ``token_*`` rejection
    mode: the sequence weight is the product over the whole response, as verl computes it, not over the kept tokens
    only (rejecting a token does not make the response's other tokens more or less likely under mu)."""
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is is None and rc.rollout_rs is None:
        return batch, {}
    assert batch.old_log_probs is not None and batch.rollout_log_probs is not None
    old = pad_per_token(batch.old_log_probs)
    roll = pad_per_token(batch.rollout_log_probs)
    metrics: dict[str, float] = {}
    unrejected = batch.loss_mask()  # before rejection: the mask the importance weights are computed over
    if rc.rollout_rs is not None:
        upper, lower = rc.rs_bounds()
        rs = rejection_mask(old, roll, batch.loss_mask(), mode=rc.rollout_rs, upper=upper, lower=lower)
        batch = dataclasses.replace(batch, token_mask=[rs.keep[i, :n] for i, n in enumerate(batch.response_lengths)])
        metrics["rollout_corr/rs_masked_fraction"] = rs.masked_fraction
        metrics["rollout_corr/rs_seq_masked_fraction"] = rs.seq_masked_fraction
    if rc.rollout_is is not None:
        threshold, lower = rc.is_bounds()
        iw = truncated_importance_weights(old, roll, unrejected, level=rc.rollout_is, threshold=threshold, lower=lower)
        weights = torch.where(batch.loss_mask(), iw.weights, 0.0)  # rejected tokens carry no weight
        batch = batch.with_is_weights([weights[i, :n] for i, n in enumerate(batch.response_lengths)])
        metrics.update(
            {
                "rollout_corr/is_weight_mean": iw.mean,
                "rollout_corr/is_weight_max": iw.max,
                "rollout_corr/is_weight_min": iw.min,
                "rollout_corr/is_truncated_fraction": iw.truncated_fraction,
                "rollout_corr/is_weight_std": iw.std,
                "rollout_corr/is_eff_sample_size": iw.eff_sample_size,
            }
        )
        if lower is not None:
            metrics["rollout_corr/is_masked_fraction"] = iw.masked_fraction
    return batch, metrics


def check_actor_logits(policy: Policy, groups: Sequence[ScoredGroup], step: int) -> None:
    """Stop here, not in the next rollout's sampler, when the updated weights give NaN / inf log-probs (finite but
    huge weights overflow the logits before any weight is NaN)."""
    sample = next(((g.prompt.input_ids, r) for g in groups for r in g.response_ids if r), None)
    if sample is None:
        return
    prompt, response = list(sample[0])[-32:], list(sample[1])[:32]
    if not bool(torch.isfinite(actor_log_probs_of(policy.model, prompt, response)).all()):
        shards = [local_part(p).detach() for p in policy.model.parameters()]  # this rank's, for a sharded actor
        largest = max((float(t.abs().max()) for t in shards if t.numel()), default=0.0)
        raise TrainingError(
            f"step {step}, phase update_actor: after the update the actor's logits are non-finite (largest weight "
            f"magnitude {largest:.3g}); the next rollout would sample from garbage. The last complete checkpoint is "
            "untouched; lower actor.optim.lr"
        )


def old_log_prob_source(
    cfg: DapoConfig, *, num_groups: int, engine_samples_from_actor: bool, off_policy: bool = False
) -> str:
    """Where pi_old comes from this step: "recompute", "current" or "rollout" (see the module docstring).

    ``off_policy``: the samples were drawn by older weights than the actor's (``async_training``). The shortcuts
    assume the engine held the actor's current weights, so they do not apply: pi_old is recomputed by the actor
    (decoupled PPO: the proximal policy is the actor before this update, the engine's log-probs remain the behaviour
    policy that ``algorithm.rollout_correction`` weighs against), or, with ``async_training.pi_old=bypass``, it is
    the engine's sampling log-probs."""
    if off_policy:
        rc = cfg.algorithm.rollout_correction
        bypass = rc.bypass_mode or (cfg.async_training.pi_old == "bypass" and rc.rollout_is is None)
        return "rollout" if bypass else "recompute"
    mode = cfg.actor.recompute_old_log_prob
    if mode == "always" or cfg.actor.router_replay.mode != "disabled":  # replay measures (R3) or records (R2) there
        return "recompute"
    if cfg.distillation.enabled and mode != "never" and not cfg.algorithm.rollout_correction.bypass_mode:
        return "recompute"  # the teacher's signal needs the student's log-probs before the update
    rc = cfg.algorithm.rollout_correction
    if mode == "never" or rc.bypass_mode:  # bypass: the engine's log-probs are pi_old, the PPO ratio is pi / mu
        return "rollout"
    if rc.rollout_is is not None or rc.rollout_rs is not None:  # they compare a real pi_old with mu
        return "recompute"
    num_mini_batches = -(-num_groups // cfg.actor.ppo_mini_batch_size)
    if cfg.actor.ppo_epochs * num_mini_batches == 1:
        return "current"
    r = cfg.rollout
    untruncated = r.top_p >= 1.0 and r.top_k <= 0  # the engine's log-probs are of the full softmax, as the actor's
    # rollout.true_on_policy: the engine's log-probs are the actor's bitwise (dapo.model.batch_invariant), so pi_old
    # is read from them by proof, in any precision; fp32 otherwise: within the engine/actor gap of ~4e-7.
    exact = cfg.rollout.true_on_policy or cfg.actor.dtype == "fp32"
    if engine_samples_from_actor and exact and untruncated:
        return "rollout"
    return "recompute"


def gathered_record(record: FirstPassRecord, world: World) -> FirstPassRecord:
    """Every rank's first-pass record, in rank order: each rank saw only the share it trained, and the metrics drawn
    from the record must cover the whole batch, the same on every rank."""
    if not world.distributed:
        return record
    parts = world.all_gather_objects(record)
    return FirstPassRecord(
        **{f.name: [t for part in parts for t in getattr(part, f.name)] for f in dataclasses.fields(FirstPassRecord)}
    )


def teacher_routes(groups: Sequence[ScoredGroup], teacher_key: str) -> list[str | None]:
    """Per response, the value that routes it to a distillation teacher: its prompt's ``data_source`` or the
    ``extra_info`` entry ``teacher_key`` names."""

    def route(group: ScoredGroup) -> str | None:
        if teacher_key == "data_source":
            return group.prompt.data_source
        value = group.prompt.extra_info.get(teacher_key)
        return None if value is None else str(value)

    return [route(g) for g in groups for _ in g.response_ids]


def update_actor(
    groups: Sequence[ScoredGroup],
    policy: Policy,
    optimizer,
    scheduler,
    cfg: DapoConfig,
    step: int,
    timer: PhaseTimer,
    *,
    engine_samples_from_actor: bool = False,
    world: World = World(),
    off_policy: bool = False,
    teachers: TeacherSet | None = None,
) -> dict[str, float]:
    """Lines 10-12 on the whole batch; with several ranks (``world``) each trains its share and all return the same
    metrics (``dapo.actor.update.update_policy``). ``off_policy``: samples from older weights (see
    :func:`old_log_prob_source`). ``teachers``: on-policy distillation (``dapo.distillation``): after pi_old, the
    teachers score the batch and their signal joins the advantages or the loss."""
    batch = build_train_batch(groups, cfg)  # line 10: group-relative advantages (Eq. 9)
    source = old_log_prob_source(
        cfg, num_groups=batch.num_groups, engine_samples_from_actor=engine_samples_from_actor, off_policy=off_policy
    )
    metrics: dict[str, float] = {"actor/old_log_prob_recomputed": float(source == "recompute")}
    record = None if source == "recompute" else FirstPassRecord()
    tape = tape_of(policy.model)  # MoE routing replay (actor.router_replay.mode), else None
    if source == "recompute":
        with timer("old_log_prob"):  # pi_theta_old: the actor recomputes the log-probs of the sampled tokens
            if tape is not None:  # under routing replay: the batch then carries the routes the update replays
                batch, old_log_probs, entropies, replay_metrics = replayed_old_log_probs(policy.model, tape, batch, cfg)
                metrics.update(replay_metrics)
            else:
                old_log_probs, entropies = forward_through(  # a sharded actor: one root forward for the whole pass
                    policy.model,
                    compute_log_probs_and_entropy_batch,
                    batch,
                    cfg.actor,
                    temperature=cfg.rollout.temperature,
                )
        batch, correction = with_rollout_correction(batch.with_old_log_probs(old_log_probs), cfg)
        metrics.update(correction)
    elif source == "rollout":
        assert batch.rollout_log_probs is not None
        batch = batch.with_old_log_probs(batch.rollout_log_probs)
    if teachers is not None:
        if batch.old_log_probs is None:
            raise TrainingError(
                f"step {step}: distillation needs the student's log-probs before the update, but "
                f"pi_old comes from the update itself here ({source})"
            )
        try:
            batch, distill_metrics = with_distillation(
                batch, teacher_routes(groups, cfg.distillation.teacher_key), teachers, cfg
            )
        except TeacherError as exc:
            raise TrainingError(f"step {step}, phase distillation: {exc}") from None
        metrics.update(distill_metrics)

    with timer("update_actor"):  # lines 11-12: mu passes of mini-batch updates
        try:
            metrics.update(
                update_policy(
                    policy.model,
                    optimizer,
                    scheduler,
                    batch,
                    cfg.actor,
                    temperature=cfg.rollout.temperature,
                    norm_length=cfg.data.max_response_length,
                    on_policy=source == "current",
                    record=record,
                    world=world,
                    distillation=direct_distillation_of(cfg) if teachers else None,
                )
            )
        except NonFiniteLossError as exc:
            raise TrainingError(
                f"step {step}, phase update_actor: {str(exc).rstrip('.')}. The last complete "
                f"checkpoint is untouched; lower actor.optim.lr or use actor.dtype=fp32"
            ) from exc

    if tape is not None:  # replayed vs live in the update: how far the router moved
        # each rank compared its own share's tokens: summed, every rank logs the whole batch's agreement
        matched, compared = world.all_reduce_sum(torch.tensor([tape.matched, tape.compared], dtype=torch.float64))
        if compared > 0:
            metrics["moe/update_routing_agreement"] = float(matched / compared)
    check_actor_logits(policy, groups, step)
    metrics.update(batch_metrics(groups, batch.advantages, max_response_length=cfg.data.max_response_length))
    if record is None:  # over actions only (a multi-turn trajectory's tool tokens are context)
        mask = batch.action_mask
        metrics.update(
            policy_metrics(
                actions_of(old_log_probs, mask),
                actions_of(entropies, mask),
                None if batch.rollout_log_probs is None else actions_of(batch.rollout_log_probs, mask),
            )
        )
    else:  # the update's own forwards stand in for the skipped pass (see FirstPassRecord)
        record = gathered_record(record, world)
        if record.old_log_probs:  # the actor-vs-engine gap, where the weights were still pi_old's
            metrics.update(policy_metrics(record.old_log_probs, None, record.rollout_log_probs))
        if record.log_probs:
            metrics["actor/mean_prob"] = float(torch.cat(record.log_probs).float().exp().mean())
            metrics["actor/entropy"] = float(torch.cat(record.entropies).float().mean())
    return metrics
