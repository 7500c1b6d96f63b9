"""How one tool call ended: what every tool returns, whatever it runs (a sandboxed interpreter, an in-process
evaluator), so the rollout, the ``tool/*`` metrics and the evaluation records read one shape."""

from __future__ import annotations

from dataclasses import dataclass

# How a call ended; "ok" is the only success. A `tool/result/<category>` metric counts each.
TOOL_CATEGORIES: tuple[str, ...] = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox")


@dataclass(frozen=True)
class ToolResult:
    """How one call ended.

    output: what the tool gives back to the model. The interpreter: stdout and stderr as the code wrote them
        (interleaved), decoded as UTF-8 (bad bytes replaced), at most ``max_output_bytes``; for a failure it ends with
        the reason (a traceback, or what the sandbox stopped). An in-process tool: its answer, or an error message.
    category: one of :data:`TOOL_CATEGORIES`.
    exit_code: the process's status (negative: the signal that ended it), None when no process ran (it never
        started, or the tool runs in-process).
    wall_s: seconds from start to end (including the sandbox's start-up).
    """

    output: str
    category: str
    exit_code: int | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.category == "ok"
