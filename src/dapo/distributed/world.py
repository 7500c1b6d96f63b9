"""The World: which process this is among how many, and the few collectives the trainer needs.

Ranks enter the program through one object, built once at the edge (``World.from_env()`` reads torchrun's
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and joins the process group) and passed down; nothing below asks
``torch.distributed`` who it is. ``World()`` is the single-process default, for which every collective is the
identity, so single-process code paths never branch on ranks.

A World may be part of the job: ``job.subgroup(ranks)`` is the world of those ranks alone (the trainer ranks of a
job whose other ranks serve the rollout), whose collectives run on its own process group and whose ``rank`` is the
rank within it.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # the job's ranks on this node (torchrun's LOCAL_WORLD_SIZE)
    # The process group of these ranks; None: the whole torchrun job (the default group).
    group: Any = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes metrics, prints progress and saves the Hugging Face export."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, backend: str | None = None) -> World:
        """The world torchrun describes in the environment (joined on first call), or the single process."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls()
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(local_rank)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
            if attempt is None:
                dist.init_process_group(backend=backend)
            else:
                # Under torchrun the workers meet in the agent's store, which outlives a restart: a round restarted
                # by --max-restarts would read the dead round's addresses from it and its gloo mesh fail to connect
                # ("Connection refused"). Each round meets under its own prefix.
                store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
                dist.init_process_group(
                    backend=backend,
                    store=dist.PrefixStore(f"dapo/round_{attempt}", store),
                    rank=rank,
                    world_size=world_size,
                )
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
        return cls(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size)

    def subgroup(self, ranks: Sequence[int], *, timeout_s: float) -> World | None:
        """The world of ``ranks`` of this job alone, on a process group of their own (whose collectives give up
        after ``timeout_s``); None on a rank outside it. A collective over the whole job: every rank calls it, with the
        same ranks, in the same order."""
        ranks = list(ranks)
        group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s))
        if self.rank not in ranks:
            return None
        return World(
            rank=ranks.index(self.rank),
            world_size=len(ranks),
            local_rank=self.local_rank,
            local_world_size=self.local_world_size,
            group=group,
        )

    def device_mesh(self) -> Any:
        """The one-dimensional device mesh of these ranks (FSDP2 shards over it); None: the job's default mesh."""
        if self.group is None:
            return None
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.group, self.device().type)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def device(self) -> torch.device:
        """This rank's device: its local GPU, or the CPU."""
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")

    # -------------------------------------------------------------------------------------------- collectives
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks, in place, and return it (a CPU tensor too under NCCL: it goes through the GPU)."""
        if not self.distributed:
            return tensor
        if tensor.device.type == "cpu" and dist.get_backend(self.group) == "nccl":  # NCCL reduces device memory only
            on_device = tensor.to(self.device())
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=self.group)
            tensor.copy_(on_device.cpu())
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (pickled; for small control data and scored groups)."""
        if not self.distributed:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=self._global(src), group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group(self.group)
