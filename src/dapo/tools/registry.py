"""The tools, by the name ``rollout.multi_turn.tools`` gives them: the one list of tool names.

Adding a tool is one file (a class with ``name``, ``call_format``, ``run_many``, ``from_config``; dapo.tools.tool)
and one line here; docs/extending.md, "Add a tool". The config's list of accepted names
(``MultiTurnConfig.tools``) is checked against this registry by tests/tools/test_tool_registry.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dapo.tools.calculator import CalculatorTool
from dapo.tools.python_tool import PythonTool
from dapo.tools.tool import Tool

TOOLS: dict[str, type[Tool]] = {tool.name: tool for tool in (PythonTool, CalculatorTool)}
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)


def check_tool_names(names: Sequence[str], *, key: str = "rollout.multi_turn.tools") -> None:
    """Raise ``ValueError`` naming ``key`` and the known tools when a name in ``names`` is not registered."""
    unknown = [name for name in names if name not in TOOLS]
    if unknown:
        raise ValueError(f"{key}: unknown tool(s) {unknown}; choose from {list(TOOL_NAMES)}")


def build_tools(multi_turn: Any) -> list[Tool]:
    """The tools ``multi_turn.tools`` names, in that order, each configured from ``multi_turn``
    (a ``MultiTurnConfig``). Raises ``ToolUnavailableError`` when one cannot run here."""
    check_tool_names(multi_turn.tools)
    return [TOOLS[name].from_config(multi_turn) for name in multi_turn.tools]
