"""Wall-clock time (and, when asked, peak memory) per phase of a step, through one small context manager."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

from dapo.infra.memory import PeakMemory
from dapo.infra.profiling import StepProfiler

GB = 1024**3

# Metrics that measure this machine at this moment (phase times, throughput and MFU, memory, the asynchronous loops'
# overlap and idle times), not the run's state: two runs that train the same thing agree on every other key.
MEASURED_METRIC_PREFIXES = (
    "timing_s/",
    "perf/",
    "memory/",
    "async/overlap_s",
    "async/engine_idle_s",
    "async/trainer_idle_s",
    "async/produce_s",
)


def is_measured_metric(key: str) -> bool:
    """Whether a metric key is a measurement of the machine (``MEASURED_METRIC_PREFIXES``), not of the run."""
    return key.startswith(MEASURED_METRIC_PREFIXES)


class PhaseTimer:
    """``with timer("gen"): ...`` adds the block's seconds to ``timer.seconds["gen"]`` (phases may repeat or nest).

    With ``memory`` each phase also records its peak memory (``peak_bytes[phase][kind]``, kind ``rss`` and on CUDA
    ``cuda_allocated`` / ``cuda_reserved``). Phases nest ("step" holds "gen"): entering a phase closes the current
    measuring window into every open phase before resetting, so an outer phase's peak covers its inner ones. With
    ``profiler`` (a profiled step, ``trainer.profile_steps``) the phases it profiles run under ``torch.profiler``.
    """

    def __init__(self, *phases: str, memory: PeakMemory | None = None, profiler: StepProfiler | None = None) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        for phase in phases:  # always reported, even when the phase did not run this step
            self.seconds[phase] = 0.0
        self.memory = memory
        self.profiler = profiler
        self.peak_bytes: dict[str, dict[str, int]] = {}
        self._open: list[str] = []

    def _close_window(self) -> None:
        assert self.memory is not None
        window = self.memory.read()
        for phase in self._open:
            peaks = self.peak_bytes.setdefault(phase, {})
            for kind, value in window.items():
                peaks[kind] = max(peaks.get(kind, 0), value)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        # A profiler is entered before the clock starts and left after it stops: its start-up and its post-processing
        # (seconds for a long phase) stay out of the phase's time and memory; the recording itself cannot.
        profiled = self.profiler.phase(phase) if self.profiler is not None else contextlib.nullcontext()
        with profiled:
            if self.memory is not None:
                self._close_window()
                self._open.append(phase)
                self.memory.reset()
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[phase] += time.perf_counter() - start
                if self.memory is not None:
                    self._close_window()
                    self._open.remove(phase)
                    self.memory.reset()

    def metrics(self, prefix: str = "timing_s/") -> dict[str, float]:
        """Seconds per phase; with ``memory``, also ``perf/max_memory_rss_gb`` (the largest phase peak) and
        ``perf/max_memory_rss_gb/<phase>`` (and the CUDA ``perf/max_memory_{allocated,reserved}_gb`` likewise)."""
        out = {f"{prefix}{phase}": value for phase, value in self.seconds.items()}
        names = {
            "rss": "perf/max_memory_rss_gb",
            "cuda_allocated": "perf/max_memory_allocated_gb",
            "cuda_reserved": "perf/max_memory_reserved_gb",
        }
        for phase, peaks in self.peak_bytes.items():
            for kind, value in peaks.items():
                out[f"{names[kind]}/{phase}"] = value / GB
                out[names[kind]] = max(out.get(names[kind], 0.0), value / GB)
        return out
