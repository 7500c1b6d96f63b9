"""Disaggregated asynchronous training under torchrun: the ranks split into trainer ranks and rollout ranks.

``rollout.n_gpus_per_node=R`` (verl's fully-async key) gives the last R ranks of the torchrun job to the rollout: each
such rank owns one engine and serves the trainer exactly as a spawned rollout worker process does
(``dapo.rollout.worker``), with the same messages, only reached over TCP instead of a pipe. The first N = world - R
ranks train: they form a data-parallel group of their own (``replicated`` or ``fsdp2``, on a process group of the
trainer ranks alone, ``World.subgroup``). Trainer rank 0 leads the rollout: it alone sees the R engines, as one
(``dapo.rollout.fleet.EngineFleet``: prompts dealt to them, outputs merged, one broadcast on a weight group spanning
it and every engine carries each push), runs the batch source, and hands each batch to the other trainer ranks
(``dapo.training.shared_source``); a sharded actor's push gathers its weights on every trainer rank. torchrun's
whole group is used twice only: to make the trainer group, and to hand each rollout rank its contact.

    torchrun --nproc-per-node N+R -m dapo.cli.main train async_training.mode=fully_async rollout.n_gpus_per_node=R
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dapo.config import DapoConfig
from dapo.distributed.placement import Placement, PlacementError, Role, place
from dapo.distributed.world import World
from dapo.rollout.spec import EngineSpec
from dapo.rollout.fleet import EngineFleet
from dapo.rollout.worker import RemoteEngine, RankContact, WorkerOptions, serve_on_rank
from dapo.training.errors import TrainingError


def rollout_ranks(cfg: DapoConfig, world: World) -> int:
    """How many of the torchrun job's ranks are rollout ranks (0: none, the ranks train and generate together);
    a split that cannot run stops the run here, before anything is loaded."""
    wanted = cfg.rollout.n_gpus_per_node
    if wanted == 0:
        return 0
    if cfg.async_training.mode == "sync":
        raise TrainingError(
            f"rollout.n_gpus_per_node={wanted} gives ranks to the rollout alone, which only an "
            "asynchronous loop feeds: set async_training.mode=one_step_off or fully_async"
        )
    if world.world_size <= wanted:
        raise TrainingError(
            f"rollout.n_gpus_per_node={wanted} with {world.world_size} torchrun rank(s) leaves no "
            f"rank to train: run torchrun --nproc-per-node N+{wanted} (N >= 1 trainer ranks)"
        )
    return wanted


def placement_of(cfg: DapoConfig, job: World, role: Role) -> Placement:
    """This rank's devices (``dapo.distributed.placement.place``), from the devices this process sees; a split the
    node's devices cannot hold stops the run here, before anything is loaded."""
    import torch

    try:
        return place(
            role,
            local_rank=job.local_rank,
            local_world_size=job.local_world_size,
            cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
            device=cfg.trainer.device,
            rollout_ranks=rollout_ranks(cfg, job),
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        )
    except PlacementError as exc:
        raise TrainingError(str(exc) if not job.distributed else f"rank {job.rank}: {exc}") from None


def is_rollout_rank(cfg: DapoConfig, world: World) -> bool:
    return world.rank >= world.world_size - rollout_ranks(cfg, world)


@dataclass(frozen=True)
class JobSplit:
    """This rank's place in the job: ``trainers`` is the world of the trainer ranks (None on a rollout rank; the
    single process when there is one trainer rank, as the one-trainer job always ran)."""

    job: World
    rollout_ranks: int
    trainers: World | None

    @property
    def leads_rollout(self) -> bool:
        """This rank drives the engines (the rollout ranks', or its own worker's) and the batch source."""
        return self.trainers is not None and self.trainers.is_main

    @property
    def shares_batches(self) -> bool:
        """Several trainer ranks beside rollout ranks: the leader hands every batch to the others."""
        return self.rollout_ranks > 0 and self.trainers is not None and self.trainers.distributed


def split_job(cfg: DapoConfig, job: World) -> JobSplit:
    """Every rank of the job calls this once (making the trainer group is a collective over the job)."""
    count = rollout_ranks(cfg, job)
    if count == 0:
        return JobSplit(job, 0, job)
    trainers = job.world_size - count
    if trainers == 1:
        return JobSplit(job, count, World() if job.rank == 0 else None)
    return JobSplit(job, count, job.subgroup(range(trainers), timeout_s=cfg.trainer.stall_timeout_s))


def engines_on_rollout_ranks(spec: EngineSpec, cfg: DapoConfig, options: WorkerOptions, job: World) -> EngineFleet:
    """The leading trainer rank's handle on the rollout ranks' engines; the contacts travel over torchrun's group,
    from an address the rollout ranks can reach (torchrun's MASTER_ADDR: the leader is rank 0)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    count = rollout_ranks(cfg, job)
    engines, transport = RemoteEngine.on_ranks(spec, cfg.model, options, host, count, hand_over=job.broadcast_object)
    return EngineFleet(engines, transport, ranks=range(job.world_size - count, job.world_size))


def receive_contacts(job: World) -> list[RankContact]:
    """The receiving side of the leader's hand-over of the rollout ranks' contacts (``engines_on_rollout_ranks``): a
    collective of the whole job, so every rank but the leader calls it, the other trainer ranks included."""
    return job.broadcast_object(None)


def serve_rollout_rank(cfg: DapoConfig, world: World) -> None:
    """A rollout rank's whole run: take its contact from the ones the leading trainer rank hands over, then serve
    until it closes."""
    device = placement_of(cfg, world, "rollout").engine_device
    contacts = receive_contacts(world)
    serve_on_rank(contacts[world.rank - (world.world_size - rollout_ranks(cfg, world))], device=device)
