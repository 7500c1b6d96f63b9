"""The DAPO training loop: Algorithm 1 of the paper, and nothing else.

    for step = 1..M:
        sample a batch of prompts; the old policy samples G outputs for each          (generate)
        compute rewards: rule-based +1/-1 plus soft overlong punishment (Eq. 13)      (reward)
        keep groups with 0 < #correct < G (Eq. 11); repeat until the batch is full   (dynamic sampling)
        compute group-relative advantages (Eq. 9)
        for mu iterations: update the policy on mini-batches, maximising J_DAPO (Eq. 8, token-level Eq. 12)
        push the new weights into the rollout engine (and probe that they arrived)
        log metrics; validate every test_freq steps; checkpoint every save_freq steps

Each piece is a function from a lower layer or a sibling module of this package; this file only calls them in order.
The engine is whatever ``rollout.name`` chose: the loop sees only the ``RolloutEngine`` interface.

Data parallel (``world``, built by the command line under torchrun): every rank runs this same loop on a replica of
the model, or on its shards (``actor.strategy=fsdp2``: the rollout engine then generates from an unsharded copy that
every weight push refreshes); generation, validation and the update share the work among ranks inside the functions
called here, and every rank ends each of them holding the same groups, metrics and weights. Only rank 0 writes the
run's record (config, metrics, progress, checkpoints of the full state), and every rank resumes from it, on any world
size.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.config import ConfigError, DapoConfig, config_to_dict
from dapo.config.loading import tracker_backends
from dapo.config.resume import check_resume
from dapo.data.prompt_sampler import PromptSampler
from dapo.data.task import encode_task, read_task
from dapo.distributed.data_parallel import check_tensor_parallel
from dapo.distributed.fsdp import check_strategy, shard_actor
from dapo.distributed.world import World
from dapo.evaluation.validation import repeated_prompt_warning, val_acc_key
from dapo.infra.atomic import atomic_write, describe_os_error
from dapo.infra.checkpoint import CheckpointError
from dapo.infra.cleanup import close_quietly
from dapo.infra.progress import TrainingProgress
from dapo.infra.memory import PeakMemory
from dapo.infra.timing import PhaseTimer
from dapo.infra.tracking import Tracker, truncate_metrics_after
from dapo.model.hub import HubResolveError, resolve_data_config
from dapo.model.loading import load_policy
from dapo.reward.custom_fn import load_custom_reward_fn
from dapo.reward.scored_groups import reward_scorer_of
from dapo.rollout.factory import build_rollout_engine, engine_compute_dtype, hf_engine_copy, samples_from_module
from dapo.training.actor_step import update_actor
from dapo.training.dynamic_sampling_buffer import DynamicSamplingBuffer
from dapo.training.errors import TrainingError
from dapo.training.generation import derive_seed, engine_tensor_parallel, generate_and_filter, validate_across_ranks
from dapo.training.tool_use import with_tool_rollout
from dapo.training.run_state import RunState, checkpoint_format, find_resume_checkpoint, resume_run, save_run
from dapo.training.weight_sync import WeightSync

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    wall_s: float
    peak_rss_mb: float
    val_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    steps_run: int = 0  # steps trained by this call (0: the run was already finished)

    def val_acc(self, index: int) -> float | None:
        if not self.val_history:
            return None
        metrics = self.val_history[index][1]
        key = val_acc_key(metrics)
        return metrics[key] if key else None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("trainer.device=cuda but no CUDA device is available")
    return torch.device(name)


def run_dir_of(cfg: DapoConfig) -> Path:
    return Path(cfg.trainer.default_local_dir) / cfg.trainer.experiment_name


def total_steps_of(cfg: DapoConfig, num_train_prompts: int) -> int:
    if cfg.trainer.total_training_steps is not None:
        return cfg.trainer.total_training_steps
    return max(1, cfg.trainer.total_epochs * num_train_prompts // cfg.data.train_batch_size)


def check_custom_reward(cfg: DapoConfig) -> None:
    """Fail now, not at the first generation round, if the custom reward function cannot be loaded."""
    custom = cfg.custom_reward_function
    if custom.path is not None:
        try:
            load_custom_reward_fn(f"{custom.path}:{custom.name}")
        except (OSError, ImportError, AttributeError, TypeError, ValueError) as exc:
            raise TrainingError(f"custom_reward_function: {exc}") from exc


def train(cfg: DapoConfig, world: World = World()) -> TrainResult:
    wall0 = time.perf_counter()
    memory = PeakMemory()  # per-phase peaks reset the kernel's high-water mark, so the run's peak is kept here
    if cfg.trainer.num_threads is not None:
        torch.set_num_threads(cfg.trainer.num_threads)
    random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)
    run_dir = run_dir_of(cfg)
    check_custom_reward(cfg)
    try:
        data_cfg = resolve_data_config(cfg.data)
    except HubResolveError as exc:
        raise TrainingError(str(exc)) from None
    records = read_task(data_cfg)  # every file and row checked before seconds go into loading the model

    try:
        check_strategy(cfg.actor, world)
        check_tensor_parallel(world, engine_tensor_parallel(cfg))
    except ValueError as exc:
        raise TrainingError(str(exc)) from None
    policy = load_policy(cfg.model, device=pick_device(cfg.trainer.device))
    # The Transformers engine's own copy (before sharding: the same architecture and weights), when the actor is
    # sharded or rollout.dtype differs from the actor's; None: it shares the actor's module.
    engine_module = hf_engine_copy(cfg, policy.model, sharded=cfg.actor.strategy == "fsdp2")
    if cfg.actor.strategy == "fsdp2":
        policy = dataclasses.replace(policy, model=shard_actor(
            policy.model, cfg.actor.fsdp, world, gradient_checkpointing=cfg.actor.gradient_checkpointing))
    checkpoint_format(cfg, policy.model)  # a format this actor cannot write fails now, not at the first save
    task = encode_task(records, data_cfg, policy.tokenizer)  # only the prompt lengths need the tokenizer
    if warning := repeated_prompt_warning(task.val, cfg.rollout.val_kwargs.n):
        log.warning("%s", warning)
    optimizer = build_optimizer(policy.model, cfg.actor.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.actor.optim)
    state = RunState(PromptSampler.from_config(task.train, cfg),
                     DynamicSamplingBuffer.from_config(cfg))
    total_steps = total_steps_of(cfg, len(task.train))
    # Rank 0 picks the checkpoint and every rank loads that one (a rank that cannot read it fails, never diverges).
    resume_from = world.broadcast_object(find_resume_checkpoint(run_dir, cfg) if world.is_main else None)
    if resume_from is not None:
        try:
            check_resume(run_dir, cfg)  # never continue a run silently with other hyper-parameters
        except ConfigError as exc:
            raise TrainingError(str(exc)) from None
        resume_run(resume_from, state, policy, optimizer, scheduler)
    policy.model.train()

    engine = build_rollout_engine(cfg, policy, module=engine_module, distributed=world.distributed)
    engine = with_tool_rollout(engine, cfg, policy.tokenizer)  # rollout.multi_turn: the same engine, with a tool
    engine_samples_from_actor = samples_from_module(engine, policy.model)
    scorer = reward_scorer_of(cfg)
    steps_before = state.step
    writing = run_dir / "config.yaml"
    try:
        # The run is known to start: only now is its record touched. A resumed run keeps the metrics up to its
        # checkpoint; a fresh run in an old run dir starts a fresh record.
        if world.is_main:
            atomic_write(writing, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
            writing = run_dir / "metrics.jsonl"
            truncate_metrics_after(run_dir, state.step if state.step > 0 else -1)
    except OSError as exc:
        close_quietly([("the reward scorer", scorer.close), ("the rollout engine", engine.close)])
        raise TrainingError(describe_os_error(exc, f"writing the run record {writing}")) from exc
    actor_dtype = next(policy.model.parameters()).dtype
    probe_dtype = engine_compute_dtype(cfg, policy.model)
    sync = WeightSync(engine, policy.model, task.train[0].input_ids, threshold=cfg.rollout.probe_logprob_threshold,
                      enabled=cfg.rollout.weight_sync_probe,
                      engine_dtype=probe_dtype if probe_dtype.itemsize < actor_dtype.itemsize else None)

    def validate(step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics = validate_across_ranks(engine, task.val, policy.tokenizer, cfg,
                                        seed=derive_seed(cfg.trainer.seed, "val"), world=world)
        metrics["timing_s/val"] = time.perf_counter() - t0
        state.val_history.append((step, metrics))
        return metrics

    progress = TrainingProgress(total_steps, enabled=cfg.trainer.progress, initial_step=state.step,
                                silent=not world.is_main)
    if resume_from is not None:
        progress.note(f"resumed from {resume_from} (step {state.step})")
    if state.step >= total_steps:
        progress.note(f"nothing to do: the checkpoint is at step {state.step} of {total_steps}")
    progress.note(f"dapo: model {policy.source}; engine {cfg.rollout.name}; task {task.description}; "
                  f"{len(task.train)} train / {len(task.val)} val prompts; run dir {run_dir}")
    try:
        backends = tracker_backends(cfg) if world.is_main else ()  # a Tracker without backends records nothing
        with Tracker(run_dir, backends=backends, project=cfg.trainer.project_name,
                     experiment=cfg.trainer.experiment_name, config=config_to_dict(cfg)) as tracker, progress:
            pending = sync.push(state.step)  # the engine may have loaded other weights (a resumed run's are newer)
            if cfg.trainer.val_before_train and state.step == 0 and task.val:
                tracker.log({**pending, **validate(0)}, step=0)
                pending = {}
            for step in range(state.step + 1, total_steps + 1):
                timer = PhaseTimer("gen", "reward", "old_log_prob", memory=memory)
                metrics, pending = pending, {}
                with timer("step"):
                    # Lines 3-9: sample, generate G outputs per prompt, reward, dynamic sampling until full.
                    groups, generated = generate_and_filter(engine, state, policy.tokenizer, cfg, step,
                                                            timer, scorer, world)
                    metrics.update(generated)
                    if groups:  # lines 10-12, then the new weights go to the engine
                        metrics.update(update_actor(groups, policy, optimizer, scheduler, cfg, step, timer,
                                                    engine_samples_from_actor=engine_samples_from_actor,
                                                    world=world))
                        with timer("sync_weights"):
                            metrics.update(sync.push(step))
                    else:  # train_on_partial after rounds that kept nothing: there is no gradient to take
                        log.warning("step %d: no informative group after %d rounds; skipping the update", step,
                                    int(metrics["train/num_gen_batches"]))
                metrics.update(timer.metrics())
                metrics["perf/throughput"] = metrics["rollout/num_tokens"] / max(timer.seconds["step"], 1e-9)
                state.step = step

                is_last = step == total_steps
                if task.val and ((cfg.trainer.test_freq > 0 and step % cfg.trainer.test_freq == 0) or is_last):
                    metrics.update(validate(step))
                # The record first, then the checkpoint: a kill between the two resumes from the previous checkpoint,
                # which drops this record (truncate_metrics_after) and writes it again; in the other order the record
                # of a checkpointed step would be lost. The save's time therefore goes into the next step's record.
                tracker.log(metrics, step=step)
                progress.update(step, metrics)
                if (cfg.trainer.save_freq > 0 and step % cfg.trainer.save_freq == 0) or is_last:
                    t0 = time.perf_counter()
                    try:
                        save_run(run_dir, state, policy, optimizer, scheduler, cfg, world)
                    except CheckpointError as exc:
                        raise TrainingError(str(exc)) from exc
                    pending["timing_s/save_checkpoint"] = time.perf_counter() - t0
    finally:
        close_quietly([("the reward scorer", scorer.close), ("the rollout engine", engine.close)])
    memory.read()  # the last window: the run's peak includes everything since the last phase
    return TrainResult(run_dir, state.step, time.perf_counter() - wall0, memory.run_peak_bytes / 1024**2,
                       state.val_history, steps_run=state.step - steps_before)
