"""Reading a run back (its metrics records and trained batches) and the resume identity of a run with a batch
generated ahead: what one_step_off resume tests assert, single-turn, multi-turn or with routing replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.harness.runners import run_dapo_warm


def records_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trained_batches_of(run_dir: Path) -> dict[int, list[dict]]:
    """The trained batches the run wrote (trainer.rollout_data_dir = run_dir/batches), by step."""
    return {
        int(p.stem): [json.loads(line) for line in p.read_text().splitlines()]
        for p in (run_dir / "batches").glob("*.jsonl")
    }


def same_fields(record: dict) -> dict:
    """What must be equal between two runs: everything but times, throughput and memory."""
    return {
        k: v
        for k, v in record.items()
        if not (k.startswith(("timing_s/", "perf/", "async/")) or "memory" in k or "_s" in k.rsplit("/", 1)[-1])
    }


def run_straight(args: list[str], root: Path, name: str) -> Path:
    """``dapo train ARGS`` uninterrupted as run ``name`` under ``root``, its trained batches written
    (``trainer.rollout_data_dir``): the run directory, for :func:`assert_resumed_from_step_2_ends_as`."""
    run_dir = root / name
    result = run_dapo_warm(
        ["train", *args, f"trainer.experiment_name={name}", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
        root,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def assert_resumed_from_step_2_ends_as(straight: Path, args: list[str], root: Path, last: int = 4) -> None:
    """The run directory as a SIGKILL right after the step-2 checkpoint leaves it (the uninterrupted run ``straight``'s
    own checkpoint, which holds the batch generated ahead, and its records up to step 2), resumed by the same command
    ``args`` from another ``root``: bit-identical weights, records and trained batches. The checkpoint is written whole
    or not at all, so this is what a kill leaves on disk; a real SIGKILL of an async run's process group is
    tests/training/test_async_training.py's fully-async fixture."""
    run_dir = root / straight.name
    shutil.copytree(
        straight,
        run_dir,
        ignore=lambda d, names: (
            [f"global_step_{last}"]
            if d.endswith("checkpoints")
            else [f"{s}.jsonl" for s in range(3, last + 1)]
            if d.endswith("batches")
            else []
        ),
    )
    kept = [line for line in (straight / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 2]
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    if (checkpoint / "trainer_state.pt").exists():
        saved.update(torch.load(checkpoint / "trainer_state.pt", weights_only=True))
    assert saved["step"] == 2 and len(saved.get("prefetched", [])) == 1  # step 3's batch, generated ahead

    resumed = run_dapo_warm(
        ["train", *args, f"trainer.experiment_name={straight.name}", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
        root,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    a = load_file(straight / "checkpoints" / f"global_step_{last}" / "hf" / "model.safetensors")
    b = load_file(run_dir / "checkpoints" / f"global_step_{last}" / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert [same_fields(r) for r in records_of(run_dir)] == [same_fields(r) for r in records_of(straight)]
    assert trained_batches_of(run_dir) == trained_batches_of(
        straight
    )  # step 3: the saved batch, trained as it was generated
