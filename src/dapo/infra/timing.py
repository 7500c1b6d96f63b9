"""Wall-clock time per phase of a step, through one small context manager."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator


class PhaseTimer:
    """``with timer("gen"): ...`` adds the block's seconds to ``timer.seconds["gen"]`` (phases may repeat)."""

    def __init__(self, *phases: str) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        for phase in phases:  # always reported, even when the phase did not run this step
            self.seconds[phase] = 0.0

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self, prefix: str = "timing_s/") -> dict[str, float]:
        return {f"{prefix}{phase}": value for phase, value in self.seconds.items()}
