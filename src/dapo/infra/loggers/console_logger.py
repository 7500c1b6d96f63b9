"""One line per step on the console: ``step 4 | acc/mean=0.1235 | n=3 | bad=nan``."""

from __future__ import annotations

import sys
from typing import ClassVar

from dapo.infra.loggers.base import RunContext, Values


class ConsoleLogger:
    name: ClassVar[str] = "console"

    def __init__(self, context: RunContext) -> None:
        self._file = context.console_file

    def log(self, values: Values, step: int) -> None:
        print(format_console(step, values), file=self._file or sys.stdout, flush=True)

    def close(self) -> None:
        pass  # the stream is the caller's


def format_console(step: int, values: Values) -> str:
    parts = [f"step {step}"]
    for key, value in values.items():
        parts.append(f"{key}={'nan' if value is None else (value if isinstance(value, int) else f'{value:.4g}')}")
    return " | ".join(parts)
