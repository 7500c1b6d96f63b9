"""The Python interpreter tool: the code of a call runs in :class:`~dapo.tools.sandbox.PythonSandbox` (bubblewrap
isolation, or the unsafe mode when named) and what it prints goes back to the model. Its call format and sandbox
are the ``rollout.multi_turn`` keys that configured the only tool before tools had names (``tool_call_start``,
``tool_call_end``, ``tool_response_template``, ``sandbox.*``), so configs written then run unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from dapo.tools.call_format import ToolCallFormat
from dapo.tools.result import ToolResult
from dapo.tools.sandbox import PythonSandbox, SandboxLimits, SandboxUnavailableError
from dapo.tools.tool import ToolUnavailableError


class PythonTool:
    name: ClassVar[str] = "python"

    def __init__(self, sandbox: PythonSandbox, call_format: ToolCallFormat = ToolCallFormat()) -> None:
        self.sandbox = sandbox
        self.call_format = call_format

    @classmethod
    def from_config(cls, multi_turn: Any) -> "PythonTool":
        box = multi_turn.sandbox
        limits = SandboxLimits(
            wall_time_s=box.wall_time_s,
            cpu_time_s=box.cpu_time_s,
            memory_bytes=box.memory_mb * 2**20,
            max_output_bytes=box.max_output_bytes,
            max_processes=box.max_processes,
            max_files=box.max_files,
            cpu_cores=box.cpu_cores,
        )
        try:
            sandbox = PythonSandbox(limits, mode=box.mode)
        except SandboxUnavailableError as exc:
            raise ToolUnavailableError(f"rollout.multi_turn.sandbox.mode={box.mode}: {exc}") from None
        return cls(
            sandbox,
            ToolCallFormat(
                start=multi_turn.tool_call_start,
                end=multi_turn.tool_call_end,
                response_template=multi_turn.tool_response_template,
            ),
        )

    def run_many(self, codes: Sequence[str], max_workers: int = 4) -> list[ToolResult]:
        return self.sandbox.run_many(codes, max_workers=max_workers)
