"""The multi-turn rollout that ``rollout.multi_turn`` describes, over any engine: training and ``dapo eval`` build
it here, so both run the same loop with the same tools (dapo.tools.registry: the config names them)."""

from __future__ import annotations

from dapo.config.schema import MultiTurnConfig
from dapo.rollout.base import RolloutEngine
from dapo.rollout.multi_turn import MultiTurnParams, MultiTurnRollout
from dapo.tools.registry import build_tools
from dapo.tools.tool import ToolUnavailableError
from dapo.tools.toolbox import Toolbox

__all__ = ["ToolUnavailableError", "tool_rollout", "with_tool_rollout"]


def tool_rollout(engine: RolloutEngine, tokenizer, mt: MultiTurnConfig, max_response_length: int) -> MultiTurnRollout:
    """The multi-turn rollout over ``engine`` with the tools ``mt.tools`` names (``enable`` is not read); its
    trajectory budget is ``max_response_length``, model and tool tokens together. Raises ToolUnavailableError, naming
    the key, when a tool cannot run on this machine (the caller still owns ``engine``)."""
    params = MultiTurnParams(
        max_assistant_turns=mt.max_assistant_turns,
        max_response_length=max_response_length,
        max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side,
        max_parallel_calls=mt.max_parallel_calls,
    )
    return MultiTurnRollout(engine, tokenizer, Toolbox(build_tools(mt)), params)


def with_tool_rollout(engine: RolloutEngine, tokenizer, mt: MultiTurnConfig, max_response_length: int) -> RolloutEngine:
    """``engine`` itself, or with ``mt.enable`` the multi-turn rollout over it. When a tool cannot run here the
    engine is closed (nothing else will) and ToolUnavailableError raised."""
    if not mt.enable:
        return engine
    try:
        return tool_rollout(engine, tokenizer, mt, max_response_length)
    except ToolUnavailableError:
        engine.close()
        raise
