"""Samples drawn by older weights than the actor trains: their version tags and the staleness metrics.

A version is the trainer step whose weights the engine held (the initial push is the step the run starts from).
A batch trained at step k by an actor holding step k-1's weights has, per sample, a lag of ``(k-1) - version``
(per token for a partial rollout spanning pushes); one-step-off training keeps every lag at 0 or 1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dapo.reward.scored_groups import ScoredGroup


@dataclass
class ProducedBatch:
    """A step's training batch as the rollout side handed it over: the kept groups (each with the weight version of
    every token, ``ScoredGroup.token_versions``) and the generation metrics."""

    groups: list[ScoredGroup]
    metrics: dict[str, float]
    # Not saved (a resumed run's clock differs, and its FLOP count restarts): the perf_counter intervals the producer
    # worked on this batch (async/overlap_s), every group its rounds generated, kept or not (perf/flops/rollout), and
    # the seconds of generation in them (perf/*/rollout).
    busy: list[tuple[float, float]] = field(default_factory=list, compare=False)
    generated: list[ScoredGroup] = field(default_factory=list, compare=False)
    gen_s: float = field(default=0.0, compare=False)

    @classmethod
    def stamped(
        cls, groups: list[ScoredGroup], metrics: dict[str, float], version: int, **measured: Any
    ) -> ProducedBatch:
        """The batch of ``groups``; a group the engine did not stamp (an engine in this process, or one that draws a
        whole request under one version) gets ``version`` on every token."""
        stamp_versions(groups, version)
        return cls(groups, metrics, **measured)

    @property
    def token_versions(self) -> list[list[list[int]]]:
        """Group by group, sample by sample, the version of each token."""
        return [g.token_versions or [[] for _ in g.response_ids] for g in self.groups]

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_state() for g in self.groups], "metrics": dict(self.metrics)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ProducedBatch:
        groups = [ScoredGroup.from_state(g) for g in state["groups"]]
        for g, versions in zip(groups, state.get("token_versions", [])):  # checkpoints that kept them beside
            g.token_versions = versions
        return cls(groups, dict(state["metrics"]))


def stamp_versions(groups: list[ScoredGroup], version: int) -> None:
    """Tag every sampled token of the groups the engine did not stamp with ``version`` (a trajectory's model tokens,
    not its tool tokens: those were not drawn by any weights)."""
    for g in groups:
        if g.token_versions is None:
            drawn = g.action_masks or [[1] * len(ids) for ids in g.response_ids]
            g.token_versions = [[version] * sum(mask) for mask in drawn]


def oldest_token_version(group: ScoredGroup, default: int) -> int:
    """The version of the oldest token of ``group`` (``default`` for a group without tagged tokens)."""
    return min((v for versions in group.token_versions or [] for v in versions), default=default)


def sample_lag(versions: list[int], actor_version: int) -> int:
    """A sample's lag: versions between the actor's and its oldest token's (0 for a sample without tokens)."""
    return actor_version - min(versions, default=actor_version)


def sample_lags(batch: ProducedBatch, actor_version: int) -> list[int]:
    """Each sample's lag, group by group, sample by sample."""
    return [sample_lag(versions, actor_version) for group in batch.token_versions for versions in group]


def staleness_metrics(batch: ProducedBatch, actor_version: int) -> dict[str, float]:
    """``async/staleness/*``: per-sample lag mean, max and histogram, per-token mean, and the fraction of samples
    whose tokens span several versions (partial rollouts)."""
    lags = sample_lags(batch, actor_version)
    token_lags = [actor_version - v for group in batch.token_versions for versions in group for v in versions]
    partial = [len(set(versions)) > 1 for group in batch.token_versions for versions in group]
    metrics = {
        "async/staleness/mean": sum(lags) / len(lags) if lags else 0.0,
        "async/staleness/max": float(max(lags, default=0)),
        "async/staleness/token_mean": sum(token_lags) / len(token_lags) if token_lags else 0.0,
        "async/partial_fraction": sum(partial) / len(partial) if partial else 0.0,
    }
    for lag, count in sorted(Counter(lags).items()):
        metrics[f"async/staleness/samples_lag_{lag}"] = float(count)
    return metrics
