"""Record the tiny default task trained four ways, for docs/async.md (scripts/render_docs.py renders the records):

    sync          dapo train (Algorithm 1 in one process)
    1x1           one trainer process + the rollout worker it spawns, fully async
    2x2           torchrun: 2 trainer ranks (actor.strategy=fsdp2) x 2 rollout ranks, fully async
    2x2-one-step  the same 2 x 2, one_step_off
    2x2-tools, 2x2-tools-one-step  the 2 x 2 runs with multi-turn tool rollouts (configs/tools/tiny_calculator.yaml),
                  fully async and one_step_off, SHORT_STEPS steps
    2x2-lora, 2x2-lora-one-step    the 2 x 2 runs training LoRA adapters (configs/lora_tiny.yaml), fsdp2 trainer
                  ranks as the other 2 x 2 runs, SHORT_STEPS steps

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
import json
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
TOOLS = ["--config", "configs/tools/tiny_calculator.yaml"]
LORA = ["--config", "configs/lora_tiny.yaml"]
SHORT_STEPS = 15  # the tools and LoRA variants: each learns most of the task by then (docs/runs/lora-hf: step 5)


@dataclass(frozen=True)
class BenchRun:
    """One recorded run: its name (its folder), what it is, its ``dapo train`` arguments, its torchrun ranks
    (0: a plain process) and its steps (None: the script's ``--steps``; a shorter run's own)."""

    name: str
    what: str
    args: tuple[str, ...]
    ranks: int = 0
    steps: int | None = None


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
    BenchRun(
        "2x2-tools",
        "torchrun: 2 trainer ranks (fsdp2) x 2 rollout ranks, fully async, staleness 1, partial rollouts, "
        "multi-turn tool rollouts",
        (*TOOLS, "async_training.mode=fully_async", *ASYNC, *TWO_BY_TWO),
        ranks=4,
        steps=SHORT_STEPS,
    ),
    BenchRun(
        "2x2-tools-one-step",
        "torchrun: 2 trainer ranks (fsdp2) x 2 rollout ranks, one_step_off, multi-turn tool rollouts",
        (*TOOLS, "async_training.mode=one_step_off", *TWO_BY_TWO),
        ranks=4,
        steps=SHORT_STEPS,
    ),
    BenchRun(
        "2x2-lora",
        "torchrun: 2 trainer ranks (fsdp2) x 2 rollout ranks, fully async, staleness 1, partial rollouts, LoRA",
        (*LORA, "async_training.mode=fully_async", *ASYNC, *TWO_BY_TWO),
        ranks=4,
        steps=SHORT_STEPS,
    ),
    BenchRun(
        "2x2-lora-one-step",
        "torchrun: 2 trainer ranks (fsdp2) x 2 rollout ranks, one_step_off, LoRA",
        (*LORA, "async_training.mode=one_step_off", *TWO_BY_TWO),
        ranks=4,
        steps=SHORT_STEPS,
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


def run_record():  # type: ignore[no-untyped-def]
    """scripts/run_record.py as a module: the one writer of a docs/runs/ record."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_record", ROOT / "scripts" / "run_record.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("run_record", module)
    spec.loader.exec_module(module)
    return module


def config_of(run: BenchRun, extra: list[str]):  # type: ignore[no-untyped-def]
    """The run's validated config, read from its arguments by `dapo train`'s own parser (its ``--config`` files are
    relative to the repository)."""
    from dapo.cli.train_cmd import train_command
    from dapo.config.loading import load_config

    params = train_command.make_context("train", [*run.args, *extra]).params
    files = [ROOT / f for f in params["config_path"]]
    return load_config(files or None, params["overrides"])


def record(run: BenchRun, steps: int, out: Path, extra: list[str], load: str, deadline_s: float) -> dict:
    """Run ``run`` to its end in a scratch folder, then keep its metrics, config and run.json in ``out/<name>``.
    The run gets ``deadline_s`` seconds (dapo train bounds its own waits; this bounds the bench's wait on it)."""
    cfg = config_of(run, extra)
    with tempfile.TemporaryDirectory(prefix=f"bench_async_{run.name}_") as scratch:
        run_root = Path(scratch)
        command = command_of(run, steps, run_root, extra)
        started = datetime.datetime.now(datetime.timezone.utc)
        at_commit = run_record().commit()  # the tree may move on during the run
        t0 = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=deadline_s)
        except subprocess.TimeoutExpired as late:
            tail = (late.stderr or b"")[-4000:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            raise SystemExit(f"{run.name}: still running after --run-deadline-s={deadline_s:g} s, killed\n{tail}")
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{run.name}: exit code {done.returncode}\n{done.stderr[-4000:]}")
        folder = run_record().record_run(
            run_root / run.name,
            out / run.name,
            what=run.what,
            command=shown(run, steps, extra),
            load=load,
            console=done.stdout,
            started=started,
            at_commit=at_commit,
            # samples per group: samples/s from train/num_groups
            extra={"wall_s": round(wall, 1), "steps": steps, "rollout_n": cfg.rollout.n},
        )
    return json.loads((folder / "run.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps of every run (default 30)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the records go (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--only", default=",".join(r.name for r in RUNS), help="comma-separated runs to make")
    parser.add_argument("--load", default="nothing else running", help="what else ran meanwhile (recorded)")
    parser.add_argument(
        "--run-deadline-s", type=float, default=3600.0, help="seconds each run may take before it is killed"
    )
    parser.add_argument("extra", nargs="*", help="more `dapo train` overrides for every run (after --)")
    args = parser.parse_args(argv)
    wanted = args.only.split(",")
    unknown = sorted(set(wanted) - {r.name for r in RUNS})
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {', '.join(r.name for r in RUNS)}")
    chosen = [r for r in RUNS if r.name in wanted]
    for i, run in enumerate(chosen, 1):
        steps = min(run.steps, args.steps) if run.steps else args.steps
        print(f"[{i}/{len(chosen)}] {run.name} ({run.what}), {steps} steps ...", flush=True)
        meta = record(run, steps, args.out, args.extra, args.load, args.run_deadline_s)
        print(f"[{i}/{len(chosen)}] {run.name}: done in {meta['wall_s']} s -> {args.out / run.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
