"""The DAPO paper's training-monitoring panels, drawn from one or more runs' ``metrics.jsonl``.

Panels (one subplot each, x = training step): the paper's response length (tokens), reward score, generation
entropy (nats), mean token probability and validation accuracy, plus the policy's own learning curve before the
Dynamic Sampling filter (``rollout/acc/mean``, every generated response) and the training accuracy. Panels computed on
the training batch, i.e. on the groups Dynamic Sampling kept, say "(kept groups)" in their title: with the filter on,
their accuracy is pulled towards 0.5 by construction. Accuracy axes are fixed to [0, 1]. ``smooth`` (an EMA weight in
[0, 1)) draws a smoothed line over the faint raw one (validation points are never smoothed). ``metrics`` picks the
panels by name (``PANEL_NAMES``) or by any logged metric key. Validation accuracies with different k
(``val/acc/mean@k``) are never drawn on one axis: each k gets its own panel.

Several runs are overlaid with one colour each and a shared legend, which is how ablations are compared. A metric
that no run logged gives an empty panel saying "no data". Drawing uses matplotlib's Agg canvas directly (no pyplot,
no GUI, no global backend switch); the PNG is written atomically, and a failed write is a ``FileOperationError``
naming the file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dapo.infra.atomic import FileOperationError, atomic_write
from dapo.infra.tracking import read_metrics, val_acc_keys

__all__ = ["PANELS", "PANEL_NAMES", "Panel", "make_figure", "plot_runs"]


@dataclass(frozen=True)
class Panel:
    name: str  # what --metrics calls it
    title: str
    key: str  # metric key; "val/acc/mean@*" = one panel per k
    ylabel: str
    accuracy: bool = False  # y axis fixed to [0, 1]
    when_logged: bool = False  # among the default panels only when some run logged its key (tool use)


PANELS: tuple[Panel, ...] = (
    Panel("response_length", "response length (kept groups)", "response_length/mean", "tokens"),
    Panel("score", "reward score (kept groups)", "critic/score/mean", "critic/score/mean (+1 / -1)"),
    Panel("entropy", "generation entropy (kept groups)", "actor/entropy", "nats per token"),
    Panel("mean_prob", "mean probability (kept groups)", "actor/mean_prob", "actor/mean_prob", accuracy=True),
    Panel("val_acc", "validation accuracy", "val/acc/mean@*", "val/acc/mean@k", accuracy=True),
    Panel(
        "rollout_acc",
        "rollout accuracy (all groups, before filtering)",
        "rollout/acc/mean",
        "rollout/acc/mean",
        accuracy=True,
    ),
    Panel("train_acc", "training accuracy (kept groups)", "acc/mean", "acc/mean", accuracy=True),
    # model FLOPs / (seconds x peak) per phase (dapo.training.perf_metrics); a CPU's peak is a measured matmul rate
    Panel("mfu_actor", "actor MFU (update)", "perf/mfu/actor", "perf/mfu/actor"),
    Panel("mfu_rollout", "rollout MFU (generation)", "perf/mfu/rollout", "perf/mfu/rollout"),
    # multi-turn runs (rollout.multi_turn): how often the policy calls the interpreter, in training and held out
    Panel(
        "tool_share",
        "samples that called the tool (rollout)",
        "tool/samples_with_call",
        "tool/samples_with_call",
        accuracy=True,
        when_logged=True,
    ),
    Panel(
        "val_tool_share",
        "samples that called the tool (validation)",
        "val/tool/samples_with_call",
        "val/tool/samples_with_call",
        accuracy=True,
        when_logged=True,
    ),
    Panel(
        "tool_calls",
        "tool calls per sample (rollout)",
        "tool/calls_per_sample",
        "tool/calls_per_sample",
        when_logged=True,
    ),
)
PANEL_NAMES: tuple[str, ...] = tuple(p.name for p in PANELS)
_VAL = "val/acc/mean@*"
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


def _ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard-style exponential moving average, debiased so the first points are not pulled towards 0."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i))
    return out


def _default_labels(run_dirs: Sequence[Path]) -> list[str]:
    names = [Path(d).name or str(d) for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [str(d) for d in run_dirs]


def _resolve_panels(metrics: Sequence[str] | None, runs: list[list[dict[str, Any]]]) -> list[Panel]:
    """The chosen panels, with the validation panel split into one panel per k (never two k on one axis)."""
    by_name = {p.name: p for p in PANELS}
    chosen: list[Panel] = []
    logged = {key for records in runs for record in records for key in record}
    defaults = [p.name for p in PANELS if not p.when_logged or p.key in logged]
    for item in metrics or defaults:
        if item in by_name:
            chosen.append(by_name[item])
        elif "/" in item:
            chosen.append(
                Panel(item, item, item, item, accuracy=item.split("/")[-1].startswith("acc") or "/acc/" in item)
            )
        else:
            raise ValueError(
                f"unknown panel '{item}'; choose from {', '.join(PANEL_NAMES)} or give a metric key "
                "such as critic/advantages/mean"
            )
    out: list[Panel] = []
    for panel in chosen:
        if panel.key != _VAL:
            out.append(panel)
            continue
        ks = val_acc_keys([record for records in runs for record in records])
        if len(ks) <= 1:
            out.append(Panel(panel.name, panel.title, ks[0] if ks else _VAL, ks[0] if ks else panel.ylabel, True))
        else:
            out += [Panel(panel.name, f"validation accuracy ({k.rsplit('/', 1)[-1]})", k, k, True) for k in ks]
    return out


# The figure's margins, in inches (see make_figure).
_MARGIN_LEFT_IN, _MARGIN_RIGHT_IN, _MARGIN_BOTTOM_IN, _MARGIN_TOP_IN = 0.75, 0.2, 0.55, 0.75


def make_figure(
    run_dirs: Sequence[Path],
    *,
    labels: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    smooth: float = 0.0,
) -> Figure:
    """Build the monitoring figure (3 panels a row) for ``run_dirs``; each run is one colour."""
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("make_figure: give at least one run directory")
    if labels is None:
        labels = _default_labels(run_dirs)
    elif len(labels) != len(run_dirs):
        raise ValueError(f"make_figure: {len(labels)} labels for {len(run_dirs)} run directories; give one per run")
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"make_figure: smooth is an EMA weight in [0, 1), got {smooth}")
    runs = [read_metrics(d) for d in run_dirs]
    panels = _resolve_panels(metrics, runs)

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    width, height = 5 * ncols, 4.25 * nrows
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    # Fixed margins in inches, not layout="constrained": the constrained solver measured every tick label of the 18
    # panels and was half of the whole draw (3.1 of 6.5 s, profiled); these fit the panels' titles, labels and the
    # legend row above them.
    axes = list(
        fig.subplots(
            nrows,
            ncols,
            squeeze=False,
            gridspec_kw=dict(
                left=_MARGIN_LEFT_IN / width,
                right=1 - _MARGIN_RIGHT_IN / width,
                bottom=_MARGIN_BOTTOM_IN / height,
                top=1 - _MARGIN_TOP_IN / height,
                wspace=0.32,
                hspace=0.42,
            ),
        ).ravel()
    )
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    legend_handles: dict[str, Any] = {}

    for ax, panel in zip(axes, panels):
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        is_val = panel.key.startswith("val/")
        drawn = 0
        for records, label, color in zip(runs, labels, colors, strict=True):
            series = _series(records, panel.key)
            if series is None:
                continue
            # validation runs every few steps: mark its points; a lone point needs a marker to show
            marker = "o" if is_val or len(series.steps) == 1 else None
            if smooth > 0 and not is_val:
                ax.plot(series.steps, series.values, color=color, alpha=0.25, linewidth=1)
                values = _ema(series.values, smooth)
            else:
                values = series.values
            (line,) = ax.plot(
                series.steps, values, color=color, linestyle=_LINE_STYLES[0], marker=marker, markersize=4, label=label
            )
            legend_handles.setdefault(label, line)
            drawn += 1
        if drawn == 0:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=14)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.grid(True, alpha=0.3)
        if panel.accuracy:
            ax.set_ylim(0.0, 1.0)

    if legend_handles:
        fig.legend(
            list(legend_handles.values()),
            list(legend_handles),
            loc="upper center",
            bbox_to_anchor=(0.5, 1.0),
            frameon=False,
            ncols=min(6, len(legend_handles)),
        )
    return fig


def plot_runs(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    labels: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    smooth: float = 0.0,
) -> Path:
    """Draw the monitoring panels for ``run_dirs`` into the PNG ``out`` (written atomically); return ``out``."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"plot_runs: output must be a .png file, got {out}")
    fig = make_figure(run_dirs, labels=labels, metrics=metrics, smooth=smooth)
    try:
        atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=100))
    except OSError as exc:  # an unwritable folder, a full disk: one line, and no partial PNG is left
        raise FileOperationError(exc, f"writing the plot {out}") from exc
    return out
