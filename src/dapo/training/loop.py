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

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from dapo.config import DapoConfig
from dapo.distributed.world import World
from dapo.infra.timing import PhaseTimer
from dapo.training.actor_step import update_actor
from dapo.training.generation import generate_and_filter
from dapo.training.run import Run, TrainResult, build_run, pick_device, run_dir_of, total_steps_of
from dapo.training.staleness import ProducedBatch, staleness_metrics

__all__ = ["TrainResult", "build_run", "pick_device", "run_dir_of", "total_steps_of", "train", "train_one_step_off",
           "train_sync"]

log = logging.getLogger(__name__)


def train(cfg: DapoConfig, world: World = World()) -> TrainResult:
    """Build the run, then train it with the loop ``async_training.mode`` names."""
    run = build_run(cfg, world)
    try:
        return train_sync(run) if cfg.async_training.mode == "sync" else train_one_step_off(run)
    finally:
        run.close()


def train_sync(run: Run) -> TrainResult:
    """Algorithm 1 (module docstring): generate, filter, update, push, record."""
    cfg, state, policy = run.cfg, run.state, run.policy
    with run.record() as (tracker, progress):
        pending = run.start(tracker)
        for step in range(state.step + 1, run.total_steps + 1):
            timer = run.timer()
            metrics, pending = pending, {}
            with timer("step"):
                # Lines 3-9: sample, generate G outputs per prompt, reward, dynamic sampling until full.
                groups, generated = generate_and_filter(run.engine, state, policy.tokenizer, cfg, step, timer,
                                                        run.scorer, run.world)
                metrics.update(generated)
                if groups:  # lines 10-12, then the new weights go to the engine
                    metrics.update(update_actor(groups, policy, run.optimizer, run.scheduler, cfg, step, timer,
                                                engine_samples_from_actor=run.engine_samples_from_actor,
                                                world=run.world))
                    with timer("sync_weights"):
                        metrics.update(run.sync.push(step))
                else:  # train_on_partial after rounds that kept nothing: there is no gradient to take
                    skipped_update(step, metrics)
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
            metrics["async/produce_s"] = time.perf_counter() - t0
            return ProducedBatch.of_version(groups, metrics, version)

        return producer.submit(work)

    try:
        with run.record() as (tracker, progress):
            pending = run.start(tracker)
            if state.prefetched is None and state.step < run.total_steps:
                state.prefetched = produce(state.step + 1).result()
            for step in range(state.step + 1, run.total_steps + 1):
                timer = run.timer("train", "wait_rollout")
                metrics, pending = pending, {}
                with timer("step"):
                    batch, state.prefetched = state.prefetched, None
                    assert batch is not None
                    ahead = produce(step + 1) if step < run.total_steps else None  # the engine works meanwhile
                    metrics.update(batch.metrics)
                    metrics.update(staleness_metrics(batch, actor_version=step - 1))
                    with timer("train"):
                        if batch.groups:
                            metrics.update(update_actor(batch.groups, policy, run.optimizer, run.scheduler, cfg,
                                                        step, timer, world=run.world, off_policy=True))
                        else:
                            skipped_update(step, metrics)
                    with timer("wait_rollout"):  # the trainer idles while the engine finishes step+1's batch
                        state.prefetched = ahead.result() if ahead is not None else None
                    if batch.groups:
                        with timer("sync_weights"):
                            metrics.update(run.sync.push(step))
                train_s, wait_s = timer.seconds["train"], timer.seconds["wait_rollout"]
                produce_s = state.prefetched.metrics["async/produce_s"] if state.prefetched else 0.0
                metrics["async/overlap_s"] = min(train_s, produce_s)  # both sides busy
                metrics["async/trainer_idle_s"] = wait_s
                metrics["async/engine_idle_s"] = max(0.0, timer.seconds["step"] - produce_s)
                pending = run.end_step(step, metrics, timer, tracker, progress)
    finally:
        producer.shutdown(wait=False, cancel_futures=True)
    return run.result()


def skipped_update(step: int, metrics: dict[str, float]) -> None:
    log.warning("step %d: no informative group after %d rounds; skipping the update", step,
                int(metrics["train/num_gen_batches"]))
