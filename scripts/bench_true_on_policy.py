"""The price of rollout.true_on_policy, and what it buys: record a 30-step `dapo train` in that mode and a paired
timing of both modes, into docs/runs/true-on-policy/ (rendered into docs/true-on-policy.md by scripts/render_docs.py).

    python scripts/bench_true_on_policy.py                 # ~8 min on 2 CPU cores
    python scripts/bench_true_on_policy.py --steps 30 --paired-steps 5

1. the learning run: `dapo train actor_rollout_ref.rollout.true_on_policy=true` (the default task, its 30 steps);
   its metrics (rollout/log_prob_diff/max at every step, val/acc) go to metrics.jsonl.gz, its command to run.json;
2. the paired timing: `--paired-steps` steps of the default and of the true-on-policy run, one after the other on
   the same machine, validation off; the per-step phase times and their medians go to paired.json.
Run it on an otherwise idle machine: the paired timing is the figure docs quote.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "runs" / "true-on-policy"
MODE = "actor_rollout_ref.rollout.true_on_policy=true"
# no wait on another process is unbounded: a run of this bench takes minutes, one hour means it is stuck
RUN_DEADLINE_S = 3600
PHASES = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor")


def train(folder: Path, name: str, *overrides: str) -> tuple[list[dict], float, list[str]]:
    command = ["dapo", "train", f"trainer.experiment_name={name}", *overrides]
    start = time.perf_counter()
    subprocess.run(command, cwd=folder, check=True, timeout=RUN_DEADLINE_S)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (folder / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return rows, wall, command


def medians(rows: list[dict]) -> dict[str, float]:
    steps = [r for r in rows if r.get("step", 0) >= 2]  # step 1 warms the allocator and the kernels
    return {k: statistics.median(r[k] for r in steps if k in r) for k in PHASES if any(k in r for r in steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--paired-steps", type=int, default=5)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit.strip(),
        "cpu": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows, wall, command = train(folder, "true-on-policy", MODE, f"trainer.total_training_steps={args.steps}")
        with gzip.open(OUT / "metrics.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        (OUT / "run.json").write_text(json.dumps({**meta, "command": " ".join(command), "wall_s": wall}, indent=1))
        paired = {}
        for label, extra in (("default", ()), ("true_on_policy", (MODE,))):
            rows, wall, command = train(
                folder,
                f"paired-{label}",
                *extra,
                "trainer.test_freq=-1",
                f"trainer.total_training_steps={args.paired_steps}",
            )
            paired[label] = {
                "command": " ".join(command),
                "wall_s": wall,
                "medians": medians(rows),
                "steps": [{k: r[k] for k in PHASES if k in r} for r in rows if "timing_s/step" in r],
            }
        ratio = paired["true_on_policy"]["medians"]["timing_s/step"] / paired["default"]["medians"]["timing_s/step"]
        (OUT / "paired.json").write_text(json.dumps({**meta, "runs": paired, "step_time_ratio": ratio}, indent=1))
        shutil.rmtree(folder / "runs", ignore_errors=True)
    print(f"true_on_policy / default step time: {ratio:.2f}x; records in {OUT}")


if __name__ == "__main__":
    main()
