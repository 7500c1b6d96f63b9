"""Tool use in training: the multi-turn rollout that ``rollout.multi_turn`` asks for, and its ``tool/*`` metrics."""

from __future__ import annotations

from collections.abc import Sequence

from dapo.config import DapoConfig
from dapo.config.schema import MultiTurnConfig
from dapo.reward.scored_groups import ScoredGroup
from dapo.rollout.base import RolloutEngine
from dapo.rollout.multi_turn import MultiTurnParams, MultiTurnRollout, ToolCallFormat
from dapo.tools.metrics import tool_use_metrics
from dapo.tools.sandbox import PythonSandbox, SandboxLimits, SandboxUnavailableError
from dapo.training.errors import TrainingError


def with_tool_rollout(engine: RolloutEngine, cfg: DapoConfig, tokenizer) -> RolloutEngine:
    """``engine`` itself, or with ``rollout.multi_turn.enable`` the multi-turn rollout over it with a sandboxed Python
    interpreter (its trajectory budget is ``data.max_response_length``, model and tool tokens together)."""
    mt = cfg.rollout.multi_turn
    if not mt.enable:
        return engine
    try:
        return tool_rollout(engine, tokenizer, mt, cfg.data.max_response_length)
    except SandboxUnavailableError as exc:
        engine.close()
        raise TrainingError(f"rollout.multi_turn.sandbox.mode={mt.sandbox.mode}: {exc}") from None


def tool_rollout(engine: RolloutEngine, tokenizer, mt: MultiTurnConfig, max_response_length: int) -> MultiTurnRollout:
    """The multi-turn rollout over ``engine`` that ``mt`` describes (``enable`` is not read), with its sandbox;
    training and ``dapo eval`` build it here, so both run the same loop. Raises SandboxUnavailableError when the
    sandbox mode cannot run on this machine (the caller still owns ``engine``)."""
    box = mt.sandbox
    sandbox = PythonSandbox(SandboxLimits(wall_time_s=box.wall_time_s, cpu_time_s=box.cpu_time_s,
                                          memory_bytes=box.memory_mb * 2**20, max_output_bytes=box.max_output_bytes,
                                          max_processes=box.max_processes, max_files=box.max_files,
                                          cpu_cores=box.cpu_cores), mode=box.mode)
    params = MultiTurnParams(
        max_assistant_turns=mt.max_assistant_turns, max_response_length=max_response_length,
        max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side, max_parallel_calls=mt.max_parallel_calls,
        call_format=ToolCallFormat(start=mt.tool_call_start, end=mt.tool_call_end,
                                    response_template=mt.tool_response_template))
    return MultiTurnRollout(engine, tokenizer, sandbox, params)


def tool_metrics(groups: Sequence[ScoredGroup]) -> dict[str, float]:
    """``tool/*`` of the generated groups (empty for single-turn rollouts), :func:`dapo.tools.metrics.tool_use_metrics`
    over every sample of a multi-turn group."""
    return tool_use_metrics([sample for g in groups for sample in g.tool_use])
