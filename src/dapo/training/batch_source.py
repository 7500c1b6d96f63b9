"""Where the training loop's batches come from: a source hands each step a batch ready to train.

The loop (``dapo.training.loop.train_loop``) is written once; a source decides when and with which weights a batch is
generated. ``InlineSource`` generates it now, with the weights the actor holds (Algorithm 1, ``async_training.mode=
sync``); the producers of ``dapo.training.producers`` generate ahead in a rollout worker, within a staleness bound.

What the loop calls, in order, each step (``BatchSource``):

    batch = source.next_batch(step, timer)     # the groups step ``step`` trains on, each token tagged with a version
    ... update the actor on batch.groups ...
    source.before_push(step, timer)            # one-step-off: wait for the batch in flight (it must not see the push)
    ... push the weights of ``step`` into the engine ...
    source.after_push(step)                    # after a push: the producer may start batches this version allows
    source.busy_since(t)                       # the producer's busy intervals, for the measured overlap
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from dapo.infra.timing import PhaseTimer
from dapo.training.generation import generate_and_filter
from dapo.training.overlap import Interval
from dapo.training.run import Run
from dapo.training.staleness import ProducedBatch


class BatchSource(Protocol):
    """What the training loop needs from a source of batches (module docstring)."""

    # The batch was drawn by weights older than the actor's: the update recomputes pi_old, and the record and the
    # batch dump say each sample's version and lag.
    off_policy: bool
    # Push after every push step (every step, or every trigger_parameter_sync_step steps), also one that trained
    # nothing: the producer's staleness bound counts pushes. The others push when the weights changed since the last.
    pushes_every_step: bool

    def start(self) -> None: ...

    def next_batch(self, step: int, timer: PhaseTimer) -> ProducedBatch: ...

    def before_push(self, step: int, timer: PhaseTimer) -> None: ...

    def after_push(self, step: int) -> None: ...

    def busy_since(self, since: float) -> list[Interval]: ...

    def checkpoint_state(self) -> Callable[[], Any] | None: ...

    def close(self) -> None: ...


class InlineSource:
    """Algorithm 1's lines 3-9, now: sample prompts, generate G outputs each, reward, dynamic sampling until the
    batch is full, with the weights the actor holds (every token has version step-1: lag 0)."""

    off_policy = False
    pushes_every_step = False

    def __init__(self, run: Run) -> None:
        self.run = run
        self._busy: list[Interval] = []

    def start(self) -> None:
        pass

    def next_batch(self, step: int, timer: PhaseTimer) -> ProducedBatch:
        run, generated = self.run, []
        t0 = time.perf_counter()
        groups, metrics = generate_and_filter(
            run.engine,
            run.state,
            run.policy.tokenizer,
            run.cfg,
            step,
            timer,
            run.scorer,
            run.world,
            on_round=generated.extend,
        )
        self._busy = [(t0, time.perf_counter())]
        return ProducedBatch.stamped(
            groups, metrics, step - 1, busy=list(self._busy), generated=generated, gen_s=timer.seconds["gen"]
        )

    def before_push(self, step: int, timer: PhaseTimer) -> None:
        pass

    def after_push(self, step: int) -> None:
        pass

    def busy_since(self, since: float) -> list[Interval]:
        return [(s, e) for s, e in self._busy if e >= since]

    def checkpoint_state(self) -> Callable[[], Any] | None:
        return None  # the run state itself

    def close(self) -> None:
        pass
