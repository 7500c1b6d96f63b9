"""A 2-rank `dapo train` (torchrun, gloo on CPU) killed with SIGKILL right after a checkpoint is complete, and run
again, ends bit-identical to an uninterrupted 2-rank run: the final checkpoint's weights and optimizer state, and
every metric of the steps after the resume but wall-clock timings. Killed two ways, in one run: torchrun and both
ranks at once (the machine or the job dies) after step 1's checkpoint, and, in the launch that resumes it, one rank
alone (torchrun then stops the other, whose message names the dead rank) after step 2's; the third launch finishes
it. A resume that is off after either kill leaves the end state different from the uninterrupted run's.

The two killed launches are real torchrun processes (what is killed, and who names the dead rank, is torchrun's); the
uninterrupted run and the finishing launch only need 2 ranks training, and run under torchrun's own elastic agent
forked warm (``torchrun_warm``: real rank processes, real gloo group), whose runs are bitwise those of torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dapo.infra.checkpoint import find_latest_checkpoint, is_complete_checkpoint
from scripts.soak_kill import end_state, same
from tests.distributed.test_train_torchrun import SMALL
from tests.harness.runners import TORCHRUN_ENV, prestart, torchrun_command, torchrun_warm

STEPS = 3
ARGS = [*SMALL, f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", "trainer.progress=false"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, list[dict]]:
    # Under torch's elastic agent forked warm (torchrun_warm: real rank processes, gloo); the kills below are of a
    # real torchrun, and the finishing launch after them resumes under the warm agent like this run.
    root = tmp_path_factory.mktemp("uninterrupted")
    proc = torchrun_warm([*ARGS, "trainer.experiment_name=run"], root)
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


def killed_after(checkpoint: Path, victim: str, run_root: Path, log_path: Path) -> str:
    """Start the 2-rank run (resuming whatever ``run_root`` holds), SIGKILL ``victim`` ("whole job": torchrun and
    both ranks at once, the machine or the job dies; "rank 1": that rank alone, torchrun then stops the other) once
    ``checkpoint`` is complete, and return the job's output."""
    log = log_path.open("w")
    job = subprocess.Popen(
        torchrun_command([*ARGS, "trainer.experiment_name=run"], run_root),
        env=TORCHRUN_ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    workers: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 240
        while not is_complete_checkpoint(checkpoint) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job.poll() is None, "the run ended before it could be killed:\n" + log_path.read_text()
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
    return log_path.read_text()


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, subprocess.CompletedProcess]:
    """One run killed twice and resumed each time: the whole job after its step-1 checkpoint, then (resumed) rank 1
    alone after its step-2 checkpoint, then resumed to its end. Its run directory and the three launches' output."""
    prestart()  # the warm server for the finishing launch imports while torchrun is killed
    root = tmp_path_factory.mktemp("killed")
    run_dir = root / "run"
    whole = killed_after(run_dir / "checkpoints" / "global_step_1", "whole job", root, root / "whole_job.log")
    assert find_latest_checkpoint(run_dir / "checkpoints").name == "global_step_1"
    rank_1 = killed_after(run_dir / "checkpoints" / "global_step_2", "rank 1", root, root / "rank_1.log")
    assert find_latest_checkpoint(run_dir / "checkpoints").name == "global_step_2"
    resumed = torchrun_warm([*ARGS, "trainer.experiment_name=run"], root)
    return run_dir, whole, rank_1, resumed


@pytest.mark.slow
def test_a_resumed_run_whose_rank_1_is_killed_is_named_by_the_survivor(killed_twice) -> None:
    run_dir, _, rank_1, _ = killed_twice
    # The launch resumed the whole-job kill's step-1 checkpoint ...
    assert rank_1.count("resumed from") == 1 and "(step 1)" in rank_1, rank_1[-4000:]
    # ... and rank 0, left in a collective with a dead peer (gloo: "Connection closed by peer") or stopped by
    # torchrun's SIGTERM, names the rank that died and where a rerun resumes, without a traceback through the loop.
    assert "rank 0: rank 1 of 2 died" in rank_1, rank_1[-4000:]
    done = run_dir / "checkpoints" / "global_step_2"
    assert f"Resume works: a rerun of the same command continues from {done}" in rank_1
    assert "dapo/training/" not in rank_1


@pytest.mark.slow
def test_kill_9_after_a_checkpoint_then_resume_ends_bit_identical(uninterrupted, killed_twice) -> None:
    run_dir, _, _, resumed = killed_twice
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stdout.count("resumed from") == 1 and "(step 2)" in resumed.stdout
    weights, optimizer, metrics = end_state(run_dir, STEPS)
    assert same(weights, uninterrupted[0]), "final weights differ"
    assert same(optimizer, uninterrupted[1]), "final optimizer state differs"
    # Every step has exactly one record, equal to the uninterrupted run's: the loop logs a step before writing its
    # checkpoint, so a kill after the checkpoint cannot lose the record, and one before it is undone by the resume.
    assert metrics == uninterrupted[2]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
