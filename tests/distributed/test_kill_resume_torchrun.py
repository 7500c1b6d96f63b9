"""A 2-rank `dapo train` (torchrun, gloo on CPU) killed with SIGKILL right after a checkpoint is complete, and run
again, ends bit-identical to an uninterrupted 2-rank run: the final checkpoint's weights and optimizer state, and
every metric of the steps after the resume but wall-clock timings. Killed two ways: torchrun and both ranks at once (the machine or the job dies),
and one rank alone (torchrun then stops the other)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dapo.infra.checkpoint import find_latest_checkpoint, is_complete_checkpoint
from scripts.soak_kill import end_state, same
from tests.distributed.test_train_torchrun import SMALL, TORCHRUN_ENV, torchrun, torchrun_command

STEPS = 3
ARGS = [*SMALL, f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", "trainer.progress=false"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, list[dict]]:
    root = tmp_path_factory.mktemp("uninterrupted")
    proc = torchrun([*ARGS, "trainer.experiment_name=run"], root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return end_state(root / "run", STEPS)


def worker_pids(torchrun_pid: int) -> dict[int, int]:
    """Rank -> pid of the workers torchrun started (its direct children; Linux /proc)."""
    pids = {}
    for pid in Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split():
        environ = dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
        pids[int(environ[b"RANK"])] = int(pid)
    return pids


def kill_9(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["whole job", "rank 1"])
def test_kill_9_after_a_checkpoint_then_resume_ends_bit_identical(uninterrupted, tmp_path: Path, victim: str) -> None:
    run_dir = tmp_path / "run"
    log = (tmp_path / "killed.log").open("w")
    job = subprocess.Popen(torchrun_command([*ARGS, "trainer.experiment_name=run"], tmp_path), env=TORCHRUN_ENV,
                           stdout=log, stderr=subprocess.STDOUT)
    workers: dict[int, int] = {}
    try:
        first = run_dir / "checkpoints" / "global_step_1"
        deadline = time.monotonic() + 240
        while not is_complete_checkpoint(first) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job.poll() is None, "the run ended before it could be killed:\n" + (tmp_path / "killed.log").read_text()
        workers = worker_pids(job.pid)
        assert sorted(workers) == [0, 1]
        # torchrun starts every worker in a session of its own, so killing torchrun's process group would leave
        # the ranks training on: the whole job is torchrun and each worker, killed at once.
        kill_9([workers[1]] if victim == "rank 1" else [*workers.values(), job.pid])
        job.wait(timeout=120)
    finally:
        kill_9([job.pid, *workers.values()])  # whatever is left of the job (nothing, when the test passes)
        log.close()
    assert job.returncode != 0
    assert find_latest_checkpoint(run_dir / "checkpoints").name == "global_step_1"

    resumed = torchrun([*ARGS, "trainer.experiment_name=run"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stdout.count("resumed from") == 1 and "(step 1)" in resumed.stdout
    weights, optimizer, metrics = end_state(run_dir, STEPS)
    assert same(weights, uninterrupted[0]), "final weights differ"
    assert same(optimizer, uninterrupted[1]), "final optimizer state differs"
    # Every step has exactly one record, equal to the uninterrupted run's: the loop logs a step before writing its
    # checkpoint, so a kill after the checkpoint cannot lose the record, and one before it is undone by the resume.
    assert metrics == uninterrupted[2]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
