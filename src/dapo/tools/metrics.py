"""How a batch of samples used the tool: calls and turns per sample, the share that called it, each result category's
count, and accuracy with and without a call. One function for training (``tool/*``), validation (``val/tool/*``)
and ``dapo eval`` (a summary's ``tool/*`` entries)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dapo.tools.result import TOOL_CATEGORIES


def tool_use_metrics(samples: Sequence[tuple[Sequence[str], float]], prefix: str = "tool/") -> dict[str, float]:
    """``samples``: per sample, the result category of each tool call it made (in order) and its accuracy (0/1).

    Empty for no samples. Counts (``calls``, ``errors``, ``timeouts``, ``result/<category>``) are totals over the
    samples; ``*_per_sample`` and ``samples_with_call`` are means; ``acc_with_call`` / ``acc_without_call`` are there
    only when some sample did / did not call the tool."""
    if not samples:
        return {}
    n = len(samples)
    calls = Counter(c for cats, _ in samples for c in cats)
    unknown = set(calls) - set(TOOL_CATEGORIES)
    if unknown:
        raise ValueError(f"tool result categories {sorted(unknown)} are not among {TOOL_CATEGORIES}")
    total = sum(calls.values())
    used = [float(acc) for cats, acc in samples if cats]
    unused = [float(acc) for cats, acc in samples if not cats]
    metrics = {
        "calls_per_sample": total / n,
        "turns_per_sample": sum(len(cats) + 1 for cats, _ in samples) / n,
        "samples_with_call": len(used) / n,
        "calls": float(total),
        "errors": float(total - calls["ok"]),
        "timeouts": float(calls["timeout"]),
        **{f"result/{c}": float(calls[c]) for c in TOOL_CATEGORIES},
    }
    if used:
        metrics["acc_with_call"] = sum(used) / len(used)
    if unused:
        metrics["acc_without_call"] = sum(unused) / len(unused)
    return {prefix + name: value for name, value in metrics.items()}
