"""Disaggregated asynchronous training under real torchrun processes: rank 0 trains, rank 1 owns the engine and only
generates (``rollout.n_gpus_per_node=1``); the weights travel over the weight group, and the staleness bound holds on
every sample the trainer rank trains on. It keeps the real ``torchrun`` command (not the warm agent of
tests/distributed/warm_torchrun.py): the rank split is what a user launches with torchrun, interpreter per rank and all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo.config import build_config
from dapo.distributed.world import World
from dapo.training.errors import TrainingError
from dapo.training.rank_split import is_rollout_rank, rollout_ranks
from tests.distributed.test_train_torchrun import SMALL, metric_steps, torchrun

STEPS = 3
SPLIT = [*[a for a in SMALL if not a.startswith("trainer.save_freq")], f"trainer.total_training_steps={STEPS}",
         "async_training.mode=fully_async", "async_training.staleness_threshold=1",
         "async_training.partial_rollout=true", "async_training.partial_rollout_chunk_tokens=4",
         "async_training.rollout_num_threads=1", "rollout.n_gpus_per_node=1"]


@pytest.mark.slow
def test_one_trainer_rank_and_one_rollout_rank_train_within_the_staleness_bound(tmp_path: Path) -> None:
    run_dir = tmp_path / "split"
    result = torchrun([*SPLIT, "trainer.experiment_name=split", f"trainer.rollout_data_dir={run_dir / 'batches'}"],
                      tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "engine hf on a rollout rank of its own" in result.stdout  # no worker process spawned by the trainer
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        assert r["async/weight_transfer_bytes"] > 1e6  # every push crossed to rank 1 ...
        assert r["rollout/probe_logprob_diff"] < 1e-3  # ... and rank 1's engine holds the trainer's weights
        assert r["async/staleness/max"] <= 1 and r["train/num_groups"] > 0
    for step in range(1, STEPS + 1):  # sample by sample, as trained
        lines = [json.loads(line) for line in (run_dir / "batches" / f"{step}.jsonl").read_text().splitlines()]
        assert lines and all(line["lag"] <= 1 and max(line["weight_versions"]) <= step - 1 for line in lines)


def test_the_rank_split_built_is_one_trainer_rank_and_one_rollout_rank() -> None:
    split = build_config({}, ["async_training.mode=one_step_off", "rollout.n_gpus_per_node=1"])
    assert rollout_ranks(split, World(rank=0, world_size=2)) == 1
    assert not is_rollout_rank(split, World(rank=0, world_size=2))
    assert is_rollout_rank(split, World(rank=1, world_size=2))
    assert rollout_ranks(build_config({}, []), World(rank=0, world_size=2)) == 0  # data parallel, as before
    with pytest.raises(TrainingError, match="one trainer rank and one rollout rank"):
        rollout_ranks(split, World())  # no torchrun: there is no rank to give
    with pytest.raises(TrainingError, match="one trainer rank and one rollout rank"):
        rollout_ranks(split, World(rank=0, world_size=3))
    with pytest.raises(TrainingError, match="asynchronous loop"):
        rollout_ranks(build_config({}, ["rollout.n_gpus_per_node=1"]), World(rank=0, world_size=2))
