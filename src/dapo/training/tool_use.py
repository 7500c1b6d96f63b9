"""Tool use in training: the multi-turn rollout that ``rollout.multi_turn`` asks for, and its ``tool/*`` metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dapo.config import DapoConfig
from dapo.reward.scored_groups import ScoredGroup
from dapo.rollout.base import RolloutEngine
from dapo.rollout.multi_turn import MultiTurnParams, MultiTurnRollout, ToolCallFormat
from dapo.tools.sandbox import TOOL_CATEGORIES, PythonSandbox, SandboxLimits, SandboxUnavailableError
from dapo.training.errors import TrainingError


def with_tool_rollout(engine: RolloutEngine, cfg: DapoConfig, tokenizer) -> RolloutEngine:
    """``engine`` itself, or with ``rollout.multi_turn.enable`` the multi-turn rollout over it with a sandboxed Python
    interpreter (its trajectory budget is ``data.max_response_length``, model and tool tokens together)."""
    mt = cfg.rollout.multi_turn
    if not mt.enable:
        return engine
    box = mt.sandbox
    try:
        sandbox = PythonSandbox(SandboxLimits(wall_time_s=box.wall_time_s, cpu_time_s=box.cpu_time_s,
                                              memory_bytes=box.memory_mb * 2**20,
                                              max_output_bytes=box.max_output_bytes,
                                              max_processes=box.max_processes), mode=box.mode)
    except SandboxUnavailableError as exc:
        engine.close()
        raise TrainingError(f"rollout.multi_turn.sandbox.mode={box.mode}: {exc}") from None
    params = MultiTurnParams(
        max_assistant_turns=mt.max_assistant_turns, max_response_length=cfg.data.max_response_length,
        max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side, max_parallel_calls=mt.max_parallel_calls,
        call_format=ToolCallFormat(start=mt.tool_call_start, end=mt.tool_call_end,
                                    response_template=mt.tool_response_template))
    return MultiTurnRollout(engine, tokenizer, sandbox, params)


def tool_metrics(groups: Sequence[ScoredGroup]) -> dict[str, float]:
    """``tool/*`` of the generated groups (empty for single-turn rollouts): calls and turns per sample, the share of
    samples that called the tool, each result category's count, and accuracy with and without a call."""
    per_sample = [(cats, acc) for g in groups if g.tool_categories is not None
                  for cats, acc in zip(g.tool_categories, g.acc)]
    if not per_sample:
        return {}
    n = len(per_sample)
    calls = Counter(c for cats, _ in per_sample for c in cats)
    total = sum(calls.values())
    used = [acc for cats, acc in per_sample if cats]
    unused = [acc for cats, acc in per_sample if not cats]
    metrics = {
        "tool/calls_per_sample": total / n,
        "tool/turns_per_sample": sum(len(cats) + 1 for cats, _ in per_sample) / n,
        "tool/samples_with_call": len(used) / n,
        "tool/calls": float(total),
        "tool/errors": float(total - calls["ok"]),
        "tool/timeouts": float(calls["timeout"]),
        **{f"tool/result/{c}": float(calls[c]) for c in TOOL_CATEGORIES},
    }
    if used:
        metrics["tool/acc_with_call"] = sum(used) / len(used)
    if unused:
        metrics["tool/acc_without_call"] = sum(unused) / len(unused)
    return metrics
