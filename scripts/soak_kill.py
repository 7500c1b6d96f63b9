"""Soak test: SIGKILL a real `dapo train` at random moments, resume it each time, and compare the end state bit for
bit with an uninterrupted run (weights, optimizer state, metrics other than wall-clock timings).

    python scripts/soak_kill.py --kills 10 --steps 6 --out /tmp/soak [--seed 0]

Each kill lands at a uniform moment of the training the run has left, counted from its own start-up (its "dapo: model"
line), so generation, update and validation are hit in proportion to their time; the first ``--save-kills`` kills
wait for a checkpoint write to begin and land within 50 ms of it. A run that
finishes before its kill ends a series; every series (killed and resumed until done) is compared with the
uninterrupted run. With ``--warm`` the killed and resumed runs are real processes forked from a warm server that
imported dapo once (tests/harness/runners.py: no ~8 s of imports per start); the uninterrupted reference stays a fresh
`python -m dapo.cli.main`. Prints one JSON line with the counts (kills, how many left a half-written checkpoint, series,
whether all were bit-identical); exit code 1 when any was not. tests/faults/test_soak.py runs a short one in CI.
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

from dapo.infra.timing import is_measured_metric


def train_cmd(out: Path, name: str, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dapo.cli.main",
        "train",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=2",
        "rollout.n=4",
        "data.synth.num_train=64",
        "data.synth.num_val=8",
        "rollout.val_kwargs.n=2",
        "trainer.num_threads=1",
        "algorithm.filter_groups.on_exhausted=train_on_partial",
        "trainer.progress=false",
        f"trainer.experiment_name={name}",
        f"trainer.default_local_dir={out}",
    ]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def launch(cmd: list[str], *, stderr: bool, warm: bool = False):
    """A real `dapo` process for ``cmd`` with its stdout a pipe: a fresh interpreter, or with ``warm`` a fork of the
    warm server (the same command; Popen's poll / send_signal / wait / communicate)."""
    if warm:
        from tests.harness.runners import WarmDapo

        return WarmDapo(cmd[3:], extra_env=ENV, stderr_to_devnull=not stderr)
    return subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE if stderr else subprocess.DEVNULL, text=True
    )


def run_to_end(cmd: list[str], warm: bool = False) -> tuple[float, float]:
    """Run ``cmd`` to its end: (wall seconds, seconds until training started, i.e. its "dapo: model" line)."""
    t0 = time.monotonic()
    proc = launch(cmd, stderr=True, warm=warm)
    started = wait_for_start(proc)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"run failed:\n{err[-3000:]}")
    return time.monotonic() - t0, (started or time.monotonic()) - t0


def wait_for_start(proc: subprocess.Popen) -> float | None:
    """Read the run's output up to the line it prints once the model, data and engine are ready; its time."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("dapo: model"):
            return time.monotonic()
    return None


def latest_step(run_dir: Path) -> int:
    from dapo.infra.checkpoint import find_latest_checkpoint

    latest = find_latest_checkpoint(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else None
    return int(latest.name.rsplit("_", 1)[1]) if latest is not None else 0


def mid_save(run_dir: Path) -> bool:
    """True when a kill left a checkpoint's temp folder behind: it landed while a checkpoint was being written."""
    root = run_dir / "checkpoints"
    return root.is_dir() and any(p.name.startswith(".tmp-") for p in root.iterdir())


def wait_for_save(proc: subprocess.Popen, run_dir: Path, extra_s: float) -> None:
    """Return ``extra_s`` after a checkpoint's temp folder appears (a save is being written), or when the run ends."""
    root = run_dir / "checkpoints"
    while proc.poll() is None:
        if root.is_dir() and any(p.name.startswith(".tmp-") for p in root.iterdir()):
            time.sleep(extra_s)
            return
        time.sleep(0.002)


def end_state(run_dir: Path, steps: int) -> tuple[dict, dict, list[dict]]:
    ckpt = run_dir / "checkpoints" / f"global_step_{steps}"
    weights = load_file(ckpt / "hf" / "model.safetensors")
    optim = torch.load(ckpt / "optimizer.pt", weights_only=True)
    metrics = [
        {k: v for k, v in json.loads(line).items() if not is_measured_metric(k)}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
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
    ap.add_argument(
        "--save-kills",
        type=int,
        default=1,
        help="of the kills, how many wait for a checkpoint write to begin (a random moment rarely hits "
        "the ~0.1 s a small checkpoint takes)",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="fork the killed and resumed runs from a warm server (tests/harness/runners.py) instead of a "
        "fresh interpreter each; the uninterrupted reference stays a fresh one",
    )
    args = ap.parse_args()
    if args.warm:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.harness.runners
        from tests.harness.runners import prestart

        prestart()  # its imports overlap the uninterrupted run
    rng = random.Random(args.seed)
    shutil.rmtree(args.out, ignore_errors=True)
    t0 = time.monotonic()
    wall, startup = run_to_end(train_cmd(args.out, "straight", args.steps))
    per_step = (wall - startup) / args.steps  # training time per step, checkpoint and validation included
    reference = end_state(args.out / "straight", args.steps)

    cmd = train_cmd(args.out, "killed", args.steps)
    run_dir = args.out / "killed"
    kills = misses = mid_saves = series = 0
    all_equal = True

    def finish_series() -> None:  # a series ended (killed and resumed until done): compare it with the straight run
        nonlocal all_equal, series
        weights, optim, metrics = end_state(run_dir, args.steps)
        all_equal &= same(weights, reference[0]) and same(optim, reference[1]) and metrics == reference[2]
        series += 1
        shutil.rmtree(run_dir)

    while kills < args.kills:
        proc = launch(cmd, stderr=False, warm=args.warm)
        # Kill at a uniform moment of the training this run has left (generation, update, validation and
        # checkpoint writes in proportion to their time), counted from its own start-up, not the interpreter's.
        left = args.steps - latest_step(run_dir)
        if wait_for_start(proc) is not None:
            if kills < args.save_kills:
                wait_for_save(proc, run_dir, rng.uniform(0.0, 0.05))
            else:
                time.sleep(rng.uniform(0.0, per_step * left))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            mid_saves += mid_save(run_dir)
        else:
            proc.wait()
            if proc.returncode != 0:
                raise SystemExit(f"a resumed run failed with exit code {proc.returncode}")
            misses += 1  # finished before the kill: this series is done
            finish_series()
    run_to_end(cmd, warm=args.warm)
    finish_series()
    result = {
        "kills": kills,
        "kills_mid_checkpoint_write": mid_saves,
        "finished_before_kill": misses,
        "series": series,
        "all_bit_identical": all_equal,
        "uninterrupted_run_s": round(wall, 1),
        "soak_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(result))
    if not all_equal:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
