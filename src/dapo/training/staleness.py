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
    """A step's training batch as the rollout side handed it over: the kept groups, the generation metrics, and per
    sample (group by group, sample by sample) the weight version of each token."""

    groups: list[ScoredGroup]
    metrics: dict[str, float]
    token_versions: list[list[list[int]]] = field(default_factory=list)
    # perf_counter intervals the producer worked on this batch (async/overlap_s); not saved: a resumed run's clock
    # differs, and a batch produced before the resume overlapped nothing of this process's training.
    busy: list[tuple[float, float]] = field(default_factory=list, compare=False)

    @classmethod
    def of_version(cls, groups: list[ScoredGroup], metrics: dict[str, float], version: int,
                   busy: list[tuple[float, float]] | None = None) -> ProducedBatch:
        """Every token of every sample drawn under ``version``."""
        return cls(groups, metrics, [[[version] * len(ids) for ids in g.response_ids] for g in groups], busy or [])

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_state() for g in self.groups], "metrics": dict(self.metrics),
                "token_versions": self.token_versions}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ProducedBatch:
        return cls([ScoredGroup.from_state(g) for g in state["groups"]], dict(state["metrics"]),
                   state["token_versions"])


def sample_lags(batch: ProducedBatch, actor_version: int) -> list[int]:
    """Each sample's lag: versions between the actor's and the oldest token's (0 for a sample without tokens)."""
    return [actor_version - min(versions, default=actor_version)
            for group in batch.token_versions for versions in group]


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
