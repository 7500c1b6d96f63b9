"""Disaggregated asynchronous training under torchrun: the ranks split into trainer ranks and rollout ranks.

``rollout.n_gpus_per_node=R`` (verl's fully-async key) gives the last R ranks of the torchrun job to the rollout: such
a rank owns the engine and serves the trainer exactly as a spawned rollout worker process does
(``dapo.rollout.worker``), with the same messages and the same weight group, only reached over TCP instead of a pipe.
The trainer rank trains as a single process (its run sees a one-process world) and talks to torchrun's group once:
to hand the rollout rank its contact (where to connect, where the weights meet). Built: one trainer rank and one
rollout rank (``--nproc-per-node 2``); several of either would need a data-parallel group of the trainer ranks only
and one engine per rollout rank, which is not built.
"""

from __future__ import annotations

import os

from dapo.config import DapoConfig
from dapo.distributed.world import World
from dapo.rollout.factory import EngineSpec
from dapo.rollout.worker import RemoteEngine, RankContact, WorkerOptions, serve_on_rank
from dapo.training.errors import TrainingError


def rollout_ranks(cfg: DapoConfig, world: World) -> int:
    """How many of the torchrun job's ranks are rollout ranks (0: none, the ranks train and generate together);
    a split that is not built stops the run here, before anything is loaded."""
    wanted = cfg.rollout.n_gpus_per_node
    if wanted == 0:
        return 0
    if cfg.async_training.mode == "sync":
        raise TrainingError(f"rollout.n_gpus_per_node={wanted} gives ranks to the rollout alone, which only an "
                            "asynchronous loop feeds: set async_training.mode=one_step_off or fully_async")
    if world.world_size != wanted + 1 or wanted != 1:
        raise TrainingError(f"rollout.n_gpus_per_node={wanted} with {world.world_size} torchrun rank(s): the split "
                            "built is one trainer rank and one rollout rank (torchrun --nproc-per-node 2, "
                            "rollout.n_gpus_per_node=1)")
    return wanted


def is_rollout_rank(cfg: DapoConfig, world: World) -> bool:
    return world.rank >= world.world_size - rollout_ranks(cfg, world)


def trainer_world(cfg: DapoConfig, world: World) -> World:
    """The world the trainer rank trains in: itself alone when the rollout has ranks of its own."""
    return World() if rollout_ranks(cfg, world) else world


def engine_on_rollout_rank(spec: EngineSpec, cfg: DapoConfig, options: WorkerOptions, world: World) -> RemoteEngine:
    """The trainer rank's handle on the rollout rank's engine; the contact travels over torchrun's group, from an
    address the rollout rank can reach (torchrun's MASTER_ADDR: the trainer is rank 0)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    return RemoteEngine.on_rank(spec, cfg.model, options, host, hand_over=world.broadcast_object)


def serve_rollout_rank(world: World) -> None:
    """A rollout rank's whole run: take the contact the trainer rank hands over, then serve until it closes."""
    contact: RankContact = world.broadcast_object(None)
    serve_on_rank(contact)
