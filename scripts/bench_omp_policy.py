"""Which OpenMP waiting policy `dapo train` should run under: each policy alone on the cores and beside a busy neighbour.

libgomp's threads, when a parallel region ends, either spin before sleeping (its default: up to GOMP_SPINCOUNT
iterations, 300,000 when OMP_WAIT_POLICY is unset) or sleep at once (OMP_WAIT_POLICY=PASSIVE). Spinning is fast
when the trainer owns the cores; when anything else computes on them, spinning threads burn the time slices the
thread doing the work needs (#39 item 12: 3-step runs 74-87 s spinning vs 18-20 s passive). This script runs the
same short `dapo train` (the default tiny task, 3 steps, no validation) under each policy, alone and with one
busy-loop process per core minus one beside it, interleaved, and records the wall times and the steps' times.

    python scripts/bench_omp_policy.py --repeats 2 --out docs/runs/omp-policy.json
    python scripts/render_docs.py          # docs/performance.md's table follows the record
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

POLICIES: dict[str, dict[str, str]] = {
    "spin (libgomp default)": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "short spin (GOMP_SPINCOUNT=10000)": {"GOMP_SPINCOUNT": "10000"},
}
TRAIN = ["trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.val_before_train=false"]


def _busy() -> None:
    while True:
        pass


def one_run(policy_env: dict[str, str], neighbours: int, root: Path, name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy_env)
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(neighbours)]
    for p in busy:
        p.start()
    try:
        start = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dapo.cli.main",
                "train",
                *TRAIN,
                f"trainer.experiment_name={name}",
                f"trainer.default_local_dir={root}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.perf_counter() - start
    finally:
        for p in busy:
            p.terminate()
            p.join()
    if done.returncode != 0:
        raise SystemExit(f"dapo train failed under {policy_env}:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r["timing_s/step"] for r in records if r.get("step", 0) > 0 and "timing_s/step" in r]
    return {"wall_s": round(wall, 2), "step_s": [round(s, 3) for s in steps]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/runs/omp-policy.json"))
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    conditions = {"alone": 0, "beside a busy process": max(1, cores - 1)}
    runs: dict[str, dict[str, list[dict]]] = {p: {c: [] for c in conditions} for p in POLICIES}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):  # interleaved, so a drift of the host's speed hits every policy alike
            for cond, neighbours in conditions.items():
                for policy, env in POLICIES.items():
                    name = f"r{rep}-{len(runs[policy][cond])}-{abs(hash((policy, cond))) % 10**6}"
                    result = one_run(env, neighbours, Path(tmp), name)
                    runs[policy][cond].append(result)
                    print(
                        f"[{rep + 1}/{args.repeats}] {cond:>22} | {policy:<34} wall {result['wall_s']:6.1f} s "
                        f"steps {result['step_s']}",
                        flush=True,
                    )
    summary = {
        p: {
            c: {
                "median_wall_s": statistics.median(r["wall_s"] for r in rs),
                "median_step_s": statistics.median(s for r in rs for s in r["step_s"]),
            }
            for c, rs in by_cond.items()
        }
        for p, by_cond in runs.items()
    }
    record = {
        "meta": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv,
            "cores": cores,
            "cpu": platform.processor() or platform.machine(),
            "command": ["dapo", "train", *TRAIN],
            "neighbours": conditions,
        },
        "runs": runs,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
