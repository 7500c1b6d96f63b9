"""What a tool is to the multi-turn rollout: a name (the config's), a call format (how its call is recognised in
the model's text and its result shown), and a way to run calls. One class per tool, one file each
(dapo.tools.python_tool, dapo.tools.calculator), listed in dapo.tools.registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from dapo.tools.call_format import ToolCallFormat
from dapo.tools.result import ToolResult


class ToolUnavailableError(RuntimeError):
    """A configured tool cannot run on this machine; the message names the config key and what to change."""


class Tool(Protocol):
    """A tool the model can call.

    name: its name in ``rollout.multi_turn.tools``.
    call_format: how its call looks in the model's text and how its result is shown.
    run_many: the calls' results in input order; never raises because of what a call holds (a bad call is a
        result with a failure category, which the model reads).
    from_config: the tool as ``rollout.multi_turn`` (a ``MultiTurnConfig``; typed loosely because config sits on
        this layer's floor) describes it; raises :class:`ToolUnavailableError` when it cannot run here.
    """

    name: ClassVar[str]
    call_format: ToolCallFormat

    def run_many(self, codes: Sequence[str], max_workers: int = ...) -> list[ToolResult]: ...

    @classmethod
    def from_config(cls, multi_turn: Any) -> "Tool": ...
