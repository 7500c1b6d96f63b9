"""Tool use in training: the run's multi-turn rollout (built in dapo.rollout.tool_rollout, which ``dapo eval``
shares) with training's error, and the ``tool/*`` metrics of a step."""

from __future__ import annotations

from collections.abc import Sequence

from dapo.config import DapoConfig
from dapo.reward.scored_groups import ScoredGroup
from dapo.rollout.base import RolloutEngine
from dapo.rollout.tool_rollout import ToolUnavailableError
from dapo.rollout.tool_rollout import with_tool_rollout as rollout_with_tools
from dapo.tools.metrics import tool_use_metrics
from dapo.training.errors import TrainingError


def with_tool_rollout(engine: RolloutEngine, cfg: DapoConfig, tokenizer) -> RolloutEngine:
    """:func:`dapo.rollout.tool_rollout.with_tool_rollout` for the run's config; a tool that cannot run here stops
    the run as a TrainingError naming the key (the engine is closed)."""
    try:
        return rollout_with_tools(engine, tokenizer, cfg.rollout.multi_turn, cfg.data.max_response_length)
    except ToolUnavailableError as exc:
        raise TrainingError(str(exc)) from None


def tool_metrics(groups: Sequence[ScoredGroup]) -> dict[str, float]:
    """``tool/*`` of the generated groups (empty for single-turn rollouts), :func:`dapo.tools.metrics.tool_use_metrics`
    over every sample of a multi-turn group."""
    return tool_use_metrics([sample for g in groups for sample in g.tool_use])
