"""Per-phase peak memory: a phase that allocates shows its own peak, a later small phase does not inherit it, an
outer phase covers its inner ones, and the run's peak survives the resets."""

from __future__ import annotations

import sys

import pytest

from dapo.infra.memory import PeakMemory
from dapo.infra.timing import PhaseTimer

MB = 1024**2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the high-water-mark reset is Linux's clear_refs")
def test_each_phase_reports_its_own_peak_and_the_run_keeps_the_largest() -> None:
    memory = PeakMemory()
    timer = PhaseTimer(memory=memory)
    with timer("step"):
        with timer("big"):
            block = bytearray(400 * MB)
            block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved
            del block
        with timer("small"):
            small = bytearray(1 * MB)
            del small
    peaks = {phase: p["rss"] / MB for phase, p in timer.peak_bytes.items()}
    assert peaks["big"] - peaks["small"] > 300  # the small phase does not inherit the big one's peak
    assert peaks["step"] >= peaks["big"]
    metrics = timer.metrics()
    assert metrics["perf/max_memory_rss_gb"] == pytest.approx(peaks["step"] / 1024)
    assert metrics["perf/max_memory_rss_gb/small"] == pytest.approx(peaks["small"] / 1024)
    assert memory.run_peak_bytes / MB >= peaks["big"]
    assert set(timer.seconds) == {"step", "big", "small"}


def test_without_memory_the_timer_reports_seconds_only() -> None:
    timer = PhaseTimer("gen")
    with timer("update"):
        pass
    assert set(timer.metrics()) == {"timing_s/gen", "timing_s/update"}
