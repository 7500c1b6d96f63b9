"""The DAPO paper's training-monitoring panels, drawn from one or more runs' ``metrics.jsonl``.

Panels (one subplot each, x = training step): response length, reward score, generation entropy,
mean token probability, validation accuracy and training accuracy - the training-dynamics curves
the paper monitors to judge the health of an RL run. Several runs are overlaid with one colour each and a shared
legend, which is how ablations are compared. A metric that no run logged gives an empty panel
saying "no data". Drawing uses matplotlib's Agg canvas directly (no pyplot, no GUI, no global
backend switch); the PNG is written atomically.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dapo.infra.atomic import atomic_write
from dapo.infra.tracking import read_metrics

__all__ = ["PANELS", "VAL_ACC_PATTERN", "make_figure", "plot_runs"]

# (panel title, metric key); the validation key is a pattern resolved per run.
PANELS: tuple[tuple[str, str], ...] = (
    ("response length", "response_length/mean"),
    ("reward score", "critic/score/mean"),
    ("generation entropy", "actor/entropy"),
    ("mean probability", "actor/mean_prob"),
    ("validation accuracy", "val/acc/mean@*"),
    ("training accuracy", "acc/mean"),
)
VAL_ACC_PATTERN = re.compile(r"^val/acc/mean@(\d+)$")
_LINE_STYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class _Series:
    steps: list[int]
    values: list[float]


def _series(records: list[dict[str, Any]], key: str) -> _Series | None:
    """Finite values of ``key`` by step (a repeated step keeps its last value); None when absent."""
    by_step: dict[int, float] = {}
    for record in records:
        value = record.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            by_step[record["step"]] = float(value)
    if not by_step:
        return None
    steps = sorted(by_step)
    return _Series(steps, [by_step[s] for s in steps])


def _val_keys(records: list[dict[str, Any]]) -> list[str]:
    """The ``val/acc/mean@k`` keys a run logged, ordered by k."""
    keys = {key for record in records for key in record if VAL_ACC_PATTERN.match(key)}
    return sorted(keys, key=lambda k: int(VAL_ACC_PATTERN.match(k).group(1)))  # type: ignore[union-attr]


def _default_labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [Path(d).name or str(d) for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [str(d) for d in run_dirs]


def make_figure(run_dirs: Sequence[Path], *, labels: Sequence[str] | None = None) -> Figure:
    """Build the monitoring figure (2 x 3 panels) for ``run_dirs``; each run is one colour."""
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("make_figure: give at least one run directory")
    if labels is None:
        labels = _default_labels(run_dirs)
    elif len(labels) != len(run_dirs):
        raise ValueError(f"make_figure: {len(labels)} labels for {len(run_dirs)} run directories; give one per run")
    runs = [read_metrics(d) for d in run_dirs]

    fig = Figure(figsize=(15, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3).ravel()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    legend_handles: dict[str, Any] = {}

    for ax, (title, key) in zip(axes, PANELS, strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
        drawn = 0
        for records, label, color in zip(runs, labels, colors, strict=True):
            keys = _val_keys(records) if key == "val/acc/mean@*" else [key]
            for index, metric in enumerate(keys):
                series = _series(records, metric)
                if series is None:
                    continue
                line_label = label if len(keys) == 1 else f"{label} ({metric.rsplit('/', 1)[-1]})"
                # validation runs every few steps: mark its points; a lone point needs a marker to show
                marker = "o" if key == "val/acc/mean@*" or len(series.steps) == 1 else None
                (line,) = ax.plot(
                    series.steps,
                    series.values,
                    color=color,
                    linestyle=_LINE_STYLES[index % len(_LINE_STYLES)],
                    marker=marker,
                    markersize=4,
                    label=line_label,
                )
                legend_handles.setdefault(label, line)
                drawn += 1
        if key == "val/acc/mean@*":
            found = sorted({m for records in runs for m in _val_keys(records)})
            ax.set_ylabel(", ".join(found) if found else "val/acc/mean@k")
            if any(len(_val_keys(records)) > 1 for records in runs):
                ax.legend(fontsize="small")
        else:
            ax.set_ylabel(key)
        if drawn == 0:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=14)
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            ax.grid(True, alpha=0.3)

    if legend_handles:
        fig.legend(
            list(legend_handles.values()),
            list(legend_handles),
            loc="outside upper center",
            ncols=min(6, len(legend_handles)),
        )
    return fig


def plot_runs(run_dirs: Sequence[Path], out: Path, *, labels: Sequence[str] | None = None) -> Path:
    """Draw the monitoring panels for ``run_dirs`` into the PNG ``out`` (written atomically); return ``out``."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"plot_runs: output must be a .png file, got {out}")
    fig = make_figure(run_dirs, labels=labels)
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=100))
    return out
