"""Summarise ablation runs into a markdown table and an overlay plot (the paper's Table 1 progression, in miniature).

    python scripts/summarize_ablation.py runs/ablation-* --out docs/ablation.md --plot docs/img/ablation.png
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dapo.infra.plot import plot_runs
from dapo.infra.tracking import read_metrics


def _mean(records: list[dict], key: str, steps: slice) -> float:
    values = [r[key] for r in records if key in r and r[key] is not None][steps]
    return sum(values) / len(values) if values else float("nan")


def summarize(run_dir: Path) -> dict:
    records = read_metrics(run_dir)
    vals = [v for r in records for k, v in r.items() if k.startswith("val/acc/mean@") and v is not None]
    last_step = records[-1]["step"]
    wall = peak = None
    for log in run_dir.parent.glob("log-*.txt"):  # the console log of this run, written by run_ablation.sh
        text = log.read_text(errors="replace")
        if text.rstrip().count(f"/{run_dir.name}") or f"run dir {run_dir.name}" in text:
            if m := re.search(r"done: \d+ steps in (\d+) s", text):
                wall = int(m.group(1))
            if m := re.search(r"Maximum resident set size \(kbytes\): (\d+)", text):
                peak = int(m.group(1)) / 1024
    return {
        "run": run_dir.name,
        "val_first": vals[0], "val_last": vals[-1], "val_best": max(vals),
        "entropy_first5": _mean(records, "actor/entropy", slice(0, 5)),
        "entropy_last5": _mean(records, "actor/entropy", slice(-5, None)),
        "length_last5": _mean(records, "response_length/mean", slice(-5, None)),
        "truncated_first5": _mean(records, "response_length/clip_ratio", slice(0, 5)),
        "truncated_last5": _mean(records, "response_length/clip_ratio", slice(-5, None)),
        "kept_ratio": _mean(records, "train/kept_group_ratio", slice(None)),
        "gen_batches": _mean(records, "train/num_gen_batches", slice(None)),
        "wall_s": wall, "peak_mb": peak, "steps": last_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="markdown table file (default: print)")
    parser.add_argument("--plot", type=Path, default=None, help="overlay PNG of the monitoring panels")
    args = parser.parse_args()
    rows = [summarize(r) for r in sorted(args.runs)]
    lines = [
        "| run | val acc@8 first → last (best) | entropy first 5 → last 5 steps | response length (last 5) | "
        "truncated share first 5 → last 5 | kept-group ratio | gen rounds/step | wall time | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        wall = f"{r['wall_s']} s" if r["wall_s"] is not None else "?"
        peak = f"{r['peak_mb']:.0f} MB" if r["peak_mb"] is not None else "?"
        lines.append(
            f"| {r['run']} | {r['val_first']:.3f} → {r['val_last']:.3f} ({r['val_best']:.3f}) | "
            f"{r['entropy_first5']:.4f} → {r['entropy_last5']:.4f} | {r['length_last5']:.1f} | "
            f"{r['truncated_first5']:.2f} → {r['truncated_last5']:.2f} | {r['kept_ratio']:.2f} | "
            f"{r['gen_batches']:.2f} | {wall} | {peak} |"
        )
    table = "\n".join(lines)
    if args.out:
        args.out.write_text(table + "\n")
    print(table)
    if args.plot:
        plot_runs(sorted(args.runs), args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
