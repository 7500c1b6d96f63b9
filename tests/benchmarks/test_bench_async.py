"""scripts/bench_async.py records the four runs docs/async.md compares, and scripts/render_docs.py renders them: the
renderer's figures checked against records written here with hand-computed values, the doc left without figures
while the records are absent, and one real run of the script (the sync run, 1 step, tiny settings) recorded as the
renderer reads it."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tests.cli.cli_helpers import FAST

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench_async, render_docs = _load("bench_async"), _load("render_docs")


def _write_run(folder: Path, name: str, records: list[dict], rollout_n: int = 4) -> None:
    run = folder / name
    run.mkdir(parents=True)
    meta = {"command": f"dapo train {name}", "date": "2026-12-07T12:00Z", "commit": "abc1234", "host_cpu": "a CPU"}
    (run / "run.json").write_text(json.dumps({**meta, "rollout_n": rollout_n}))
    with gzip.open(run / "metrics.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _step(step: int, **values: float) -> dict:
    base = {
        "step": step,
        "train/num_groups": 4.0,
        "timing_s/step": 2.0,
        "timing_s/gen": 1.0,
        "timing_s/reward": 0.25,
        "timing_s/update_actor": 0.5,
        "timing_s/old_log_prob": 0.0,
        "timing_s/sync_weights": 0.25,
    }
    return {**base, **values}


def test_the_table_and_the_speed_up_model_are_what_the_records_hold(tmp_path: Path) -> None:
    _write_run(
        tmp_path, "sync", [{"step": 0, "val/acc/mean@8": 0.25}, _step(1), _step(2), {"step": 2, "val/acc/mean@8": 0.5}]
    )
    fleet = [
        {"step": 0, "val/acc/mean@8": 0.25},
        _step(1, **{"async/overlap_s": 0.5, "async/trainer_idle_s": 0.0, "async/engine_idle_s": 1.0}),
        _step(2, **{"async/overlap_s": 1.5, "async/trainer_idle_s": 1.0, "async/engine_idle_s": 0.0}),
    ]
    for k, r in enumerate(fleet[1:]):
        r.update({"timing_s/step": 1.0, "async/engine_samples/0": 8.0 + 2 * k, "async/engine_samples/1": 8.0})
        r.update({"async/staleness/max": float(k), "val/acc/mean@8": 0.75})
    _write_run(tmp_path, "2x2", fleet)
    table = render_docs.async_runs_table(tmp_path)
    # sync: 2 steps x 4 groups x 4 samples over 4 s = 8.0/s; no async key: dashes; validation 0.25 -> 0.5
    assert "| sync | 2 | 8.0 | – | – | – | 0.250 -> 0.500 | – | 0 |" in table, table
    # 2x2: 32 samples over 2 s; overlap (0.5 + 1.5) / 2; idle means 0.5 each; engines 9 and 8 per step; lag max 1
    assert "| 2x2 | 2 | 16.0 | 1.00 | 0.50 | 0.50 | 0.250 -> 0.750 | 9 · 8 | 1 |" in table, table
    assert (
        "pending: 1x1, 2x2-one-step" in table and "- 2x2: `dapo train 2x2` (2026-12-07T12:00Z, commit abc1234)" in table
    )
    model = render_docs.async_speedup_model(tmp_path)
    # G = 1 + 0.25, T = 0.5, S = 0.25: separate devices max(1.25, 0.75) = 1.25 s for 2.00 s, 1.60x; 2x2 16 / 8 = 2x
    assert "G = 1.25 s, T = 0.50 s, S = 0.25 s" in model and "= 1.25 s instead of 2.00 s: **1.60x**" in model, model
    assert "2x2 2.00x" in model, model


def test_without_records_the_blocks_say_they_are_pending_and_hold_no_figure(tmp_path: Path) -> None:
    for block in (render_docs.async_runs_table(tmp_path), render_docs.async_speedup_model(tmp_path)):
        assert "pending until the lead's run" in block
        assert not render_docs.FIGURE.findall(render_docs.CODE.sub("", block)), block


def test_the_script_records_a_run_as_the_renderer_reads_it(tmp_path: Path) -> None:
    extra = [a for a in FAST if not a.startswith("trainer.total_training_steps")]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_async.py"),
            "--steps",
            "1",
            "--only",
            "sync",
            "--out",
            str(tmp_path),
            "--",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0].startswith("[1/1] sync (Algorithm 1 in one process"), done.stdout
    meta = json.loads((tmp_path / "sync" / "run.json").read_text())
    assert meta["command"].startswith("dapo train trainer.total_training_steps=1 trainer.experiment_name=sync")
    assert meta["command"].endswith("trainer.default_local_dir=<dir>") and meta["rollout_n"] == 4 and meta["wall_s"] > 0
    assert {"date", "commit", "host_cpu"} <= set(meta) and (tmp_path / "sync" / "config.yaml").exists()
    assert "| sync | 1 |" in render_docs.async_runs_table(tmp_path)


def test_the_two_by_two_runs_are_torchrun_commands_of_four_ranks(tmp_path: Path) -> None:
    runs = {r.name: r for r in bench_async.RUNS}
    assert list(runs) == list(render_docs.ASYNC_RUN_NAMES)
    command = bench_async.command_of(runs["2x2"], 30, tmp_path, [])
    assert command[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=4"]
    for key in (
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=1",
        "async_training.partial_rollout=true",
        "rollout.n_gpus_per_node=2",
        "actor.strategy=fsdp2",
        "trainer.total_training_steps=30",
    ):
        assert key in command
    assert "async_training.mode=one_step_off" in bench_async.command_of(runs["2x2-one-step"], 30, tmp_path, [])
    assert bench_async.shown(runs["1x1"], 30, []).startswith("dapo train async_training.mode=fully_async")


def test_a_run_past_its_deadline_is_killed_and_named_and_nothing_is_recorded(tmp_path: Path) -> None:
    """The bench's wait on `dapo train` is bounded: a run still going at --run-deadline-s is killed, the script stops
    naming the run and the flag, and no half record is left."""
    sync = next(r for r in bench_async.RUNS if r.name == "sync")
    try:
        bench_async.record(sync, 1, tmp_path, list(FAST), "test", deadline_s=0.5)
    except SystemExit as stop:
        assert str(stop).startswith("sync: still running after --run-deadline-s=0.5 s, killed"), stop
    else:
        raise AssertionError("a run past its deadline was waited for")
    assert not (tmp_path / "sync").exists()
