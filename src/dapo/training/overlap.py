"""How long two sides of an asynchronous step were busy at the same time (``async/overlap_s``).

Each side records the perf_counter intervals it worked in (the trainer's update, the producer's generation); the
overlap is the measure of the intersection of the two unions, so a serial run (one side always waiting on the other)
reads 0, not min(train_s, produce_s), which is non-zero whenever both sides did any work at all.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]

__all__ = ["Interval", "busy_overlap", "busy_time"]


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time (empty or reversed ones dropped)."""
    merged: list[list[float]] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def busy_time(intervals: Iterable[Interval]) -> float:
    """Seconds covered by at least one interval (overlapping ones counted once)."""
    return sum(e - s for s, e in _union(intervals))


def busy_overlap(intervals_a: Iterable[Interval], intervals_b: Iterable[Interval]) -> float:
    """Seconds in which both sides were busy: |union(a) ∩ union(b)|, 0 when they never worked at once."""
    a, b = _union(intervals_a), _union(intervals_b)
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):  # two-pointer sweep over the sorted, disjoint unions
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return total
