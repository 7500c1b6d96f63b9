"""One batch source for several trainer ranks: the leading trainer rank runs it, the others receive its batches.

When rollout ranks of their own serve the trainer (``dapo.training.rank_split``), only the leading trainer rank talks
to the engines, so only it can run a producer (``dapo.training.producers``). Every trainer rank still trains on the
whole batch of every step (``update_actor`` shares the update among them, as data parallel does), so the leader hands
each batch over the trainer group right after taking it. Everything else the loop asks of a source (waiting before a
push, releasing the producer after it, its busy intervals, the checkpoint's snapshot) is the leader's business; on the
other ranks it is nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from dapo.distributed.world import World
from dapo.infra.timing import PhaseTimer
from dapo.training.batch_source import BatchSource
from dapo.training.overlap import Interval
from dapo.training.staleness import ProducedBatch


class SharedSource:
    """``inner`` on the leading rank (rank 0 of ``trainers``), None on the others; ``kind`` is the source class the
    mode names, whose flags every rank must agree on (they decide the update's collectives)."""

    def __init__(self, inner: BatchSource | None, trainers: World, kind: type) -> None:
        if (inner is None) == trainers.is_main:
            raise ValueError("SharedSource: the leading trainer rank runs the source, and only it")
        self.inner, self.trainers = inner, trainers
        self.off_policy: bool = kind.off_policy
        self.pushes_every_step: bool = kind.pushes_every_step

    def start(self) -> None:
        if self.inner is not None:
            self.inner.start()

    def next_batch(self, step: int, timer: PhaseTimer) -> ProducedBatch:
        if self.inner is not None:
            return self.trainers.broadcast_object(self.inner.next_batch(step, timer))
        # The other ranks wait here while the leader waits for its producer: the trainer group's timeout
        # (trainer.stall_timeout_s) bounds it, and the leader's own stall deadline fires first.
        with timer("wait_rollout"):
            return self.trainers.broadcast_object(None)

    def before_push(self, step: int, timer: PhaseTimer) -> None:
        if self.inner is not None:
            self.inner.before_push(step, timer)

    def after_push(self, step: int) -> None:
        if self.inner is not None:
            self.inner.after_push(step)

    def busy_since(self, since: float) -> list[Interval]:
        return self.inner.busy_since(since) if self.inner is not None else []

    def checkpoint_state(self) -> Callable[[], Any] | None:
        return self.inner.checkpoint_state() if self.inner is not None else None

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
