"""Record the tiny default task trained four ways, for docs/async.md (scripts/render_docs.py renders the records):

    sync          dapo train (Algorithm 1 in one process)
    1x1           one trainer process + the rollout worker it spawns, fully async
    2x2           torchrun: 2 trainer ranks (actor.strategy=fsdp2) x 2 rollout ranks, fully async
    2x2-one-step  the same 2 x 2, one_step_off

The asynchronous runs use async_training.staleness_threshold=1 and partial_rollout=true (one_step_off: its own bound,
exactly 1). Each run's metrics.jsonl.gz, config.yaml and run.json (command, date, commit, host CPU, wall seconds)
go to OUT/<name>/ (docs/runs/async/ by default), as docs/runs/default/ holds the default run; one progress line per
run. A benchmark: run it on a quiet machine, nothing else running.

    python scripts/bench_async.py                      # 30 steps each, all four
    python scripts/bench_async.py --steps 2 --only sync,1x1 --out /tmp/async_runs -- data.train_batch_size=4
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "runs" / "async"
ASYNC = ["async_training.staleness_threshold=1", "async_training.partial_rollout=true"]
TWO_BY_TWO = ["rollout.n_gpus_per_node=2", "actor.strategy=fsdp2"]


@dataclass(frozen=True)
class BenchRun:
    """One recorded run: its name (its folder), what it is, its ``dapo train`` arguments and its torchrun ranks
    (0: a plain process)."""

    name: str
    what: str
    args: tuple[str, ...]
    ranks: int = 0


RUNS = (
    BenchRun("sync", "Algorithm 1 in one process (async_training.mode=sync)", ()),
    BenchRun(
        "1x1",
        "1 trainer process x 1 spawned rollout worker, fully async, staleness 1, partial rollouts",
        ("async_training.mode=fully_async", *ASYNC),
    ),
    BenchRun(
        "2x2",
        "torchrun: 2 trainer ranks (fsdp2) x 2 rollout ranks, fully async, staleness 1, partial rollouts",
        ("async_training.mode=fully_async", *ASYNC, *TWO_BY_TWO),
        ranks=4,
    ),
    BenchRun(
        "2x2-one-step",
        "torchrun: 2 trainer ranks (fsdp2) x 2 rollout ranks, one_step_off",
        ("async_training.mode=one_step_off", *TWO_BY_TWO),
        ranks=4,
    ),
)


def train_args(run: BenchRun, steps: int, run_root: str, extra: list[str]) -> list[str]:
    """``dapo train``'s arguments for ``run``."""
    return [
        "train",
        *run.args,
        f"trainer.total_training_steps={steps}",
        f"trainer.experiment_name={run.name}",
        *extra,
        f"trainer.default_local_dir={run_root}",
    ]


def command_of(run: BenchRun, steps: int, run_root: Path, extra: list[str]) -> list[str]:
    """The process to start: ``python -m dapo.cli.main train ...``, under torchrun for a run with ranks."""
    train = ["-m", "dapo.cli.main", *train_args(run, steps, str(run_root), extra)]
    if not run.ranks:
        return [sys.executable, *train]
    from dapo.serve.ray_runtime import free_loopback_port

    port = free_loopback_port()
    launch = ["-m", "torch.distributed.run", f"--nproc-per-node={run.ranks}", "--master-addr=127.0.0.1"]
    return [sys.executable, *launch, f"--master-port={port}", *train]


def shown(run: BenchRun, steps: int, extra: list[str]) -> str:
    """The command as a user types it, the run root written as ``<dir>``."""
    train = " ".join(train_args(run, steps, "<dir>", extra))
    return f"torchrun --nproc-per-node={run.ranks} -m dapo.cli.main {train}" if run.ranks else f"dapo {train}"


def git_commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def record(run: BenchRun, steps: int, out: Path, extra: list[str]) -> dict:
    """Run ``run`` to its end in a scratch folder, then keep its metrics, config and run.json in ``out/<name>``."""
    from dapo.config import build_config
    from dapo.infra.atomic import atomic_write
    from dapo.infra.perf import cpu_name

    with tempfile.TemporaryDirectory(prefix=f"bench_async_{run.name}_") as scratch:
        run_root = Path(scratch)
        command = command_of(run, steps, run_root, extra)
        started = datetime.datetime.now(datetime.timezone.utc)
        t0 = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{run.name}: exit code {done.returncode}\n{done.stderr[-4000:]}")
        run_dir = run_root / run.name
        folder = out / run.name
        folder.mkdir(parents=True, exist_ok=True)
        with (run_dir / "metrics.jsonl").open("rb") as src, gzip.open(folder / "metrics.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copyfile(run_dir / "config.yaml", folder / "config.yaml")
    cfg = build_config({}, [*run.args, *extra])
    meta = {
        "what": run.what,
        "date": started.strftime("%Y-%m-%dT%H:%MZ"),
        "commit": git_commit(),
        "command": shown(run, steps, extra),
        "host_cpu": cpu_name(),
        "wall_s": round(wall, 1),
        "steps": steps,
        "rollout_n": cfg.rollout.n,  # samples per group: samples/s from train/num_groups
        "printed": [line for line in done.stdout.splitlines() if line.startswith(("done:", "validation"))],
        "files": {"metrics.jsonl.gz": "the run's metrics.jsonl, gzip", "config.yaml": "the run's resolved config"},
    }
    atomic_write(folder / "run.json", json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps of every run (default 30)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the records go (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--only", default=",".join(r.name for r in RUNS), help="comma-separated runs to make")
    parser.add_argument("extra", nargs="*", help="more `dapo train` overrides for every run (after --)")
    args = parser.parse_args(argv)
    wanted = args.only.split(",")
    unknown = sorted(set(wanted) - {r.name for r in RUNS})
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {', '.join(r.name for r in RUNS)}")
    chosen = [r for r in RUNS if r.name in wanted]
    for i, run in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {run.name} ({run.what}), {args.steps} steps ...", flush=True)
        meta = record(run, args.steps, args.out, args.extra)
        print(f"[{i}/{len(chosen)}] {run.name}: done in {meta['wall_s']} s -> {args.out / run.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
