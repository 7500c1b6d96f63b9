"""Where each rank's actor and engine sit (``dapo.distributed.placement.place``): every case decided without a GPU,
from the counts a node would report."""

from __future__ import annotations

import pytest

from dapo.distributed.placement import Placement, PlacementError, place


def _place(role: str = "trainer", **given) -> Placement:
    settings = dict(
        local_rank=0, local_world_size=1, cuda_devices=0, device="auto", rollout_ranks=0, gpu_memory_utilization=0.5
    )
    return place(role, **{**settings, **given})


def test_on_the_cpu_everything_is_on_the_cpu_and_the_weights_travel_over_gloo() -> None:
    assert _place() == Placement("cpu", "cpu", "gloo", 0.5)  # a trainer whose engine is beside it (or spawned)
    assert _place(device="cpu", cuda_devices=8) == Placement("cpu", "cpu", "gloo", 0.5)  # asked for, GPUs or not
    # torchrun 2 + 2 on the CPU: the trainer ranks hold no engine, the rollout ranks no actor
    split = dict(local_world_size=4, rollout_ranks=2)
    assert _place("trainer", local_rank=1, **split) == Placement("cpu", None, "gloo", 0.5)
    assert _place("rollout", local_rank=3, **split) == Placement(None, "cpu", "gloo", 0.5)


def test_one_gpu_colocated_the_trainer_and_its_worker_share_cuda_0_and_vllm_takes_its_fraction() -> None:
    got = _place(cuda_devices=1, gpu_memory_utilization=0.4)
    assert got == Placement("cuda:0", "cuda:0", "gloo", 0.4, colocated=True)  # NCCL refuses two ranks on one GPU
    assert _place(cuda_devices=1, device="cuda").colocated
    with pytest.raises(PlacementError, match=r"gpu_memory_utilization=1 leaves nothing of cuda:0 to the actor"):
        _place(cuda_devices=1, gpu_memory_utilization=1.0)


def test_n_gpus_split_each_rank_on_cuda_local_rank_with_the_weight_group_on_nccl() -> None:
    split = dict(local_world_size=4, cuda_devices=4, rollout_ranks=2)
    assert [_place("trainer", local_rank=r, **split) for r in (0, 1)] == [
        Placement("cuda:0", None, "nccl", 0.5),
        Placement("cuda:1", None, "nccl", 0.5),
    ]
    assert [_place("rollout", local_rank=r, **split) for r in (2, 3)] == [
        Placement(None, "cuda:2", "nccl", 0.5),
        Placement(None, "cuda:3", "nccl", 0.5),
    ]
    # a second node of 8 (torchrun numbers its ranks from 0 on every node): its rollout rank 5 on its own cuda:5
    assert (
        _place("rollout", local_rank=5, local_world_size=8, cuda_devices=8, rollout_ranks=8).engine_device == "cuda:5"
    )


def test_more_ranks_than_gpus_is_refused_naming_both_counts() -> None:
    with pytest.raises(PlacementError, match=r"4 ranks on this node but 2 CUDA devices visible") as refused:
        _place("rollout", local_rank=3, local_world_size=4, cuda_devices=2, rollout_ranks=2)
    assert "torchrun --nproc-per-node=2" in str(refused.value) and "trainer.device=cpu" in str(refused.value)
    with pytest.raises(PlacementError, match=r"2 ranks on this node but 1 CUDA device visible"):
        _place("trainer", local_world_size=2, cuda_devices=1, rollout_ranks=1)
    with pytest.raises(PlacementError, match="trainer.device=cuda but no CUDA device is visible"):
        _place(device="cuda")


def test_a_role_or_device_that_does_not_exist_is_refused() -> None:
    with pytest.raises(PlacementError, match="unknown role 'critic'"):
        _place("critic")
    with pytest.raises(PlacementError, match="a rollout rank in a job that gives no rank to the rollout"):
        _place("rollout")
    with pytest.raises(PlacementError, match="trainer.device=tpu"):
        _place(device="tpu", cuda_devices=1)
