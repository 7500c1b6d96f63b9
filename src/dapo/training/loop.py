"""The DAPO training loops: Algorithm 1 of the paper, and the same steps with generation one step ahead.

    for step = 1..M:
        sample a batch of prompts; the old policy samples G outputs for each          (generate)
        compute rewards: rule-based +1/-1 plus soft overlong punishment (Eq. 13)      (reward)
        keep groups with 0 < #correct < G (Eq. 11); repeat until the batch is full   (dynamic sampling)
        compute group-relative advantages (Eq. 9)
        for mu iterations: update the policy on mini-batches, maximising J_DAPO (Eq. 8, token-level Eq. 12)
        push the new weights into the rollout engine (and probe that they arrived)
        log metrics; validate every test_freq steps; checkpoint every save_freq steps

``train_loop`` is that, step by step, written once for every ``async_training.mode``: where a step's batch comes
from is a source (``dapo.training.batch_source``). ``sync`` generates it inline, now; ``one_step_off`` and
``fully_async`` take it from a producer that generates ahead in a rollout worker process, within a staleness bound
(``dapo.training.producers``, docs/async.md). The loop is a short function over a :class:`~dapo.training.run.Run`
(``build_run``: the set-up).

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

from dapo.config import DapoConfig
from dapo.distributed.world import World
from dapo.rollout.worker import RolloutWorkerDied
from dapo.training.actor_step import update_actor
from dapo.training.batch_source import BatchSource, InlineSource
from dapo.training.overlap import busy_overlap
from dapo.training.producers import FullyAsyncSource, OneStepOffSource
from dapo.training.push_schedule import PushSchedule
from dapo.training.rank_split import serve_rollout_rank, split_job
from dapo.training.shared_source import SharedSource
from dapo.training.run import Run, TrainResult, build_run, pick_device, run_dir_of, total_steps_of
from dapo.training.staleness import staleness_metrics

__all__ = ["TrainResult", "build_run", "pick_device", "run_dir_of", "total_steps_of", "train", "train_loop"]

log = logging.getLogger(__name__)

# async_training.mode -> the source of its batches (validated by the config schema)
SOURCES: dict[str, type] = {"sync": InlineSource, "one_step_off": OneStepOffSource, "fully_async": FullyAsyncSource}


def train(cfg: DapoConfig, world: World = World()) -> TrainResult:
    """Build the run, then train it on batches from the source ``async_training.mode`` names; a rollout rank of a
    disaggregated torchrun job (``rollout.n_gpus_per_node``) serves the trainer rank's generations instead, and
    trains nothing."""
    split = split_job(cfg, world)  # every rank: the trainer ranks' group is made over the whole job
    if split.trainers is None:
        serve_rollout_rank(cfg, world)
        return TrainResult(run_dir_of(cfg), steps_done=0, wall_s=0.0, peak_rss_mb=0.0)
    run = build_run(cfg, world, split)
    try:
        kind = SOURCES[cfg.async_training.mode]
        source = (
            kind(run)
            if not split.shares_batches
            else SharedSource(kind(run) if split.leads_rollout else None, run.world, kind)
        )
        with run.batch_invariance(), run.routing_replay():
            return train_loop(run, source)
    finally:
        run.close()


def train_loop(run: Run, source: BatchSource) -> TrainResult:
    """Algorithm 1 (module docstring): take a batch, update, push, record; ``source`` says where batches come from."""
    cfg = run.cfg
    pushes = PushSchedule.of_run(run)  # every step, or every trigger_parameter_sync_step steps (async modes)
    trained_since_push = False
    try:
        with run.record() as (tracker, progress):
            pending = run.start(tracker, progress)
            source.start()
            for step in range(run.state.step + 1, run.total_steps + 1):
                timer = run.timer("train", "wait_rollout", step=step)
                metrics, pending = pending, {}
                step_start = time.perf_counter()
                with timer("step"):
                    # Lines 3-9: sample, generate G outputs per prompt, reward, dynamic sampling until full.
                    batch = source.next_batch(step, timer)
                    metrics.update(batch.metrics)
                    metrics.update(staleness_metrics(batch, actor_version=step - 1))
                    run.dump_batch(step, batch.groups, with_versions=source.off_policy)
                    train_start = time.perf_counter()
                    with timer("train"):  # lines 10-12
                        if batch.groups:
                            metrics.update(
                                update_actor(
                                    batch.groups,
                                    run.policy,
                                    run.optimizer,
                                    run.scheduler,
                                    cfg,
                                    step,
                                    timer,
                                    engine_samples_from_actor=run.engine_samples_from_actor and not source.off_policy,
                                    world=run.world,
                                    off_policy=source.off_policy,
                                    teachers=run.teachers,
                                )
                            )
                        else:  # train_on_partial after rounds that kept nothing: there is no gradient to take
                            skipped_update(step, metrics)
                    trained = (train_start, time.perf_counter())
                    source.before_push(step, timer)
                    trained_since_push = trained_since_push or bool(batch.groups)
                    pushed = pushes.due(step) and (trained_since_push or source.pushes_every_step)
                    if pushed:  # the new weights go to the engine
                        with timer("sync_weights"):
                            try:
                                metrics.update(run.sync.push(step))
                            except RolloutWorkerDied as death:  # a new worker gets them (restart_engine)
                                run.restart_engine(death, version=step)
                                metrics.update(run.engine.last_push)
                        trained_since_push = False
                        source.after_push(step)
                    metrics["async/weight_pushed"] = float(pushed)
                # Measured, not min(train_s, produce_s): the time the update and the producer were busy at once (0
                # for the inline source), and the time of the step the producer did nothing.
                window = (step_start, time.perf_counter())
                producing = source.busy_since(step_start)
                metrics["async/overlap_s"] = busy_overlap([trained], producing)
                metrics["async/engine_idle_s"] = (window[1] - window[0]) - busy_overlap([window], producing)
                metrics["async/trainer_idle_s"] = timer.seconds["wait_rollout"]
                run.perf.count_generated(batch.generated)
                metrics.update(
                    run.perf.metrics(
                        batch.groups,
                        {**timer.seconds, "gen": batch.gen_s},
                        recomputed=bool(metrics.get("actor/old_log_prob_recomputed")),
                    )
                )
                pending = run.end_step(step, metrics, timer, tracker, progress, source.checkpoint_state())
    finally:
        source.close()
    return run.result()


def skipped_update(step: int, metrics: dict[str, float]) -> None:
    log.warning(
        "step %d: no informative group after %d rounds; skipping the update",
        step,
        int(metrics["train/num_gen_batches"]),
    )
