"""Soak test by hand: SIGKILL a real `dapo train` at random moments, resume it each time, and compare the end state
bit for bit with an uninterrupted run (weights, optimizer state, metrics other than wall-clock timings).

    python scripts/soak_kill.py --kills 10 --steps 6 --out /tmp/soak [--seed 0]

The kills land uniformly at random within the run (generation, update, validation and checkpoint writes all get
hit); a kill that lands after the run finished counts as a miss. Prints one JSON line with the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

VOLATILE = ("timing_s/", "perf/")  # wall-clock measurements: differ between any two runs


def train_cmd(out: Path, name: str, steps: int) -> list[str]:
    return [sys.executable, "-m", "dapo.cli.main", "train", f"trainer.total_training_steps={steps}",
            "trainer.save_freq=1", "trainer.test_freq=2", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
            "rollout.n=4", "data.synth.num_train=64", "data.synth.num_val=8", "rollout.val_kwargs.n=2",
            "trainer.num_threads=1", "algorithm.filter_groups.on_exhausted=train_on_partial", "trainer.progress=false",
            f"trainer.experiment_name={name}", f"trainer.default_local_dir={out}"]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_to_end(cmd: list[str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def end_state(run_dir: Path, steps: int) -> tuple[dict, dict, list[dict]]:
    ckpt = run_dir / "checkpoints" / f"global_step_{steps}"
    weights = load_file(ckpt / "hf" / "model.safetensors")
    optim = torch.load(ckpt / "optimizer.pt", weights_only=True)
    metrics = [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return weights, optim, metrics


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/dapo-soak"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    shutil.rmtree(args.out, ignore_errors=True)
    wall = run_to_end(train_cmd(args.out, "straight", args.steps))
    reference = end_state(args.out / "straight", args.steps)

    cmd = train_cmd(args.out, "killed", args.steps)
    kills = misses = 0
    while kills < args.kills:
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, wall))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        else:
            misses += 1
            if proc.returncode != 0:
                raise SystemExit(f"a resumed run failed with exit code {proc.returncode}")
            shutil.rmtree(args.out / "killed")  # finished before the kill: start the series again
    run_to_end(cmd)
    weights, optim, metrics = end_state(args.out / "killed", args.steps)
    result = {"kills": kills, "finished_before_kill": misses, "weights_equal": same(weights, reference[0]),
              "optimizer_equal": same(optim, reference[1]), "metrics_equal": metrics == reference[2],
              "uninterrupted_run_s": round(wall, 1)}
    print(json.dumps(result))
    if not all(result[k] for k in ("weights_equal", "optimizer_equal", "metrics_equal")):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
