"""Batch sources that generate ahead of the trainer, in a rollout worker, within a staleness bound (docs/async.md).

A producer builds batch j (generation in the worker, scoring and the Eq. 11 filter in a thread of this process)
while the trainer updates on an earlier batch. Each token carries the version of the weights that drew it
(``ScoredGroup.token_versions``); the loop trains step j with the actor at version j-1, so a sample's lag is
(j-1) - (its oldest token's version).

- ``OneStepOffSource`` (``async_training.mode=one_step_off``): bound 1, exactly. Batch j+1 is generated while step j
  trains, under the weights of step j-1, and the push of step j waits for it; a checkpoint saves it complete.
- ``FullyAsyncSource`` (``fully_async``): batch j starts as soon as the engine's weights are at most
  ``staleness_threshold`` versions behind step j's actor (once step j-1-s is pushed); the trainer pushes without
  waiting, and with ``partial_rollout`` a push lands between two segments of a running request.

With ``trigger_parameter_sync_step=k`` the pushes come every k steps and the bounds are those of
``dapo.training.push_schedule`` (k=1: the above). Either source checks every batch against its bound before it
trains, and with ``carry_over_surplus`` drops the carried groups that would train past it (``generate_and_filter``'s
``oldest_version``).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from dapo.infra.timing import PhaseTimer
from dapo.rollout.worker import RolloutWorkerDied
from dapo.training.errors import TrainingError
from dapo.training.generation import generate_and_filter
from dapo.training.overlap import Interval
from dapo.training.push_schedule import PushSchedule
from dapo.training.run import Run
from dapo.training.staleness import ProducedBatch, sample_lags, stamp_versions


def produce_batch(run: Run, step: int, version: int, bound: int) -> ProducedBatch:
    """Batch ``step``, generated now by the engine (in its worker) and scored and filtered here, timed for the
    record (``timing_s/produce_*``, ``async/produce_s``); tokens the engine did not tag get ``version`` as they are
    generated (so a carried surplus group keeps its own), and no token of the batch lags more than ``bound`` versions
    behind step ``step``'s actor (carried groups that would are dropped and refilled)."""
    timer = PhaseTimer("gen", "reward")
    generated: list = []

    def on_round(groups: list) -> None:
        stamp_versions(groups, version)
        generated.extend(groups)

    t0 = time.perf_counter()
    groups, metrics = generate_and_filter(
        run.engine,
        run.state,
        run.policy.tokenizer,
        run.cfg,
        step,
        timer,
        run.scorer,
        on_round=on_round,
        oldest_version=step - 1 - bound,
    )
    metrics.update(timer.metrics(prefix="timing_s/produce_"))
    t1 = time.perf_counter()
    metrics["async/produce_s"] = t1 - t0
    return ProducedBatch.stamped(
        groups, metrics, version, busy=[(t0, t1)], generated=generated, gen_s=timer.seconds["gen"]
    )


def check_bound(batch: ProducedBatch, step: int, bound: int, source: str) -> ProducedBatch:
    """``batch``, unless a sample of it lags more than ``bound`` versions behind step ``step``'s actor: that cannot
    happen by construction, and such a batch never trains."""
    lags = sample_lags(batch, actor_version=step - 1)
    if max(lags, default=0) > bound:
        raise TrainingError(
            f"step {step}: a sample lags {max(lags)} weight versions behind the actor, more than {source}"
        )
    return batch


class OneStepOffSource:
    """Bound 1 by construction (k with pushes every k steps): no push happens while a batch is generated, so every
    sample of a batch has the version the engine held when it started, and that is the actor's version or the one
    before (module docstring).
    The batch ahead is kept in the run state (``state.prefetched``): a checkpoint saves it, and a resumed run trains on
    exactly the samples it would have trained on."""

    off_policy = True
    pushes_every_step = False

    def __init__(self, run: Run) -> None:
        self.run = run
        self.bound = PushSchedule.of_run(run).one_step_off_bound()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-producer")
        self._ahead: Future[ProducedBatch] | None = None
        self._busy: list[Interval] = []

    def _produce(self, step: int) -> Future[ProducedBatch]:
        version = self.run.engine.weight_version  # no push until this batch is back: every sample has this version
        self._before = (step, self.run.state.generation_state())  # to generate it again if the worker dies
        return self._pool.submit(produce_batch, self.run, step, version, self.bound)

    def _result(self, ahead: Future[ProducedBatch], actor_version: int) -> ProducedBatch:
        """The batch ``ahead``; if the worker died generating it, a new worker (given the actor's weights,
        ``actor_version``) generates it again from the same prompts and seeds, here."""
        try:
            return ahead.result()
        except RolloutWorkerDied as death:
            step, before = self._before
            self.run.state.load_generation_state(before)
            self.run.restart_engine(death, version=actor_version)
            return produce_batch(self.run, step, version=self.run.engine.weight_version, bound=self.bound)

    def start(self) -> None:
        state = self.run.state
        if not state.prefetched and state.step < self.run.total_steps:
            state.prefetched = [self._result(self._produce(state.step + 1), actor_version=state.step)]

    def next_batch(self, step: int, timer: PhaseTimer) -> ProducedBatch:
        state = self.run.state
        batch, state.prefetched = state.prefetched[0], []
        self._ahead = self._produce(step + 1) if step < self.run.total_steps else None  # the engine works meanwhile
        return check_bound(
            batch,
            step,
            self.bound,
            f"one_step_off's {self.bound} (async_training.trigger_parameter_sync_step={self.bound})",
        )

    def before_push(self, step: int, timer: PhaseTimer) -> None:
        with timer("wait_rollout"):  # the trainer idles while the engine finishes step+1's batch
            self.run.state.prefetched = (
                [self._result(self._ahead, actor_version=step)] if self._ahead is not None else []
            )
        self._busy = list(self.run.state.prefetched[0].busy) if self.run.state.prefetched else []

    def after_push(self, step: int) -> None:
        pass

    def busy_since(self, since: float) -> list[Interval]:
        return [(s, e) for s, e in self._busy if e >= since]

    def checkpoint_state(self) -> Callable[[], Any] | None:
        return None  # the run state, which holds the complete batch ahead

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class FullyAsyncSource:
    """The producer thread runs ahead of the trainer as far as ``staleness_threshold`` allows (module docstring);
    every batch is checked before it trains. Checkpoint: the batches complete at the save are saved with the
    generation state right after the last of them; a batch still generating is dropped and, after a resume,
    regenerated from the same seeds (docs/async.md)."""

    off_policy = True
    pushes_every_step = True

    def __init__(self, run: Run) -> None:
        self.run = run
        self.threshold = run.cfg.async_training.staleness_threshold
        self.schedule = PushSchedule.of_run(run)
        self.bound = self.schedule.fully_async_bound(self.threshold)
        self._cond = threading.Condition()
        self._ready: collections.deque[ProducedBatch] = collections.deque(run.state.prefetched)
        run.state.prefetched = []
        self._pushed = run.state.step  # the engine's newest weights: the run's first push
        self._stop = False
        self._error: BaseException | None = None
        self._snapshot = run.state.generation_state()
        self._busy: list[Interval] = []
        self._busy_since: float | None = None
        self._thread = self._producer_thread()

    def _producer_thread(self) -> threading.Thread:
        return threading.Thread(target=self._produce_all, name="dapo-producer", daemon=True)

    def _produce_all(self) -> None:
        run = self.run
        try:
            for j in range(run.state.step + 1 + len(self._ready), run.total_steps + 1):
                with self._cond:
                    oldest = self.schedule.fully_async_start(j, self.threshold)
                    self._cond.wait_for(lambda: self._stop or self._pushed >= oldest)
                    if self._stop:
                        return
                    self._busy_since = time.perf_counter()
                batch = produce_batch(run, j, version=run.engine.weight_version, bound=self.bound)
                with self._cond:
                    self._busy += batch.busy
                    self._busy_since = None
                    self._ready.append(batch)
                    self._snapshot = run.state.generation_state()
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def start(self) -> None:
        self._thread.start()

    def next_batch(self, step: int, timer: PhaseTimer) -> ProducedBatch:
        with timer("wait_rollout"):
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: bool(self._ready) or self._error is not None)
                    if self._ready:
                        batch = self._ready.popleft()
                        break
                    error, self._error = self._error, None
                if not isinstance(error, RolloutWorkerDied):
                    raise error
                self._survive(error, actor_version=step - 1)
        k = self.schedule.every
        return check_bound(
            batch,
            step,
            self.bound,
            f"async_training.staleness_threshold={self.threshold}"
            + (f" allows ({self.bound} with trigger_parameter_sync_step={k})" if k > 1 else ""),
        )

    def before_push(self, step: int, timer: PhaseTimer) -> None:
        pass

    def _survive(self, death: RolloutWorkerDied, actor_version: int) -> None:
        """The worker died under the producer: back to the generation state after the last complete batch, a new
        worker with the actor's weights, and a new producer thread that generates the lost batch again from the
        same seeds (as a resumed run does, docs/async.md)."""
        self._thread.join()
        self.run.restart_engine(death, version=actor_version)
        with self._cond:
            self.run.state.load_generation_state(self._snapshot)
            self._busy_since = None
        self._thread = self._producer_thread()
        self._thread.start()

    def after_push(self, step: int) -> None:
        with self._cond:
            self._pushed = step
            self._cond.notify_all()

    def busy_since(self, since: float) -> list[Interval]:
        """The producer's busy intervals ending after ``since`` (one still running ends now); older ones dropped."""
        with self._cond:
            self._busy = [(s, e) for s, e in self._busy if e >= since]
            running = [] if self._busy_since is None else [(self._busy_since, time.perf_counter())]
            return self._busy + running

    def checkpoint_state(self) -> Callable[[], Any] | None:
        def snapshot() -> _AsyncCheckpoint:
            with self._cond:
                state = self.run.state
                return _AsyncCheckpoint(state.step, state.val_history, self._snapshot, list(self._ready))

        return snapshot

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()


@dataclasses.dataclass
class _AsyncCheckpoint:
    """The run state a fully asynchronous checkpoint saves: the trainer's step and validation history, the generation
    state after the last complete batch, and the complete batches not yet trained."""

    step: int
    val_history: list
    generation: dict[str, Any]
    prefetched: list[ProducedBatch]

    def state_dict(self) -> dict[str, Any]:
        state = {"step": self.step, **copy.deepcopy(self.generation), "val_history": list(self.val_history)}
        if self.prefetched:
            state["prefetched"] = [batch.state_dict() for batch in self.prefetched]
        return state
