"""The tools of one rollout, and which of them a turn called: the call that closes first in the turn's text picks
its tool (by call format, never by name), so two tools with distinct formats share one multi-turn loop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dapo.tools.call_format import ToolCallFormat
from dapo.tools.result import ToolResult
from dapo.tools.tool import Tool


@dataclass(frozen=True)
class ToolCall:
    """A closed call found in a turn: which tool (its index in the toolbox), its code, and the text's length up to
    the call's end marker."""

    tool: int
    code: str
    end: int


class Toolbox:
    """The enabled tools, in the config's order (which breaks a tie between two calls closing at one place)."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        if not tools:
            raise ValueError("Toolbox needs at least one tool")
        self.tools = tuple(tools)

    @property
    def formats(self) -> tuple[ToolCallFormat, ...]:
        return tuple(tool.call_format for tool in self.tools)

    def first_closed_call(self, text: str) -> ToolCall | None:
        """The call in ``text`` whose end marker comes first, over every tool's format; None when none closed."""
        found = [ToolCall(k, *closed) for k, fmt in enumerate(self.formats) if (closed := fmt.closed_call(text))]
        return min(found, key=lambda call: call.end, default=None)

    def any_open(self, text: str) -> bool:
        """Whether ``text`` (a turn) has opened a call of any tool."""
        return any(fmt.is_open(text) for fmt in self.formats)

    def run(self, calls: Sequence[ToolCall], max_workers: int) -> list[ToolResult]:
        """Each call's result, in the order of ``calls``: one ``run_many`` per tool over its calls."""
        results: list[ToolResult | None] = [None] * len(calls)
        for k, tool in enumerate(self.tools):
            mine = [i for i, call in enumerate(calls) if call.tool == k]
            if mine:
                for i, result in zip(
                    mine, tool.run_many([calls[i].code for i in mine], max_workers=max_workers), strict=True
                ):
                    results[i] = result
        return results  # type: ignore[return-value] - every call names one of the tools
