"""Weights from the trainer's process to a rollout worker's process over a torch.distributed process group.

A group of its own (rank 0: the trainer, ranks 1..M: the rollout workers, each owning one engine; M = 1 for a
spawned worker), built from a TCP store on loopback (or on the trainer's address when the workers are other torchrun
ranks, possibly on other machines), so
that it never touches the trainer's default group (torchrun's data-parallel ranks): gloo on CPU (and between a trainer
and the worker it spawned on the same GPU: NCCL refuses two ranks on one device), NCCL between ranks on GPUs of their
own (``dapo.distributed.placement`` decides; the buffers then stay on the device). Weights never travel through
files.

A push is announced first (names, shapes, dtypes: a :class:`WeightLayout`, sent by the caller over its control
channel), then every dtype's tensors travel as one flat buffer in a single broadcast: one collective per dtype, not
one per parameter (the tiny model: 1 buffer of 2 MB; a 7B model in bf16: one 14 GB transfer, or buckets on a GPU).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

TRAINER_RANK = 0
WORKER_RANK = 1


@dataclass(frozen=True)
class WeightLayout:
    """What a push carries, in order: each tensor's name, shape and dtype (torch's name, e.g. ``float32``)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @property
    def num_bytes(self) -> int:
        return sum(_numel(shape) * getattr(torch, dtype).itemsize for shape, dtype in zip(self.shapes, self.dtypes))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


@dataclass(frozen=True)
class TransferStats:
    """One push: bytes moved and the seconds the transfer took on this side."""

    num_bytes: int
    seconds: float


class WeightTransport:
    """One side of the two-process weight channel. ``host()`` on the trainer (a free loopback port, returned by
    ``address``), ``connect(address)`` in the worker; both then block in the group's rendezvous until the other joins
    (``timeout_s``)."""

    def __init__(
        self,
        store: dist.TCPStore,
        rank: int,
        timeout_s: float,
        host: str = "127.0.0.1",
        size: int = 2,
        backend: str = "gloo",
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"weight group backend {backend!r}: expected gloo or nccl")
        self.rank, self.size, self.backend = rank, size, backend
        self.address = (host, store.port)
        self._store = store
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._group: dist.ProcessGroup | None = None

    @classmethod
    def host(
        cls, timeout_s: float = 300.0, advertise: str = "127.0.0.1", size: int = 2, backend: str = "gloo"
    ) -> WeightTransport:
        """The trainer's side; ``advertise``: the address the workers connect to (loopback for a spawned worker, the
        trainer's host for rollout ranks on other machines); ``size``: the trainer plus every engine the push
        reaches (one broadcast reaches them all)."""
        store = dist.TCPStore(
            advertise, 0, size, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return cls(store, TRAINER_RANK, timeout_s, advertise, size, backend)

    @classmethod
    def connect(
        cls,
        address: tuple[str, int],
        timeout_s: float = 300.0,
        rank: int = WORKER_RANK,
        size: int = 2,
        backend: str = "gloo",
    ) -> WeightTransport:
        """A worker's side: ``rank`` in 1..size-1 among the engines of the group."""
        store = dist.TCPStore(address[0], address[1], size, False, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(store, rank, timeout_s, size=size, backend=backend)

    @property
    def group(self) -> dist.ProcessGroup:
        if self._group is None:  # the rendezvous: blocks until every member constructs its group too
            if self.backend == "nccl":  # on this process's current CUDA device (torchrun's LOCAL_RANK)
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self._timeout
                self._group = dist.ProcessGroupNCCL(self._store, self.rank, self.size, options)
            else:
                self._group = dist.ProcessGroupGloo(self._store, self.rank, self.size, self._timeout)
        return self._group

    def _buffer_device(self) -> torch.device:
        """Where the flat buffers live: the host for gloo, this process's GPU for NCCL."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    @staticmethod
    def layout_of(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[WeightLayout, list[torch.Tensor]]:
        names, shapes, dtypes, tensors = [], [], [], []
        for name, tensor in named_tensors:
            names.append(name)
            shapes.append(tuple(tensor.shape))
            dtypes.append(str(tensor.dtype).removeprefix("torch."))
            tensors.append(tensor)
        return WeightLayout(tuple(names), tuple(shapes), tuple(dtypes)), tensors

    def send(self, layout: WeightLayout, tensors: list[torch.Tensor]) -> TransferStats:
        """Rank 0: broadcast ``tensors`` (announced as ``layout``), one flat buffer per dtype."""
        t0 = time.perf_counter()
        here = self._buffer_device()
        with torch.no_grad():
            for dtype in dict.fromkeys(layout.dtypes):
                parts = [t.detach().reshape(-1).to(here) for t, d in zip(tensors, layout.dtypes) if d == dtype]
                self.group.broadcast(torch.cat(parts), TRAINER_RANK).wait()
        return TransferStats(layout.num_bytes, time.perf_counter() - t0)

    def receive(self, layout: WeightLayout) -> tuple[list[tuple[str, torch.Tensor]], TransferStats]:
        """A worker's rank: the tensors ``layout`` announces, in its order."""
        t0 = time.perf_counter()
        received: dict[int, torch.Tensor] = {}
        for dtype in dict.fromkeys(layout.dtypes):
            members = [i for i, d in enumerate(layout.dtypes) if d == dtype]
            flat = torch.empty(
                sum(_numel(layout.shapes[i]) for i in members),
                dtype=getattr(torch, dtype),
                device=self._buffer_device(),
            )
            self.group.broadcast(flat, TRAINER_RANK).wait()
            offset = 0
            for i in members:
                n = _numel(layout.shapes[i])
                received[i] = flat[offset : offset + n].view(layout.shapes[i])
                offset += n
        named = [(layout.names[i], received[i]) for i in range(len(layout.names))]
        return named, TransferStats(layout.num_bytes, time.perf_counter() - t0)

    def close(self) -> None:
        self._group = None
        self._store = None  # type: ignore[assignment]
