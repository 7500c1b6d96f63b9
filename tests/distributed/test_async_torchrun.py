"""Disaggregated asynchronous training under real torchrun processes: rank 0 trains, rank 1 owns the engine and only
generates (``rollout.n_gpus_per_node=1``); the weights travel over the weight group, and the staleness bound holds on
every sample the trainer rank trains on. It keeps the real ``torchrun`` command (not the warm agent of
tests/harness/runners.py): the rank split is what a user launches with torchrun, interpreter per rank and all."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dapo.config import build_config
from dapo.data.task import encode_task, read_task
from dapo.distributed.world import World
from dapo.model.hub import resolve_data_config
from dapo.model.loading import load_policy
from dapo.training.errors import TrainingError
from dapo.training.rank_split import is_rollout_rank, rollout_ranks
from dapo.training.weight_sync import actor_log_probs_of, probe_halves
from tests.distributed.test_train_torchrun import SMALL, metric_steps
from tests.harness.runners import torchrun

STEPS = 3
SPLIT = [
    *[a for a in SMALL if not a.startswith("trainer.save_freq")],
    f"trainer.total_training_steps={STEPS}",
    "async_training.mode=fully_async",
    "async_training.staleness_threshold=1",
    "async_training.partial_rollout=true",
    "async_training.partial_rollout_chunk_tokens=4",
    "async_training.rollout_num_threads=1",
    "rollout.n_gpus_per_node=1",
]
# SPLIT with two rollout ranks (1 + 2), and with two fsdp2 trainer ranks beside them (2 x 2)
FLEET = [a if a != "rollout.n_gpus_per_node=1" else "rollout.n_gpus_per_node=2" for a in SPLIT]
TWO_BY_TWO = [*FLEET, "actor.strategy=fsdp2"]


def trained_records(run_dir: Path) -> list[dict]:
    """The metrics records of the trained steps, which must be exactly steps 1..STEPS."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return records


def assert_trained_batches_within_bound(run_dir: Path) -> None:
    """Sample by sample, as trained (trainer.rollout_data_dir): no sample lags more than 1 version, and none was drawn
    by weights newer than the step before."""
    for step in range(1, STEPS + 1):
        lines = [json.loads(line) for line in (run_dir / "batches" / f"{step}.jsonl").read_text().splitlines()]
        assert lines and all(line["lag"] <= 1 and max(line["weight_versions"]) <= step - 1 for line in lines)


@pytest.mark.slow
def test_one_trainer_rank_and_one_rollout_rank_train_within_the_staleness_bound(tmp_path: Path) -> None:
    run_dir = tmp_path / "split"
    result = torchrun(
        [*SPLIT, "trainer.experiment_name=split", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "engine hf on a rollout rank of its own" in result.stdout  # no worker process spawned by the trainer
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        assert r["async/weight_transfer_bytes"] > 1e6  # every push crossed to rank 1 ...
        assert r["rollout/probe_logprob_diff"] < 1e-3  # ... and rank 1's engine holds the trainer's weights
        assert r["async/staleness/max"] <= 1 and r["train/num_groups"] > 0
    assert_trained_batches_within_bound(run_dir)


@pytest.mark.slow
def test_one_trainer_rank_and_two_rollout_ranks_share_every_batch_and_every_push(tmp_path: Path) -> None:
    """1 + 2 (torchrun --nproc-per-node 3): the prompts of every generation round are dealt to both engines, so both
    contribute samples every step; one broadcast per push reaches both (the probe asks both and they agree: an engine
    that missed a push would differ from the other and stop the run); the staleness bound holds sample by sample."""
    run_dir = tmp_path / "fleet"
    args = FLEET
    cfg = build_config({}, args)
    assert cfg.data.effective_gen_batch_size % 2 == 0
    per_engine = cfg.data.effective_gen_batch_size // 2 * cfg.rollout.n  # samples of one round on each engine
    result = torchrun(
        [*args, "trainer.experiment_name=fleet", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
        tmp_path,
        nproc=3,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "engine hf on each of 2 rollout ranks" in result.stdout
    records = trained_records(run_dir)
    for r in records:
        # both engines, every batch: each round's prompts are dealt half and half (an even round), n samples each
        assert r["async/engine_samples/0"] == r["async/engine_samples/1"] == per_engine * r["train/num_gen_batches"]
        assert "async/engine_samples/2" not in r
        assert r["rollout/probe_logprob_diff"] < 1e-3 and r["async/weight_transfer_bytes"] > 1e6
        assert r["async/staleness/max"] <= 1 and r["train/num_groups"] > 0
    assert_trained_batches_within_bound(run_dir)


CALCULATOR = str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml")


@pytest.mark.slow
def test_two_fsdp2_trainer_ranks_and_two_rollout_ranks_train_multi_turn_rollouts_within_the_bound(
    tmp_path: Path,
) -> None:
    """2 x 2 (torchrun --nproc-per-node 4, actor.strategy=fsdp2) with the tiny calculator's multi-turn tool rollouts
    (one run for both, since each costs half a minute of CI): the trainer ranks shard the actor over a group of their
    own; the leading one runs the producer against both engines and hands every batch to the other; each push gathers
    the shards on both trainer ranks and reaches both engines in one broadcast, and may land between two turns of a
    trajectory on either engine. Both engines contribute every step; every model token keeps its version, so the
    bound holds sample by sample; the tool ran; and the checkpoint holds both trainer ranks' shards (world size 2, not
    4: the rollout ranks hold no part of the actor)."""
    run_dir = tmp_path / "tools"
    args = [
        "--config",
        CALCULATOR,
        *TWO_BY_TWO,
        "data.max_response_length=48",
        "reward_model.overlong_buffer.len=4",
        "algorithm.filter_groups.max_num_gen_batches=1",
        "rollout.multi_turn.sandbox.mode=unsafe-no-isolation",
        f"trainer.save_freq={STEPS}",
    ]
    result = torchrun(
        [*args, "trainer.experiment_name=tools", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
        tmp_path,
        nproc=4,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "engine hf on each of 2 rollout ranks" in result.stdout
    records = trained_records(run_dir)
    for r in records:
        assert r["async/engine_samples/0"] > 0 and r["async/engine_samples/0"] == r["async/engine_samples/1"], r
        assert r["rollout/probe_logprob_diff"] < 1e-3 and r["async/weight_transfer_bytes"] > 1e6, r
        assert r["async/staleness/max"] <= 1 and r["train/num_groups"] > 0, r
        assert r["tool/calls_per_sample"] > 0, r
    assert_trained_batches_within_bound(run_dir)
    checkpoint = run_dir / "checkpoints" / f"global_step_{STEPS}"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["layout"] == "sharded" and manifest["world_size"] == 2
    assert sorted(p.name for p in checkpoint.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]


def probe_log_probs(cfg, model_folder: Path) -> torch.Tensor:
    """The run's weight probe (its first training prompt, ``WeightSync``) scored by the model saved in
    ``model_folder``, as the actor side of the probe scores it."""
    policy = load_policy(cfg.model.model_copy(update={"path": str(model_folder)}), device="cpu")
    data_cfg = resolve_data_config(cfg.data)
    ids = encode_task(read_task(data_cfg), data_cfg, policy.tokenizer).train[0].input_ids
    return actor_log_probs_of(policy.model, *probe_halves(ids))


@pytest.mark.slow
def test_two_fsdp2_lora_trainer_ranks_push_their_gathered_adapters_to_two_rollout_ranks(tmp_path: Path) -> None:
    """2 x 2 with LoRA under fsdp2, fully async with partial rollouts: each push gathers the adapter shards on both
    trainer ranks (one order, a collective of the trainer group) and the leader broadcasts the full adapters, only
    those, to both engines. Both engines contribute every step; the bound holds sample by sample; the probe, asked of
    both engines (they must agree within 1e-4, ``EngineFleet.log_probs_of``), matches the trainer after every push
    within 1e-5 (the run's own threshold, so the run stops otherwise), and the last update moved it by more than ten
    times that, so an engine one push behind would have stopped the run; the
    checkpoint is the full adapter folder and the merged model, as in the synchronous fsdp2 LoRA run."""
    run_dir = tmp_path / "lora"
    args = [
        *TWO_BY_TWO,
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "trainer.save_freq=1",  # steps 2 and 3 are kept: the probe's movement between them is checked below
        # The default 0.05 would let an engine one push behind pass: on this task one update moves the probe ~3e-3,
        # while an engine holding the trainer's adapters matches it to rounding (measured 0).
        "rollout.probe_logprob_threshold=1e-5",
    ]
    cfg = build_config({}, args)
    per_engine = cfg.data.effective_gen_batch_size // 2 * cfg.rollout.n  # samples of one round on each engine
    result = torchrun(
        [*args, "trainer.experiment_name=lora", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
        tmp_path,
        nproc=4,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "engine hf on each of 2 rollout ranks" in result.stdout
    hf = run_dir / "checkpoints" / f"global_step_{STEPS}" / "hf"
    adapters = load_file(hf / "adapter_model.safetensors")
    base = load_file(hf / "merged" / "model.safetensors")
    for key, tensor in adapters.items():  # full tensors: A is rank x in, B is out x rank (a shard halves dim 0)
        weight = base[key.removeprefix("base_model.model.").replace(".lora_A", "").replace(".lora_B", "")]
        assert tensor.shape == ((8, weight.shape[1]) if ".lora_A." in key else (weight.shape[0], 8)), key
    assert any(".lora_B." in k and float(t.abs().max()) > 0 for k, t in adapters.items())  # trained away from B = 0
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapters.values())
    records = trained_records(run_dir)
    for r in records:
        assert r["async/engine_samples/0"] == r["async/engine_samples/1"] == per_engine * r["train/num_gen_batches"]
        # the full adapters and nothing else (a shard would be half of it, the base weights megabytes more)
        assert r["async/weight_transfer_bytes"] == adapter_bytes, r
        assert r["rollout/probe_logprob_diff_max"] < 1e-5, r
        assert r["async/staleness/max"] <= 1 and r["train/num_groups"] > 0, r
    assert_trained_batches_within_bound(run_dir)
    # The probe could tell: the last update moved it by far more than the gap the engines showed after its push.
    last, before = (
        probe_log_probs(cfg, run_dir / "checkpoints" / f"global_step_{s}" / "hf" / "merged") for s in (3, 2)
    )
    assert float((last - before).abs().mean()) > 10 * cfg.rollout.probe_logprob_threshold


@pytest.mark.slow
def test_two_replicated_trainer_ranks_and_one_rollout_rank_resume_one_step_off(tmp_path: Path) -> None:
    """2 + 1, one_step_off, replicated: the run trains, and a rerun with more steps resumes from its checkpoint on
    the same split (the leader's prefetched batch is in the checkpoint) and records every step once."""
    args = [
        *(
            a
            for a in SPLIT
            if not a.startswith(("async_training.mode", "async_training.partial", "async_training.staleness"))
        ),
        "async_training.mode=one_step_off",
        "trainer.experiment_name=two_plus_one",
    ]
    first = torchrun([*args, "trainer.total_training_steps=2"], tmp_path, nproc=3, timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    second = torchrun([*args, "trainer.total_training_steps=3"], tmp_path, nproc=3, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from" in second.stdout
    records = trained_records(tmp_path / "two_plus_one")  # steps 1..3, each recorded once
    assert all(r["async/staleness/max"] <= 1 and r["async/engine_samples/0"] > 0 for r in records)


def test_the_rank_split_is_any_trainer_ranks_and_any_rollout_ranks() -> None:
    split = build_config({}, ["async_training.mode=one_step_off", "rollout.n_gpus_per_node=1"])
    assert rollout_ranks(split, World(rank=0, world_size=2)) == 1
    assert not is_rollout_rank(split, World(rank=0, world_size=2))
    assert is_rollout_rank(split, World(rank=1, world_size=2))
    assert rollout_ranks(build_config({}, []), World(rank=0, world_size=2)) == 0  # data parallel, as before
    with pytest.raises(TrainingError, match="leaves no rank to train"):
        rollout_ranks(split, World())  # no torchrun: there is no rank to give
    assert rollout_ranks(split, World(rank=0, world_size=3)) == 1  # two trainer ranks beside one rollout rank
    assert [is_rollout_rank(split, World(rank=r, world_size=3)) for r in range(3)] == [False, False, True]
    two = build_config({}, ["async_training.mode=fully_async", "rollout.n_gpus_per_node=2"])
    assert rollout_ranks(two, World(rank=0, world_size=3)) == 2
    assert [is_rollout_rank(two, World(rank=r, world_size=3)) for r in range(3)] == [False, True, True]
    with pytest.raises(TrainingError, match="asynchronous loop"):
        rollout_ranks(build_config({}, ["rollout.n_gpus_per_node=1"]), World(rank=0, world_size=2))


@pytest.mark.slow
def test_a_killed_rollout_rank_ends_the_job_and_max_restarts_resumes_it(tmp_path: Path) -> None:
    """1 + 2 ranks under torchrun --max-restarts=1; rollout rank 2 is SIGKILLed once step 1's checkpoint is complete.
    The trainer cannot restart a torchrun rank: torchrun sees the rank fail (its log names it), stops the others and
    starts the job again, which resumes from the last complete checkpoint and finishes every step, each recorded
    once."""
    from dapo.infra.checkpoint import is_complete_checkpoint
    from tests.distributed.test_kill_resume_torchrun import kill_9, worker_pids
    from tests.harness.runners import TORCHRUN_ENV, torchrun_command
    from tests.harness.ports import free_port

    run_dir = tmp_path / "killed"
    args = FLEET
    command = torchrun_command(
        [*args, "trainer.save_freq=1", "trainer.experiment_name=killed"],
        tmp_path,
        nproc=3,
        # c10d rendezvous: a restarted round meets afresh (a static master port's store
        # keeps the dead round's addresses, and gloo's mesh then connects to them)
        rdzv=["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=1"],
    )
    log_path = tmp_path / "job.log"
    with log_path.open("w") as log:
        job = subprocess.Popen(command, env=TORCHRUN_ENV, stdout=log, stderr=subprocess.STDOUT)
        workers: dict[int, int] = {}
        try:
            deadline = time.monotonic() + 300
            first = run_dir / "checkpoints" / "global_step_1"
            while not is_complete_checkpoint(first) and job.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert job.poll() is None, "the run ended before it could be killed:\n" + log_path.read_text()[-4000:]
            workers = worker_pids(job.pid)
            assert sorted(workers) == [0, 1, 2]
            kill_9([workers[2]])
            job.wait(timeout=400)
        finally:
            kill_9([job.pid, *workers.values()])
    out = log_path.read_text()
    assert job.returncode == 0, out[-4000:]
    # Whoever notices first names the dead rank in one line: the trainer (its connection to the rank closed) or,
    # when torchrun has already stopped it, the trainer's SIGTERM handler; no rank prints a traceback.
    first_round = out.split("resumed from")[0]
    assert "rollout rank 2: its connection closed" in first_round or "rank 0: rank 2 of 3 died" in first_round, out[
        -4000:
    ]
    assert "Traceback" not in first_round, out[-4000:]
    assert "resumed from" in out
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))  # every step recorded once


@pytest.mark.slow
def test_r3_one_step_off_on_a_rollout_rank_replays_the_ranks_routes(tmp_path: Path) -> None:
    """1 + 1, one_step_off, a tiny Qwen3-MoE with actor.router_replay.mode=R3: the rollout rank records the routes
    (the same worker code as a spawned worker) and sends them with the samples; the first step's batch, drawn under
    the trainer's own weights, agrees on every route, and every step replays."""
    from tests.model.families import save_tiny_model

    folder = save_tiny_model("qwen3_moe", tmp_path / "model", eos_token_ids=range(2, 601, 6))
    run_dir = tmp_path / "r3"
    result = torchrun(
        [
            *[a for a in SPLIT if not a.startswith("async_training.")],
            "async_training.mode=one_step_off",
            "async_training.rollout_num_threads=1",
            f"model.path={folder}",
            "actor.router_replay.mode=R3",
            "algorithm.filter_groups.enable=false",  # a random model's groups are all wrong: train on them anyway
            "trainer.experiment_name=r3",
        ],
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "engine hf on a rollout rank of its own" in result.stdout
    records = trained_records(run_dir)
    assert records[0]["async/staleness/max"] == 0.0 and records[0]["moe/routing_agreement"] == 1.0
    for r in records:
        assert 0.0 < r["moe/routing_agreement"] <= 1.0 and 0.0 < r["moe/update_routing_agreement"] <= 1.0
