"""What a metric sink is to the Tracker: built from the run's context, fed each step's cleaned values, closed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TextIO

# A step's metrics as the Tracker passes them on: ints stay ints, other numbers are floats, non-finite values None.
Values = Mapping[str, "int | float | None"]


@dataclass(frozen=True)
class RunContext:
    """What a sink may need of the run: where it lives, its names, its config (recorded by TensorBoard and W&B),
    W&B's mode (None: W&B's own, or WANDB_MODE) and the console's stream (None: stdout)."""

    run_dir: Path
    project: str
    experiment: str
    config: Mapping[str, Any]
    wandb_mode: str | None = None
    console_file: TextIO | None = None


class MetricLogger(Protocol):
    """One backend. ``__init__(context)`` opens it (a failure raises; the Tracker closes the ones already open);
    ``log`` records one step; ``close`` flushes and releases it (called once)."""

    name: ClassVar[str]

    def __init__(self, context: RunContext) -> None: ...

    def log(self, values: Values, step: int) -> None: ...

    def close(self) -> None: ...
