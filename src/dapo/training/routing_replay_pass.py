"""The old-log-prob pass under MoE routing replay (``actor.router_replay.mode``, dapo.model.router_replay), and what
it measures.

R3: the batch carries the rollout's routes; the pass replays them (pi_old is then the policy the engine sampled from,
expert for expert), counts how often the actor's live router agreed with the rollout (``moe/routing_agreement``,
over token x layer top-k sets), and runs once more routing live, for the log-prob gap to the engine without replay
(both gaps over the sampled tokens: a multi-turn trajectory's tool output is context, its log-prob a placeholder).
R2: the pass routes live and records its routes, which the update then replays.
Both: the share of the routed slots each expert received in the pass (``moe/expert_load/*``, 1 / experts when
balanced).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import compute_log_probs_and_entropy_batch, compute_log_probs_batch
from dapo.actor.update import actions_of
from dapo.config import DapoConfig
from dapo.distributed.data_parallel import forward_through
from dapo.model.router_replay import RouterTape
from dapo.training.errors import TrainingError


def _gap(name: str, log_probs: Sequence[torch.Tensor], rollout: Sequence[torch.Tensor]) -> dict[str, float]:
    diff = (torch.cat([lp.float() for lp in log_probs]) - torch.cat([lp.float() for lp in rollout])).abs()
    return {f"moe/log_prob_gap/{name}_max": float(diff.max()), f"moe/log_prob_gap/{name}_mean": float(diff.mean())}


def _load(tape: RouterTape) -> dict[str, float]:
    load = tape.load_fractions()
    if load is None:
        return {}
    return {"moe/expert_load/max": float(load.max()), "moe/expert_load/min": float(load.min())}


def replayed_old_log_probs(
    model: torch.nn.Module, tape: RouterTape, batch: TrainBatch, cfg: DapoConfig
) -> tuple[TrainBatch, list[torch.Tensor], list[torch.Tensor], dict[str, float]]:
    """pi_old under replay: the batch the update trains on (carrying the routes it replays), the old log-probs, the
    entropies and the pass's metrics (module docstring)."""
    temperature = cfg.rollout.temperature
    tape.reset_counts()
    metrics: dict[str, float] = {}
    if tape.rollout_routes:  # R3
        if batch.routed_experts is None:
            raise TrainingError(
                "actor.router_replay.mode=R3: the rollout engine returned no routes for this batch (the hf "
                "engine records them on the module it generates from, the actor's or its own copy, only inside "
                "the run's routing replay: dapo.training.run.Run.routing_replay)"
            )
        old, entropies = forward_through(
            model, compute_log_probs_and_entropy_batch, batch, cfg.actor, temperature=temperature
        )
        agreement = tape.agreement()
        if agreement is not None:
            metrics["moe/routing_agreement"] = agreement
        metrics.update(_load(tape))
        live = forward_through(
            model, compute_log_probs_batch, batch.with_routed_experts(None), cfg.actor, temperature=temperature
        )
        if batch.rollout_log_probs is not None:  # over actions: a tool token's rollout log-prob is a 0.0 placeholder
            rollout = actions_of(batch.rollout_log_probs, batch.action_mask)
            metrics.update(_gap("replayed", actions_of(old, batch.action_mask), rollout))
            metrics.update(_gap("live", actions_of(live, batch.action_mask), rollout))
    else:  # R2: the pass's own routes, for the update
        with tape.recording():
            old, entropies = forward_through(
                model,
                compute_log_probs_and_entropy_batch,
                batch.with_routed_experts(None),
                cfg.actor,
                temperature=temperature,
            )
            routes = list(tape.samples)
        metrics.update(_load(tape))
        batch = batch.with_routed_experts(routes)
    tape.reset_counts()  # the update's passes count from here (moe/update_routing_agreement)
    return batch, old, entropies, metrics
