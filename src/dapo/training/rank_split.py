"""Disaggregated asynchronous training under torchrun: the ranks split into trainer ranks and rollout ranks.

``rollout.n_gpus_per_node=R`` (verl's fully-async key) gives the last R ranks of the torchrun job to the rollout: each
such rank owns one engine and serves the trainer exactly as a spawned rollout worker process does
(``dapo.rollout.worker``), with the same messages, only reached over TCP instead of a pipe. The trainer sees the R
engines as one (``dapo.rollout.fleet.EngineFleet``): prompts are dealt to them, their outputs merged, and one
broadcast on a weight group spanning the trainer and every engine carries each push. The trainer rank trains as a
single process (its run sees a one-process world) and talks to torchrun's group once: to hand each rollout rank its
contact (where to connect, where the weights meet). Built: one trainer rank and any number of rollout ranks
(``--nproc-per-node 1+R``); several trainer ranks need a data-parallel group of the trainer ranks only, which is
not built yet (refused with that message).
"""

from __future__ import annotations

import os

from dapo.config import DapoConfig
from dapo.distributed.world import World
from dapo.rollout.factory import EngineSpec
from dapo.rollout.fleet import EngineFleet
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
    if world.world_size != wanted + 1:
        raise TrainingError(f"rollout.n_gpus_per_node={wanted} with {world.world_size} torchrun rank(s): the split "
                            f"built is one trainer rank and {wanted} rollout rank(s) (torchrun --nproc-per-node "
                            f"{wanted + 1}); several trainer ranks beside rollout ranks are not built yet")
    return wanted


def is_rollout_rank(cfg: DapoConfig, world: World) -> bool:
    return world.rank >= world.world_size - rollout_ranks(cfg, world)


def trainer_world(cfg: DapoConfig, world: World) -> World:
    """The world the trainer rank trains in: itself alone when the rollout has ranks of its own."""
    return World() if rollout_ranks(cfg, world) else world


def engines_on_rollout_ranks(spec: EngineSpec, cfg: DapoConfig, options: WorkerOptions, world: World
                             ) -> EngineFleet:
    """The trainer rank's handle on the rollout ranks' engines; the contacts travel over torchrun's group, from an
    address the rollout ranks can reach (torchrun's MASTER_ADDR: the trainer is rank 0)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    count = rollout_ranks(cfg, world)
    engines, transport = RemoteEngine.on_ranks(spec, cfg.model, options, host, count,
                                               hand_over=world.broadcast_object)
    return EngineFleet(engines, transport, ranks=range(world.world_size - count, world.world_size))


def serve_rollout_rank(cfg: DapoConfig, world: World) -> None:
    """A rollout rank's whole run: take its contact from the ones the trainer rank hands over, then serve until it
    closes."""
    contacts: list[RankContact] = world.broadcast_object(None)
    serve_on_rank(contacts[world.rank - (world.world_size - rollout_ranks(cfg, world))])
