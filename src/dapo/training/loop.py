"""The DAPO training loops: Algorithm 1 of the paper, and the same steps with generation one step ahead.

    for step = 1..M:
        sample a batch of prompts; the old policy samples G outputs for each          (generate)
        compute rewards: rule-based +1/-1 plus soft overlong punishment (Eq. 13)      (reward)
        keep groups with 0 < #correct < G (Eq. 11); repeat until the batch is full   (dynamic sampling)
        compute group-relative advantages (Eq. 9)
        for mu iterations: update the policy on mini-batches, maximising J_DAPO (Eq. 8, token-level Eq. 12)
        push the new weights into the rollout engine (and probe that they arrived)
        log metrics; validate every test_freq steps; checkpoint every save_freq steps

``train_sync`` is that, step by step. ``train_one_step_off`` (``async_training.mode=one_step_off``) runs the same
steps with the engine in a rollout worker process that generates step k+1's batch, with the weights of step k-1,
while step k trains; the push waits for that batch, so every sample is at most one version behind the actor
(docs/async.md). Both are short functions over a :class:`~dapo.training.run.Run` (``build_run``: the set-up).

Data parallel (``world``, built by the command line under torchrun): every rank runs this same loop on a replica of
the model, or on its shards (``actor.strategy=fsdp2``: the rollout engine then generates from an unsharded copy that
every weight push refreshes); generation, validation and the update share the work among ranks inside the functions
called here, and every rank ends each of them holding the same groups, metrics and weights. Only rank 0 writes the
run's record (config, metrics, progress, checkpoints of the full state), and every rank resumes from it, on any world
size.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dapo.config import DapoConfig
from dapo.distributed.world import World
from dapo.infra.timing import PhaseTimer
from dapo.training.actor_step import update_actor
from dapo.training.generation import generate_and_filter
from dapo.training.rank_split import is_rollout_rank, serve_rollout_rank
from dapo.training.run import Run, TrainResult, build_run, pick_device, run_dir_of, total_steps_of
from dapo.training.errors import TrainingError
from dapo.training.overlap import Interval, busy_overlap
from dapo.training.staleness import ProducedBatch, sample_lags, staleness_metrics

__all__ = ["TrainResult", "build_run", "pick_device", "run_dir_of", "total_steps_of", "train", "train_fully_async",
           "train_one_step_off", "train_sync"]

log = logging.getLogger(__name__)


def train(cfg: DapoConfig, world: World = World()) -> TrainResult:
    """Build the run, then train it with the loop ``async_training.mode`` names; a rollout rank of a disaggregated
    torchrun job (``rollout.n_gpus_per_node``) serves the trainer rank's generations instead, and trains nothing."""
    if is_rollout_rank(cfg, world):
        serve_rollout_rank(world)
        return TrainResult(run_dir_of(cfg), steps_done=0, wall_s=0.0, peak_rss_mb=0.0)
    run = build_run(cfg, world)
    loops = {"sync": train_sync, "one_step_off": train_one_step_off, "fully_async": train_fully_async}
    try:
        return loops[cfg.async_training.mode](run)
    finally:
        run.close()


def train_sync(run: Run) -> TrainResult:
    """Algorithm 1 (module docstring): generate, filter, update, push, record."""
    cfg, state, policy = run.cfg, run.state, run.policy
    with run.record() as (tracker, progress):
        pending = run.start(tracker, progress)
        for step in range(state.step + 1, run.total_steps + 1):
            timer = run.timer(step=step)
            metrics, pending = pending, {}
            with timer("step"):
                # Lines 3-9: sample, generate G outputs per prompt, reward, dynamic sampling until full.
                groups, generated = generate_and_filter(run.engine, state, policy.tokenizer, cfg, step, timer,
                                                        run.scorer, run.world, on_round=run.perf.count_generated)
                metrics.update(generated)
                run.dump_batch(step, groups)
                if groups:  # lines 10-12, then the new weights go to the engine
                    metrics.update(update_actor(groups, policy, run.optimizer, run.scheduler, cfg, step, timer,
                                                engine_samples_from_actor=run.engine_samples_from_actor,
                                                world=run.world))
                    with timer("sync_weights"):
                        metrics.update(run.sync.push(step))
                else:  # train_on_partial after rounds that kept nothing: there is no gradient to take
                    skipped_update(step, metrics)
            metrics.update(run.perf.metrics(groups, timer.seconds,
                                            recomputed=bool(metrics.get("actor/old_log_prob_recomputed"))))
            pending = run.end_step(step, metrics, timer, tracker, progress)
    return run.result()


def train_one_step_off(run: Run) -> TrainResult:
    """Algorithm 1 with generation one step ahead (module docstring). The batch of step k+1 is generated (by the
    rollout worker, scored and filtered in a thread of this process) while step k trains; the push of step k's
    weights waits for it. At a checkpoint that batch is complete and saved with the run state, so a resumed run
    trains on exactly the samples it would have trained on (docs/async.md)."""
    cfg, state, policy = run.cfg, run.state, run.policy
    producer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-producer")

    def produce(step: int) -> Future[ProducedBatch]:
        version = run.engine.weight_version  # no push until this batch is back: every sample has this version

        def work() -> ProducedBatch:
            timer = PhaseTimer("gen", "reward")
            t0 = time.perf_counter()
            groups, metrics = generate_and_filter(run.engine, state, policy.tokenizer, cfg, step, timer, run.scorer)
            metrics.update(timer.metrics(prefix="timing_s/produce_"))
            t1 = time.perf_counter()
            metrics["async/produce_s"] = t1 - t0
            return ProducedBatch.of_version(groups, metrics, version, busy=[(t0, t1)])

        return producer.submit(work)

    try:
        with run.record() as (tracker, progress):
            pending = run.start(tracker, progress)
            if not state.prefetched and state.step < run.total_steps:
                state.prefetched = [produce(state.step + 1).result()]
            for step in range(state.step + 1, run.total_steps + 1):
                timer = run.timer("train", "wait_rollout", step=step)
                metrics, pending = pending, {}
                step_start = time.perf_counter()
                with timer("step"):
                    batch, state.prefetched = state.prefetched[0], []
                    ahead = produce(step + 1) if step < run.total_steps else None  # the engine works meanwhile
                    trained = train_produced(run, batch, step, timer, metrics)
                    with timer("wait_rollout"):  # the trainer idles while the engine finishes step+1's batch
                        state.prefetched = [ahead.result()] if ahead is not None else []
                    if batch.groups:
                        with timer("sync_weights"):
                            metrics.update(run.sync.push(step))
                # Measured, not min(train_s, produce_s): the time both were busy at once (0 for a serial run).
                producing = state.prefetched[0].busy if state.prefetched else []
                metrics.update(_overlap_metrics(trained, producing, (step_start, time.perf_counter())))
                metrics["async/trainer_idle_s"] = timer.seconds["wait_rollout"]
                pending = run.end_step(step, metrics, timer, tracker, progress)
    finally:
        producer.shutdown(wait=False, cancel_futures=True)
    return run.result()


def train_fully_async(run: Run) -> TrainResult:
    """Algorithm 1 with a rollout worker that generates continuously (``async_training.mode=fully_async``).

    A producer thread builds batch j (generation in the worker, scoring and Eq. 11 filtering here) as soon as the
    weights the worker holds are at most ``staleness_threshold`` versions behind the actor that will train on it
    (step j trains the weights of step j-1, so batch j starts once step j-1-s is pushed): no sample is ever older,
    and every batch is checked before it trains. The trainer pushes after every update without waiting for the
    generation in flight; with ``partial_rollout`` the worker loads the push between two segments of a request and
    the samples continue under the new weights, each token tagged with the version that drew it.

    Checkpoint: the batches complete at the save are saved with the generation state right after the last of them;
    a batch still generating is dropped and, after a resume, regenerated from the same seeds (docs/async.md)."""
    cfg, state, policy = run.cfg, run.state, run.policy
    bound = cfg.async_training.staleness_threshold
    arrived = threading.Condition()
    ready: collections.deque[ProducedBatch] = collections.deque(state.prefetched)
    state.prefetched = []
    shared: dict[str, Any] = {"actor_version": state.step, "stop": False, "error": None,
                              "snapshot": _generation_state(state), "busy": [], "busy_since": None}

    def producer_busy(since: float) -> list[Interval]:
        """The producer's busy intervals ending after ``since`` (one still running ends now); older ones dropped."""
        with arrived:
            shared["busy"] = [(s, e) for s, e in shared["busy"] if e >= since]
            running = [] if shared["busy_since"] is None else [(shared["busy_since"], time.perf_counter())]
            return shared["busy"] + running

    def produce() -> None:
        try:
            for j in range(state.step + 1 + len(ready), run.total_steps + 1):
                with arrived:
                    arrived.wait_for(lambda: shared["stop"] or shared["actor_version"] >= j - 1 - bound)
                    if shared["stop"]:
                        return
                versions: dict[int, list[list[int]]] = {}
                timer = PhaseTimer("gen", "reward")
                t0 = time.perf_counter()
                with arrived:
                    shared["busy_since"] = t0
                groups, metrics = generate_and_filter(run.engine, state, policy.tokenizer, cfg, j, timer, run.scorer,
                                                      versions=versions)
                metrics.update(timer.metrics(prefix="timing_s/produce_"))
                t1 = time.perf_counter()
                metrics["async/produce_s"] = t1 - t0
                batch = ProducedBatch(groups, metrics, [versions[id(g)] for g in groups], busy=[(t0, t1)])
                with arrived:
                    shared["busy"].append((t0, t1))
                    shared["busy_since"] = None
                    ready.append(batch)
                    shared["snapshot"] = _generation_state(state)
                    arrived.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread, which raises it
            with arrived:
                shared["error"] = exc
                arrived.notify_all()

    def checkpoint_state() -> _AsyncCheckpoint:
        with arrived:
            return _AsyncCheckpoint(state.step, state.val_history, shared["snapshot"], list(ready))

    producer = threading.Thread(target=produce, name="dapo-producer", daemon=True)
    try:
        with run.record() as (tracker, progress):
            pending = run.start(tracker, progress)
            producer.start()
            for step in range(state.step + 1, run.total_steps + 1):
                timer = run.timer("train", "wait_rollout", step=step)
                metrics, pending = pending, {}
                step_start = time.perf_counter()
                with timer("step"):
                    with timer("wait_rollout"), arrived:
                        arrived.wait_for(lambda: bool(ready) or shared["error"] is not None)
                        if not ready:
                            raise shared["error"]
                        batch = ready.popleft()
                    lags = sample_lags(batch, actor_version=step - 1)
                    if max(lags, default=0) > bound:  # cannot happen by construction; never train on it if it does
                        raise TrainingError(f"step {step}: a sample lags {max(lags)} weight versions behind the actor, "
                                            f"more than async_training.staleness_threshold={bound}")
                    trained = train_produced(run, batch, step, timer, metrics)
                    with timer("sync_weights"):
                        metrics.update(run.sync.push(step))
                    with arrived:
                        shared["actor_version"] = step
                        arrived.notify_all()
                metrics["async/trainer_idle_s"] = timer.seconds["wait_rollout"]
                # Whatever the producer generated while this step ran (the batches after this one), measured.
                window = (step_start, time.perf_counter())
                metrics.update(_overlap_metrics(trained, producer_busy(since=step_start), window))
                pending = run.end_step(step, metrics, timer, tracker, progress, checkpoint_state)
    finally:
        with arrived:
            shared["stop"] = True
            arrived.notify_all()
    return run.result()


def _generation_state(state) -> dict[str, Any]:
    """What the producer's side of the run state is right now (sampler, buffer, token totals)."""
    full = state.state_dict()
    return {key: full[key] for key in ("sampler", "accumulator", "token_totals")}


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


def _overlap_metrics(trained: Interval, producing: list[Interval], window: Interval) -> dict[str, float]:
    """``async/overlap_s``: seconds the trainer's update (``trained``) and the producer's work (``producing``) ran at
    once; ``async/engine_idle_s``: seconds of the step's ``window`` in which the producer did nothing."""
    return {"async/overlap_s": busy_overlap([trained], producing),
            "async/engine_idle_s": (window[1] - window[0]) - busy_overlap([window], producing)}


def train_produced(run: Run, batch: ProducedBatch, step: int, timer: PhaseTimer,
                   metrics: dict[str, float]) -> Interval:
    """Both asynchronous loops: step ``step`` trains on a batch the engine produced with older weights (the actor is
    at version step-1), recording the batch's own metrics and its staleness. Returns the perf_counter interval of the
    update (async/overlap_s)."""
    metrics.update(batch.metrics)
    metrics.update(staleness_metrics(batch, actor_version=step - 1))
    run.dump_batch(step, batch.groups, batch)
    start = time.perf_counter()
    with timer("train"):
        if batch.groups:
            metrics.update(update_actor(batch.groups, run.policy, run.optimizer, run.scheduler, run.cfg, step, timer,
                                        world=run.world, off_policy=True))
        else:
            skipped_update(step, metrics)
    return start, time.perf_counter()


def skipped_update(step: int, metrics: dict[str, float]) -> None:
    log.warning("step %d: no informative group after %d rounds; skipping the update", step,
                int(metrics["train/num_gen_batches"]))
