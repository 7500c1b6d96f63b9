"""Summarise seeded ablation runs: a markdown table of mean ± std over seeds per config, and plots with seed bands.

    python scripts/summarize_ablation.py runs/ablation/*-s* --plots docs/img/ablation

Runs named ``<config>-s<seed>`` (as ``scripts/run_ablation.sh`` names them) are grouped by config. Writes
``<plots>.png`` (validation accuracy, entropy, response length, truncated share, and the shares of all-correct and
all-wrong groups per step, each a mean line with a ±1 std band over seeds) and ``<plots>-tokens.png`` (validation
accuracy against the response tokens generated so far: the cost axis of the paper's Fig. 6).
"""

from __future__ import annotations

import argparse
import math
import re
from collections import defaultdict
from pathlib import Path

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dapo.evaluation.statistics import (
    RunSummary,
    config_of_run,
    group_share_series,
    mean_std,
    seed_band,
    series,
    summarize_run,
    val_acc_key_of,
)
from dapo.infra.atomic import atomic_write
from dapo.infra.tracking import read_metrics

PANELS = (  # (metric key, title, accuracy-like y axis in [0, 1])
    ("val", "validation accuracy", True),
    ("actor/entropy", "generation entropy (kept groups), nats", False),
    ("response_length/mean", "response length (kept groups), tokens", False),
    ("response_length/clip_ratio", "truncated share (hit L_max)", True),
    ("share/all_correct", "all-correct groups / groups generated", True),
    ("share/all_wrong", "all-wrong groups / groups generated", True),
)


def _groups_per_round(run_dir: Path) -> int:
    data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
    return int(data.get("gen_batch_size") or data["train_batch_size"])


def _console(run_dir: Path) -> tuple[float | None, float | None]:
    """Wall seconds and peak RSS (MB) from the run's console log (``log-<run>.txt`` beside it), when present."""
    log = run_dir.parent / f"log-{run_dir.name}.txt"
    if not log.exists():
        return None, None
    text = log.read_text(errors="replace")
    wall = re.search(r"done: \d+ steps in (\d+) s", text)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return (float(wall[1]) if wall else None), (int(peak[1]) / 1024 if peak else None)


def _curve(records: list[dict], key: str, groups_per_round: int) -> list[tuple[float, float]]:
    if key == "val":
        val_key = val_acc_key_of(records)
        return series(records, val_key) if val_key else []
    if key.startswith("share/all_"):
        return group_share_series(records, key.removeprefix("share/all_"), groups_per_round)
    return series(records, key)


def _fmt(stat, spec: str = ".3f") -> str:
    return format(stat, spec) if stat.n else "n/a"


def table(configs: dict[str, list[tuple[RunSummary, float | None, float | None]]], threshold: float) -> str:
    lines = [
        f"| config | seeds | final val acc | best val acc | steps to val acc ≥ {threshold:g} (runs that reached it) | "
        "entropy first 5 → last 5 steps | clip fraction (mean) | response length (last 5) | truncated share (last 5) | "
        "all-correct / all-wrong groups | generated tokens | wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in configs.items():
        runs = [r for r, _, _ in rows]
        reached = [r.steps_to_threshold for r in runs if r.steps_to_threshold is not None]
        steps = f"{_fmt(mean_std(reached), '.1f')} ({len(reached)}/{len(runs)})" if reached else f"— (0/{len(runs)})"
        tokens = mean_std([r.generated_tokens / 1e3 if r.generated_tokens is not None else None for r in runs])
        lines.append(
            f"| {name} | {len(runs)} | {_fmt(mean_std([r.val_final for r in runs]))} | "
            f"{_fmt(mean_std([r.val_best for r in runs]))} | {steps} | "
            f"{_fmt(mean_std([r.entropy_first for r in runs]), '.4f')} → "
            f"{_fmt(mean_std([r.entropy_last for r in runs]), '.4f')} | "
            f"{_fmt(mean_std([r.clip_fraction for r in runs]), '.4f')} | "
            f"{_fmt(mean_std([r.length_last for r in runs]), '.1f')} | "
            f"{_fmt(mean_std([r.truncated_last for r in runs]), '.2f')} | "
            f"{_fmt(mean_std([r.all_correct_share for r in runs]), '.2f')} / "
            f"{_fmt(mean_std([r.all_wrong_share for r in runs]), '.2f')} | "
            f"{_fmt(tokens, '.0f')}k | {_fmt(mean_std([w for _, w, _ in rows]), '.0f')} s |"
        )
    return "\n".join(lines)


def _save(fig: Figure, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=100))
    print(f"plot: {out}")


def plot_bands(curves: dict[str, dict[str, list[list[tuple[float, float]]]]], out: Path) -> None:
    """One panel per PANELS entry; per config a mean line and a ±1 std band over its seeds."""
    fig = Figure(figsize=(15, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3).ravel()
    for ax, (key, title, accuracy) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        for i, (name, per_key) in enumerate(curves.items()):
            seeds = [c for c in per_key[key] if c]
            if not seeds:
                continue
            band = seed_band(seeds)
            marker = "o" if key == "val" else None
            ax.plot(band.x, band.mean, color=f"C{i}", marker=marker, markersize=3, label=f"{name} (n={band.n})")
            ax.fill_between(
                band.x,
                [m - s for m, s in zip(band.mean, band.std)],
                [m + s for m, s in zip(band.mean, band.std)],
                color=f"C{i}",
                alpha=0.18,
                linewidth=0,
            )
        ax.grid(True, alpha=0.3)
        if accuracy:
            ax.set_ylim(0.0, 1.0)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(3, len(labels)))
    _save(fig, out)


def plot_accuracy_against_tokens(curves: dict[str, dict[str, list[list[tuple[float, float]]]]], out: Path) -> None:
    """Validation accuracy against the response tokens generated so far (means over seeds, ±1 std both ways)."""
    fig = Figure(figsize=(7, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, (name, per_key) in enumerate(curves.items()):
        pairs = [(dict(v), dict(t)) for v, t in zip(per_key["val"], per_key["train/generated_tokens_total"]) if v]
        if not pairs:
            continue
        steps = sorted(set.intersection(*(set(v) for v, _ in pairs)))
        xs, ys, xerr, yerr = [], [], [], []
        for step in steps:
            acc = mean_std([v[step] for v, _ in pairs])
            tokens = mean_std([t.get(step, 0.0) / 1e3 for _, t in pairs])  # step 0 validates before any generation
            xs.append(tokens.mean), ys.append(acc.mean), xerr.append(tokens.std), yerr.append(acc.std)
        ax.errorbar(
            xs,
            ys,
            xerr=xerr,
            yerr=yerr,
            color=f"C{i}",
            marker="o",
            markersize=3,
            capsize=2,
            label=f"{name} (n={len(pairs)})",
        )
    ax.set_xlabel("response tokens generated (thousands)")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, <config>-s<seed>")
    parser.add_argument("--threshold", type=float, default=0.6, help="the accuracy of 'steps to reach'")
    parser.add_argument("--window", type=int, default=5, help="steps averaged for 'first' and 'last'")
    parser.add_argument("--out", type=Path, default=None, help="markdown table file (default: print only)")
    parser.add_argument("--plots", type=Path, default=None, help="plot path prefix: <prefix>.png, <prefix>-tokens.png")
    args = parser.parse_args()

    configs: dict[str, list] = defaultdict(list)
    curves: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run_dir in sorted(args.runs):
        if not run_dir.is_dir():  # a glob like runs/ablation/*-s* also matches the console logs beside the runs
            continue
        records = read_metrics(run_dir)
        if not records:
            print(f"skipping {run_dir}: no metrics")
            continue
        per_round = _groups_per_round(run_dir)
        name, _ = config_of_run(run_dir.name)
        wall, peak = _console(run_dir)
        configs[name].append(
            (
                summarize_run(records, threshold=args.threshold, groups_per_round=per_round, window=args.window),
                wall,
                peak,
            )
        )
        for key, _, _ in PANELS:
            curves[name][key].append(_curve(records, key, per_round))
        curves[name]["train/generated_tokens_total"].append(series(records, "train/generated_tokens_total"))
    text = table(configs, args.threshold)
    if args.out:
        atomic_write(args.out, text + "\n")
    print(text)
    if args.plots:
        plot_bands(curves, args.plots.with_name(args.plots.name + ".png"))
        plot_accuracy_against_tokens(curves, args.plots.with_name(args.plots.name + "-tokens.png"))
    if any(math.isnan(mean_std([r.val_final for r, _, _ in rows]).mean) for rows in configs.values()):
        print("note: some configs logged no validation accuracy")


if __name__ == "__main__":
    main()
