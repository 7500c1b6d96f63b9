"""Faults of the rollout worker process in asynchronous training, on real processes: a stopped worker ends the run
within ``trainer.stall_timeout_s`` with one message, never a silent wait (docs/async.md, "No silent hangs")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli.cli_helpers import FAST

STALL_S = 10


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _worker_of(pid: int) -> int:
    """The pid of the rollout worker process the trainer ``pid`` spawned."""
    (worker,) = [
        c
        for c in _children(pid)
        if "multiprocessing" in Path(f"/proc/{c}/cmdline").read_text()
        and "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_text()
    ]
    return worker


def _wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if metrics.exists() and any(
            json.loads(line)["step"] >= step for line in metrics.read_text().splitlines() if line.strip()
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} not recorded within {timeout} s")


def test_a_stopped_rollout_worker_ends_the_run_within_the_stall_deadline_with_one_message(tmp_path: Path) -> None:
    args = [
        *FAST,
        "trainer.total_training_steps=30",
        "trainer.test_freq=0",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "async_training.mode=fully_async",
        "async_training.rollout_num_threads=1",
        f"trainer.stall_timeout_s={STALL_S}",
        f"trainer.default_local_dir={tmp_path}",
        "trainer.experiment_name=stopped",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo.cli.main", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    worker = None
    try:
        _wait_for_step(tmp_path / "stopped" / "metrics.jsonl", 1, proc, timeout=300)
        worker = _worker_of(proc.pid)
        os.kill(worker, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, stderr = proc.communicate(timeout=STALL_S + 60)
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker is not None:
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    assert took < STALL_S + 45, took  # the deadline plus a step's work and the exit, not a silent wait
    assert "Traceback" not in stderr, stderr[-3000:]
    assert f"the rollout worker (pid {worker}) showed no sign of progress" in stderr, stderr[-3000:]
    assert f"trainer.stall_timeout_s={STALL_S}" in stderr and "the run stopped" in stderr
    assert "Resume works: a rerun of the same command continues from" in stderr  # and where it resumes


TOOLS_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml")


@pytest.mark.parametrize(
    "mode, config",
    [("fully_async", ["--config", TOOLS_CONFIG]), ("one_step_off", [])],
    ids=["fully_async-multi_turn", "one_step_off"],
)
def test_a_killed_rollout_worker_is_restarted_and_the_run_trains_every_step_once(
    tmp_path: Path, mode: str, config: list[str]
) -> None:
    """SIGKILL of the worker while it generates the next batch: a new worker gets the actor's weights, the lost batch
    is generated again from the same seeds, and every step trains once on a full batch (async/worker_restarts). The
    fully async case runs the calculator's multi-turn rollouts, so the worker dies between or inside tool turns."""
    steps = 4
    args = [
        *config,
        *FAST,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.val_before_train=false",
        f"async_training.mode={mode}",
        "async_training.rollout_num_threads=1",
        f"trainer.default_local_dir={tmp_path}",
        "trainer.experiment_name=killed",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo.cli.main", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        metrics = tmp_path / "killed" / "metrics.jsonl"
        _wait_for_step(metrics, 1, proc, timeout=300)
        os.kill(_worker_of(proc.pid), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "the rollout worker process exited (exit code -9)" in stderr and "restarted it" in stderr, stderr[-3000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # every step once
    assert all(r["train/num_groups"] == 4 for r in records)  # full batches: nothing lost
    assert max(r["async/worker_restarts"] for r in records) == 1
    assert all(r["async/staleness/max"] <= 1 for r in records)  # the bound holds across the restart
    if config:
        assert all(r["tool/calls"] > 0 for r in records)  # multi-turn before and after the restart


KILL_AT_PUSH = 2  # the version whose push the trainer does not survive


def kill_the_trainer_as_the_broadcast_of_push_2_begins() -> None:
    """A fault hook (``WarmDapo(before=...)``, run in the trainer's process before the CLI): the push of version
    ``KILL_AT_PUSH`` is announced to the worker as usual, then, as its broadcast begins, the trainer SIGKILLs itself:
    the worker holds an announced push and waits in the weight group's broadcast for a peer that is gone."""
    from dapo.distributed import weight_transport
    from dapo.rollout import worker

    push, send = worker.push_to_engines, weight_transport.WeightTransport.send
    versions: list[int] = []

    def announcing(engines, transport, named_tensors, version):
        versions.append(version)
        return push(engines, transport, named_tensors, version)

    def broadcasting(self, layout, tensors):
        if versions and versions[-1] == KILL_AT_PUSH:
            os.kill(os.getpid(), signal.SIGKILL)
        return send(self, layout, tensors)

    worker.push_to_engines = announcing
    weight_transport.WeightTransport.send = broadcasting


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith(("Z", "X"))
    except (OSError, IndexError):
        return True


def test_a_trainer_killed_mid_broadcast_ends_its_worker_naming_the_stage_and_a_rerun_resumes(tmp_path: Path) -> None:
    """SIGKILL of the trainer once it has announced step 2's push, as the broadcast begins (one_step_off: the worker
    is idle then, so it reads the announcement and waits in the broadcast). The worker does not hang: the weight
    group breaks with its peer, and it stops within the stall deadline with one line naming the stage, no traceback.
    The same command, run again, resumes from step 1's checkpoint and records every step once."""
    from tests.harness.runners import WarmDapo, run_dapo_warm

    steps = 3
    args = [
        "train",
        *FAST,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "async_training.mode=one_step_off",
        "async_training.rollout_num_threads=1",
        f"trainer.stall_timeout_s={STALL_S}",
        "trainer.experiment_name=trainer_killed",
    ]
    run_dir = tmp_path / "trainer_killed"
    trainer = WarmDapo(args, tmp_path, new_session=True, before=kill_the_trainer_as_the_broadcast_of_push_2_begins)
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.extend(trainer.stderr), daemon=True)
    drain.start()
    threading.Thread(target=trainer.stdout.read, daemon=True).start()
    worker = None
    try:
        _wait_for_step(run_dir / "metrics.jsonl", 1, trainer, timeout=300)
        worker = _worker_of(trainer.pid)
        assert trainer.wait(timeout=300) == -signal.SIGKILL  # the hook fired at push 2
        killed_at = time.monotonic()
        while not _gone(worker) and time.monotonic() - killed_at < STALL_S + 30:
            time.sleep(0.1)
        took = time.monotonic() - killed_at
        assert _gone(worker), "the worker outlived the trainer: " + "".join(err)[-3000:]
        drain.join(timeout=10)
    finally:
        try:
            os.killpg(trainer.pid, signal.SIGKILL)  # whatever of the job is left
        except ProcessLookupError:
            pass
    stderr = "".join(err)
    assert took < STALL_S + 30, took
    assert f"rollout worker (pid {worker}): the trainer is gone" in stderr, stderr[-3000:]
    assert f"while the worker was receiving the weight broadcast of version {KILL_AT_PUSH}" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]  # step 2 trained but never finished its push: not recorded

    rerun = run_dapo_warm(args, tmp_path, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resumed from" in rerun.stdout, rerun.stdout[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # every step once
    assert all(r["async/staleness/max"] <= 1 for r in records)


def kill_the_worker_as_the_broadcast_of_push_2_begins() -> None:
    """A fault hook (``WarmDapo(before=...)``, in the trainer's process): the push of version ``KILL_AT_PUSH`` is
    announced to the worker, then, as its broadcast begins, the trainer SIGKILLs its rollout worker: the worker dies
    while it receives the weights, and the trainer's broadcast meets a peer that is gone."""
    from dapo.distributed import weight_transport
    from dapo.rollout import worker

    push, send = worker.push_to_engines, weight_transport.WeightTransport.send
    versions: list[int] = []
    killed: list[int] = []

    def announcing(engines, transport, named_tensors, version):
        versions.append(version)
        return push(engines, transport, named_tensors, version)

    def broadcasting(self, layout, tensors):
        if versions and versions[-1] == KILL_AT_PUSH and not killed:
            killed.append(_worker_of(os.getpid()))
            os.kill(killed[-1], signal.SIGKILL)
        return send(self, layout, tensors)

    worker.push_to_engines = announcing
    weight_transport.WeightTransport.send = broadcasting


def test_a_worker_killed_mid_push_is_restarted_and_the_run_trains_every_step_once(tmp_path: Path) -> None:
    """SIGKILL of the worker while it receives a weight push (one_step_off, push 2): the push fails with the worker,
    a new worker gets the actor's current weights and generates the lost batch again from the same seeds; every step
    trains once on a full batch, within the bound, one restart."""
    from tests.harness.runners import WarmDapo

    steps = 4
    args = [
        "train",
        *FAST,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.val_before_train=false",
        "async_training.mode=one_step_off",
        "async_training.rollout_num_threads=1",
        f"trainer.stall_timeout_s={STALL_S}",
        "trainer.experiment_name=killed_mid_push",
    ]
    trainer = WarmDapo(args, tmp_path, new_session=True, before=kill_the_worker_as_the_broadcast_of_push_2_begins)
    try:
        _, stderr = trainer.communicate(timeout=300)
    finally:
        try:
            os.killpg(trainer.pid, signal.SIGKILL)  # whatever of the job is left
        except ProcessLookupError:
            pass
    assert trainer.returncode == 0, stderr[-3000:]
    assert "restarted it" in stderr and "Traceback" not in stderr, stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "killed_mid_push" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # every step once
    assert all(r["train/num_groups"] == 4 for r in records)  # full batches: nothing lost
    assert max(r["async/worker_restarts"] for r in records) == 1
    assert all(r["async/staleness/max"] <= 1 for r in records)
    # the workers hold the pushed weights: every push but the one the kill broke was probed
    probes = {r["step"]: r["rollout/probe_logprob_diff"] for r in records if "rollout/probe_logprob_diff" in r}
    assert len(probes) >= steps - 1 and max(probes.values()) < 1e-3, probes
