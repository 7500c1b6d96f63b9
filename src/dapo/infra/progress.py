"""Live training status: step/total, reward, accuracy, entropy, response length, s/step and time left.

On a terminal it is a rich progress bar that redraws in place (other prints scroll above it). When
stdout is not a TTY (CI logs, ``nohup``, a pipe) a live bar would spam control codes, so it prints one
plain line per step instead. ``enabled=False`` turns the status off and keeps the notes; ``silent=True`` turns both
off (a data-parallel rank other than 0: the run's output is rank 0's).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO

__all__ = ["STATUS_METRICS", "TrainingProgress", "format_duration"]

# (label shown, metric key, format spec)
STATUS_METRICS: tuple[tuple[str, str, str], ...] = (
    ("reward", "critic/score/mean", ".3f"),
    ("acc", "acc/mean", ".3f"),
    ("entropy", "actor/entropy", ".3f"),
    ("resp_len", "response_length/mean", ".1f"),
)


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` for a duration in seconds (rounded to whole seconds)."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _format_metric(value: Any, spec: str) -> str:
    if value is None:
        return "nan"
    number = float(value)
    return format(number, spec) if math.isfinite(number) else "nan"


class TrainingProgress:
    """Context manager that shows training progress; call :meth:`update` after each step.

    ``initial_step`` is the step a resumed run starts from, so the bar shows the true position and
    the time estimate uses only the steps timed in this process. Seconds per step is the mean over
    the steps done since entering; time left is that mean times the remaining steps.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        enabled: bool = True,
        initial_step: int = 0,
        file: TextIO | None = None,
        silent: bool = False,
    ) -> None:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"TrainingProgress: total_steps must be an int >= 1, got {total_steps!r}")
        if not 0 <= initial_step <= total_steps:
            raise ValueError(f"TrainingProgress: initial_step must be in [0, {total_steps}], got {initial_step!r}")
        self.total_steps = total_steps
        self.enabled = enabled and not silent
        self.silent = silent
        self.initial_step = initial_step
        self._file = file
        self._out: TextIO = sys.stdout
        self._mode: str | None = None  # "off" | "live" | "plain" while entered
        self._start = 0.0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> TrainingProgress:
        out = self._file if self._file is not None else sys.stdout
        self._start = time.monotonic()
        if not self.enabled:
            self._mode = "off"
        elif out.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn
            from rich.table import Column

            self._mode = "live"
            self._progress = Progress(
                TextColumn("[bold]step {task.completed:.0f}/{task.total:.0f}", table_column=Column(no_wrap=True)),
                BarColumn(bar_width=20),
                # the metrics wrap onto a second line on narrow terminals instead of being cut off
                TextColumn("{task.fields[status]}", table_column=Column(ratio=1, overflow="fold")),
                console=Console(file=out),
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total_steps, completed=self.initial_step, status="waiting for the first step"
            )
        else:
            self._mode = "plain"
        self._out = out
        return self

    def status_text(self, step: int, metrics: Mapping[str, Any]) -> str:
        """The metric and timing part of the status, e.g. ``reward 0.250 | ... | 1.5 s/step | ETA 0:02:30``."""
        parts = [
            f"{label} {_format_metric(metrics[key], spec)}" for label, key, spec in STATUS_METRICS if key in metrics
        ]
        done = step - self.initial_step
        if done > 0:
            per_step = (time.monotonic() - self._start) / done
            parts.append(f"{per_step:.2f} s/step")
            parts.append(f"ETA {format_duration(per_step * max(0, self.total_steps - step))}")
        return " | ".join(parts)

    def note(self, message: str) -> None:
        """Print a message line: above the live bar while one is shown, plainly otherwise (also outside ``with``).

        Messages are shown even when the status display is disabled; they are the run's one output channel (only
        ``silent`` drops them).
        """
        if self.silent:
            return
        if self._mode == "live":
            self._progress.console.print(message, highlight=False, markup=False)
        else:
            print(message, file=self._file if self._file is not None else sys.stdout, flush=True)

    def phase(self, text: str) -> None:
        """Show what the run does before its first step (step-0 validation, say), so a long wait is not silent."""
        if self._mode == "live":
            self._progress.update(self._task, status=text)
        elif self._mode == "plain":
            print(text, file=self._out, flush=True)

    def start_steps(self) -> None:
        """Start the clock of s/step and the ETA now, just before the first step: the time spent before it (a
        step-0 validation, the engine's warm-up) is no step's, and counted in it made the first ETA several times
        too long."""
        self._start = time.monotonic()

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Show that ``step`` (1-based count of finished steps) is done, with its metrics."""
        if self._mode is None:
            raise RuntimeError("TrainingProgress.update called outside its `with` block")
        if self._mode == "off":
            return
        status = self.status_text(step, metrics)
        if self._mode == "live":
            self._progress.update(self._task, completed=step, status=status)
        else:
            line = f"step {step}/{self.total_steps}" + (f" | {status}" if status else "")
            print(line, file=self._out, flush=True)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._mode = None
