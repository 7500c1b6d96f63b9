"""Where a rank's actor and engine sit, and what carries the weights between them: one pure function of the rank's
role, its ``LOCAL_RANK``, the CUDA devices it sees and the run's settings (no torch, no environment read here), so
that every case is decided in one place and tested without a GPU.

* CPU (``trainer.device=cpu``, or ``auto`` where no GPU is visible): everything on ``cpu``, the weight group on gloo.
* One GPU per rank under torchrun: each rank's actor or engine on ``cuda:LOCAL_RANK``; the weight group between trainer
  ranks and rollout ranks on NCCL (every member on a device of its own).
* Colocated (a trainer whose engine is in this process, or in a rollout worker process it spawned): the actor and the
  engine share ``cuda:LOCAL_RANK``; vLLM takes ``rollout.gpu_memory_utilization`` of it as a fraction (the actor needs
  the rest). The spawned worker's weight group stays on gloo: NCCL refuses two ranks on one device, so the push goes
  through host memory.
* More ranks on a node than CUDA devices it sees is refused, naming both counts (two ranks on one GPU under NCCL
  fail later, in a collective, with an error that does not say why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["trainer", "rollout"]


class PlacementError(ValueError):
    """The ranks cannot be placed on the devices this node has (the message says what to change)."""


@dataclass(frozen=True)
class Placement:
    """One rank's devices.

    Attributes:
        actor_device: where the actor trains (``cpu`` or ``cuda:N``); None on a rollout rank (it holds no actor).
        engine_device: where the rank's engine loads (its own, or its spawned worker's); None on a trainer rank beside
            rollout ranks (the rollout ranks hold the engines).
        weight_backend: the weight group's backend, ``gloo`` or ``nccl``.
        gpu_memory_utilization: the share of its device vLLM may take.
        colocated: the actor and the engine share one GPU.
    """

    actor_device: str | None
    engine_device: str | None
    weight_backend: str
    gpu_memory_utilization: float
    colocated: bool = False


def place(
    role: Role,
    *,
    local_rank: int,
    local_world_size: int,
    cuda_devices: int,
    device: str,
    rollout_ranks: int,
    gpu_memory_utilization: float,
) -> Placement:
    """The devices of one rank (module docstring).

    Args:
        role: ``trainer`` (it trains; with ``rollout_ranks == 0`` its engine is in this process or in a worker it
            spawns) or ``rollout`` (a torchrun rank that only generates).
        local_rank, local_world_size: torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (0 and 1 without torchrun).
        cuda_devices: the CUDA devices this process sees (0 without CUDA).
        device: ``trainer.device``: ``auto``, ``cpu`` or ``cuda``.
        rollout_ranks: the job's ranks given to the rollout (``rollout.n_gpus_per_node``; 0: none).
        gpu_memory_utilization: ``rollout.gpu_memory_utilization``.
    """
    if role not in ("trainer", "rollout"):
        raise PlacementError(f"unknown role {role!r}: a rank trains or generates ('trainer', 'rollout')")
    if role == "rollout" and rollout_ranks == 0:
        raise PlacementError("a rollout rank in a job that gives no rank to the rollout (rollout.n_gpus_per_node=0)")
    if device == "cpu" or (device == "auto" and cuda_devices == 0):
        return Placement(
            actor_device="cpu" if role == "trainer" else None,
            engine_device="cpu" if role == "rollout" or rollout_ranks == 0 else None,
            weight_backend="gloo",
            gpu_memory_utilization=gpu_memory_utilization,
        )
    if device not in ("auto", "cuda"):
        raise PlacementError(f"trainer.device={device}: expected auto, cpu or cuda")
    if cuda_devices == 0:
        raise PlacementError("trainer.device=cuda but no CUDA device is visible (CUDA_VISIBLE_DEVICES, the driver)")
    if local_world_size > cuda_devices or local_rank >= cuda_devices:
        raise PlacementError(
            f"{max(local_world_size, local_rank + 1)} ranks on this node but {cuda_devices} CUDA "
            f"device{'s' if cuda_devices != 1 else ''} visible: every rank needs a GPU of its own (a trainer and the "
            "rollout worker it spawns share one). Start at most "
            f"{cuda_devices} per node (torchrun --nproc-per-node={cuda_devices}), make more GPUs visible "
            "(CUDA_VISIBLE_DEVICES), or run on the CPU (trainer.device=cpu)"
        )
    here = f"cuda:{local_rank}"
    if role == "rollout":
        return Placement(None, here, "nccl", gpu_memory_utilization)
    if rollout_ranks > 0:
        return Placement(here, None, "nccl", gpu_memory_utilization)
    if gpu_memory_utilization >= 1.0:
        raise PlacementError(
            f"rollout.gpu_memory_utilization={gpu_memory_utilization:g} leaves nothing of {here} to the actor, which "
            "shares it with the engine: give the engine a fraction (e.g. 0.4), or the rollout ranks of its own "
            "(rollout.n_gpus_per_node)"
        )
    return Placement(here, here, "gloo", gpu_memory_utilization, colocated=True)
