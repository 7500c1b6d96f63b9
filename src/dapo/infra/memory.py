"""Peak resident memory per phase of a step, from the kernel's own high-water mark.

Linux keeps the peak RSS of a process (``VmHWM`` in ``/proc/self/status``, also what ``getrusage`` reports) and lets
the process reset it to the current RSS by writing ``5`` to ``/proc/self/clear_refs``. Resetting at the start of a
phase and reading at its end gives that phase's true peak, not just a monotone process maximum: the figure that says
whether generation, the old-log-prob pass or the update is what needs the memory. Because the reset also clears what
``getrusage`` reports, the peak of the whole run is kept here (``run_peak_bytes``). Where the reset is not possible
(not Linux, no procfs), phases report the process peak so far, which is still an upper bound.

On CUDA the allocator's peak statistics are reset and read the same way (allocated and reserved bytes).
"""

from __future__ import annotations

import resource

import torch

__all__ = ["PeakMemory"]


def _read_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakMemory:
    """The process's peak RSS (and CUDA peaks) between :meth:`reset` and :meth:`read`, and the run's overall peak."""

    def __init__(self) -> None:
        self.run_peak_bytes = 0
        self._can_reset = True

    def read(self) -> dict[str, int]:
        """Peaks since the last reset: ``rss`` bytes, and ``cuda_allocated`` / ``cuda_reserved`` on CUDA."""
        rss = _read_hwm_bytes()
        if rss is None:  # no procfs: getrusage's maximum (KiB on Linux, bytes on macOS; Linux is what runs here)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.run_peak_bytes = max(self.run_peak_bytes, rss)
        out = {"rss": rss}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_allocated"] = torch.cuda.max_memory_allocated()
            out["cuda_reserved"] = torch.cuda.max_memory_reserved()
        return out

    def reset(self) -> None:
        """Start a new measuring window (the run's peak so far is kept)."""
        self.read()
        if self._can_reset:
            try:
                with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                    f.write("5")
            except OSError:
                self._can_reset = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
