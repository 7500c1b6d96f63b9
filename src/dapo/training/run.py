"""Everything a training run is set up from, built once: ``build_run(cfg, world) -> Run``.

The loops (``dapo.training.loop``) are short functions over a :class:`Run`: the model and its optimizer, the task,
the engine and the weight push into it, the reward scorer, the run state that checkpoints save, and the run's
record (config, metrics, progress). Set-up problems (a config that cannot run here, unreadable data, a checkpoint
that does not fit) stop here, before the first step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.actor.update import checkpoint_context_fn
from dapo.config import DapoConfig, config_to_dict
from dapo.config.loading import tracker_backends
from dapo.data.prompt_sampler import PromptSampler
from dapo.data.task import Task, encode_task, read_task
from dapo.distillation.teacher import TeacherError
from dapo.distillation.teachers import TeacherSet, build_teachers
from dapo.distributed.data_parallel import check_tensor_parallel
from dapo.distributed.fsdp import check_strategy, shard_actor
from dapo.distributed.placement import Placement
from dapo.distributed.world import World
from dapo.evaluation.validation import repeated_prompt_warning, val_acc_key
from dapo.infra.atomic import describe_os_error
from dapo.infra.checkpoint import CheckpointError
from dapo.infra.cleanup import close_quietly
from dapo.infra.device import resolve_device
from dapo.infra.memory import PeakMemory
from dapo.infra.profiling import StepProfiler
from dapo.infra.progress import TrainingProgress
from dapo.model.batch_invariant import Invariance, batch_invariant, unsupported_reason
from dapo.infra.timing import PhaseTimer
from dapo.infra.tracking import Tracker, truncate_metrics_after
from dapo.model.hub import HubResolveError, resolve_data_config
from dapo.model.loading import Policy, load_policy
from dapo.model.lora import with_lora
from dapo.model.router_aux_loss import aux_loss_problem, router_aux_loss
from dapo.model.router_replay import moe_problem, router_replay
from dapo.reward.batch import RewardScorer
from dapo.reward.custom_fn import load_custom_reward_fn
from dapo.reward.scored_groups import reward_scorer_of
from dapo.rollout.base import RolloutEngine
from dapo.rollout.factory import (
    build_rollout_engine,
    check_engine_name,
    engine_capabilities,
    engine_compute_dtype,
    hf_engine_copy,
    module_engine_spec,
    samples_from_module,
)
from dapo.rollout.spec import EngineSpec, VLLMOptions
from dapo.training.dynamic_sampling_buffer import DynamicSamplingBuffer
from dapo.training.errors import TrainingError
from dapo.training.generation import derive_seed, engine_tensor_parallel, validate_across_ranks
from dapo.training.perf_metrics import StepPerf
from dapo.training.worker_restarts import WorkerRestartGuard
from dapo.training.skipped_steps import SkippedStepGuard
from dapo.training.rank_split import (
    JobSplit,
    engines_on_rollout_ranks,
    placement_of,
    receive_contacts,
    rollout_ranks,
    split_job,
)
from dapo.training.rollout_dump import dump_batch
from dapo.training.tool_use import with_tool_rollout
from dapo.training.run_state import (
    RunState,
    check_resume_config,
    check_resume_teachers,
    checkpoint_format,
    find_resume_checkpoint,
    record_run_config,
    resume_run,
    save_run,
)
from dapo.training.weight_sync import PushPartner, WeightSync

if TYPE_CHECKING:
    from dapo.rollout.worker import RolloutWorkerDied

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
    device = resolve_device(name)
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainingError("trainer.device=cuda but no CUDA device is available")
    return torch.device(device)


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


def engine_spec_of(cfg: DapoConfig, world: World) -> EngineSpec:
    """The engine ``cfg.rollout`` describes, as the factory's own small spec."""
    r = cfg.rollout
    return EngineSpec(
        name=r.name,
        dtype=r.dtype,
        seed=cfg.trainer.seed,
        max_batch_size=r.max_batch_size,
        tensor_parallel_size=r.tensor_model_parallel_size,
        # +1: vLLM must be able to generate one token after a teacher-forced probe of full length
        max_model_len=r.max_model_len or cfg.data.max_prompt_length + cfg.data.max_response_length + 1,
        join_process_group=world.distributed,
        vllm=VLLMOptions(
            gpu_memory_utilization=r.gpu_memory_utilization,
            enforce_eager=r.enforce_eager,
            max_num_batched_tokens=r.max_num_batched_tokens,
            max_num_seqs=r.max_num_seqs,
            free_cache_engine=r.free_cache_engine,
            cpu_kvcache_space_gb=r.cpu_kvcache_space_gb,
            enable_prefix_caching=r.enable_prefix_caching,
        ),
    )


def build_engine(
    cfg: DapoConfig,
    spec: EngineSpec,
    policy: Policy,
    module: torch.nn.Module | None,
    job: World,
    placement: Placement,
) -> RolloutEngine:
    """In this process (``async_training.mode=sync``), in a rollout worker process of its own (on ``placement``'s
    engine device: this rank's GPU, shared with the actor, or the CPU), or on a rollout rank of the torchrun ``job``
    (``rollout.n_gpus_per_node``; each rank places its own engine)."""
    if cfg.async_training.mode == "sync":
        return build_rollout_engine(spec, policy, module=module)
    from dapo.rollout.worker import RemoteEngine, WorkerOptions

    at = cfg.async_training
    options = WorkerOptions(
        num_threads=at.rollout_num_threads,
        partial_chunk_tokens=at.partial_rollout_chunk_tokens if at.partial_rollout else None,
        stall_timeout_s=cfg.trainer.stall_timeout_s,
        device=placement.engine_device or "cpu",
        weight_backend=placement.weight_backend,
        record_routes=cfg.actor.router_replay.mode == "R3",
    )
    if rollout_ranks(cfg, job):
        return engines_on_rollout_ranks(spec, cfg, options, job)
    return RemoteEngine.start(spec, cfg.model, options)


@dataclass
class Run:
    """A run, set up: what the loops read and change (module docstring)."""

    cfg: DapoConfig
    world: World
    run_dir: Path
    policy: Policy
    optimizer: Any
    scheduler: Any
    task: Task
    state: RunState
    engine: RolloutEngine | None  # None: a trainer rank that receives its batches from the leading one
    sync: WeightSync | PushPartner
    scorer: RewardScorer | None
    total_steps: int
    resume_from: Path | None
    engine_samples_from_actor: bool
    memory: PeakMemory
    wall0: float
    perf: StepPerf
    steps_before: int = 0
    # Several trainer ranks beside rollout ranks: the leading rank generates, validates and hands batches over
    # (dapo.training.shared_source); the others only train.
    shares_batches: bool = False
    skipped_steps: SkippedStepGuard | None = None
    worker_restarts: WorkerRestartGuard | None = None
    teachers: TeacherSet | None = None  # on-policy distillation (dapo.distillation); None: off

    def __post_init__(self) -> None:
        if self.skipped_steps is None:
            self.skipped_steps = SkippedStepGuard(self.cfg.trainer.max_consecutive_skipped_steps)
        if self.worker_restarts is None:
            self.worker_restarts = WorkerRestartGuard()

    def restart_engine(self, death: RolloutWorkerDied, *, version: int) -> None:
        """Replace the dead rollout worker ``death`` names by a new process holding the actor's current weights,
        tagged ``version`` (the caller knows which step they are); a death already handled (the engine was replaced
        since) is a no-op. Stops the run past the restart budget (``WorkerRestartGuard``)."""
        if death.engine is not self.engine:
            return
        self.worker_restarts.allow(death)
        self.engine = self.sync.engine = self.engine.respawn()  # a torchrun rank cannot be: that raises, saying so
        log.warning("%s; restarted it, pushing the weights of step %d (async/worker_restarts)", death, version)
        self.sync.push(version)

    def timer(self, *phases: str, step: int) -> PhaseTimer:
        """The phase timer of ``step`` (under ``torch.profiler`` when the step is in ``trainer.profile_steps``)."""
        profiler = None
        if step in self.cfg.trainer.profile_steps:
            profiler = StepProfiler(
                self.run_dir / "profile", step, rank=self.world.rank if self.world.distributed else None
            )
        return PhaseTimer("gen", "reward", "old_log_prob", *phases, memory=self.memory, profiler=profiler)

    def dump_batch(self, step: int, groups: list, *, with_versions: bool) -> None:
        """``trainer.rollout_data_dir``: the batch step ``step`` trains on, as lines of JSON (rank 0 writes it; every
        rank holds the same groups)."""
        if self.cfg.trainer.rollout_data_dir is not None and self.world.is_main:
            dump_batch(
                self.cfg.trainer.rollout_data_dir, step, groups, self.policy.tokenizer, with_versions=with_versions
            )

    def validate(self, step: int) -> dict[str, float]:
        if self.engine is None:  # the leading trainer rank validates on the rollout ranks' engines and records it
            return {}
        t0 = time.perf_counter()
        metrics = validate_across_ranks(
            self.engine,
            self.task.val,
            self.policy.tokenizer,
            self.cfg,
            seed=derive_seed(self.cfg.trainer.seed, "val"),
            world=World() if self.shares_batches else self.world,
        )
        metrics["timing_s/val"] = time.perf_counter() - t0
        self.state.val_history.append((step, metrics))
        return metrics

    def validate_teachers(self) -> dict[str, float]:
        """Each local distillation teacher's validation metrics, once, beside the student's at step 0:
        ``distill/teacher/<name>/<the student's key>`` (a served teacher is not validated here)."""
        if self.teachers is None:
            return {}
        metrics: dict[str, float] = {}
        spec = module_engine_spec(engine_spec_of(self.cfg, self.world))
        for name, teacher in self.teachers.local().items():
            engine = build_rollout_engine(spec, teacher.policy)
            try:
                found = validate_across_ranks(
                    engine,
                    self.task.val,
                    self.policy.tokenizer,
                    self.cfg,
                    seed=derive_seed(self.cfg.trainer.seed, "val"),
                    world=self.world,
                )
            finally:
                engine.close()
            metrics.update({f"distill/teacher/{name}/{key}": value for key, value in found.items()})
        return metrics

    @contextlib.contextmanager
    def record(self) -> Iterator[tuple[Tracker, TrainingProgress]]:
        """The tracker and the progress display, open for the loop."""
        cfg, state = self.cfg, self.state
        progress = TrainingProgress(
            self.total_steps, enabled=cfg.trainer.progress, initial_step=state.step, silent=not self.world.is_main
        )
        if self.resume_from is not None:
            progress.note(f"resumed from {self.resume_from} (step {state.step})")
        if state.step >= self.total_steps:
            progress.note(f"nothing to do: the checkpoint is at step {state.step} of {self.total_steps}")
        ranks = cfg.rollout.n_gpus_per_node
        where_engine = (
            " on a rollout rank of its own"
            if ranks == 1
            else f" on each of {ranks} rollout ranks"
            if ranks
            else " in a rollout worker process"
        )
        progress.note(
            f"dapo: model {self.policy.source}; engine {cfg.rollout.name}"
            f"{'' if cfg.async_training.mode == 'sync' else where_engine}; "
            f"task {self.task.description}; {len(self.task.train)} train / {len(self.task.val)} val "
            f"prompts; run dir {self.run_dir}"
        )
        backends = tracker_backends(cfg) if self.world.is_main else ()  # a Tracker without backends records nothing
        with (
            Tracker(
                self.run_dir,
                backends=backends,
                project=cfg.trainer.project_name,
                experiment=cfg.trainer.experiment_name,
                config=config_to_dict(cfg),
            ) as tracker,
            progress,
        ):
            yield tracker, progress

    def start(self, tracker: Tracker, progress: TrainingProgress) -> dict[str, float]:
        """The first push (the engine may hold other weights: a resumed run's are newer) and the validation before
        training; returns the metrics for the first step's record."""
        pending = self.sync.push(self.state.step)
        if self.cfg.trainer.val_before_train and self.state.step == 0 and self.task.val:
            progress.phase(f"step 0: validating on {len(self.task.val)} prompts before training")
            tracker.log({**pending, **self.validate(0), **self.validate_teachers()}, step=0)
            pending = {}
        progress.start_steps()
        return pending

    def end_step(
        self,
        step: int,
        metrics: dict[str, float],
        timer: PhaseTimer,
        tracker: Tracker,
        progress: TrainingProgress,
        checkpoint_state: Callable[[], Any] | None = None,
    ) -> dict[str, float]:
        """Timings, validation every test_freq steps, the record, the checkpoint every save_freq steps; returns the
        metrics that go into the next step's record. ``checkpoint_state`` gives what the checkpoint saves as the run
        state (default: the run state itself; the fully asynchronous loop saves a consistent snapshot)."""
        cfg, state = self.cfg, self.state
        metrics.update(timer.metrics())
        metrics["perf/throughput"] = metrics["rollout/num_tokens"] / max(timer.seconds["step"], 1e-9)
        state.step = step
        is_last = step == self.total_steps
        if self.task.val and ((cfg.trainer.test_freq > 0 and step % cfg.trainer.test_freq == 0) or is_last):
            metrics.update(self.validate(step))
        # The record first, then the checkpoint: a kill between the two resumes from the previous checkpoint,
        # which drops this record (truncate_metrics_after) and writes it again; in the other order the record
        # of a checkpointed step would be lost. The save's time therefore goes into the next step's record.
        tracker.log(metrics, step=step)
        if step == self.steps_before + 1 and self.world.is_main:
            record_run_config(self.run_dir, cfg)  # a step under cfg completed: now it describes the run
        progress.update(step, metrics)
        self.skipped_steps.observe(step, metrics)  # after the record: the failing step's metrics are kept
        pending: dict[str, float] = {}
        if (cfg.trainer.save_freq > 0 and step % cfg.trainer.save_freq == 0) or is_last:
            t0 = time.perf_counter()
            try:
                save_run(
                    self.run_dir,
                    state if checkpoint_state is None else checkpoint_state(),
                    self.policy,
                    self.optimizer,
                    self.scheduler,
                    cfg,
                    self.world,
                )
            except CheckpointError as exc:
                raise TrainingError(str(exc)) from exc
            pending["timing_s/save_checkpoint"] = time.perf_counter() - t0
        return pending

    def result(self) -> TrainResult:
        self.memory.read()  # the last window: the run's peak includes everything since the last phase
        return TrainResult(
            self.run_dir,
            self.state.step,
            time.perf_counter() - self.wall0,
            self.memory.run_peak_bytes / 1024**2,
            self.state.val_history,
            steps_run=self.state.step - self.steps_before,
        )

    def batch_invariance(self) -> contextlib.AbstractContextManager[object]:
        """The mode the run computes in: batch-invariant for the actor and the engine's module under
        ``rollout.true_on_policy`` (dapo.model.batch_invariant), the default otherwise."""
        cfg = self.cfg
        if not cfg.rollout.true_on_policy:
            return contextlib.nullcontext()
        invariance = Invariance(
            cfg.data.max_prompt_length + cfg.data.max_response_length,
            torch.bfloat16 if cfg.actor.dtype == "bf16" else None,
        )
        stack = contextlib.ExitStack()
        for module in [self.policy.model, *self.engine_own_module()]:
            stack.enter_context(batch_invariant(module, invariance))
        return stack

    def engine_own_module(self) -> list[torch.nn.Module]:
        """The module the engine generates from in this process when it is not the actor's (its unsharded copy
        beside an FSDP2 actor, or one in rollout.dtype: ``hf_engine_copy``), as a list of zero or one."""
        module = getattr(self.engine, "model", None)
        return [module] if isinstance(module, torch.nn.Module) and module is not self.policy.model else []

    def routing_replay(self) -> contextlib.AbstractContextManager[object]:
        """The actor's MoE routers set up for the run: under one tape (``actor.router_replay.mode``,
        dapo.model.router_replay; R3's engine records every sample's routes on it, or on a tape of its own copy's
        routers) and hooked for the load-balancing loss the update adds (``actor.router_aux_loss_coef``,
        dapo.model.router_aux_loss); nothing is patched when both are off."""
        stack = contextlib.ExitStack()
        mode = self.cfg.actor.router_replay.mode
        if mode != "disabled":
            stack.enter_context(router_replay(self.policy.model, rollout_routes=mode == "R3"))
        if mode == "R3":  # an engine with a copy of its own records there, on a tape of that copy's routers
            for module in self.engine_own_module():
                stack.enter_context(router_replay(module, rollout_routes=True))
        if self.cfg.actor.router_aux_loss_coef > 0:
            stack.enter_context(router_aux_loss(self.policy.model))
        return stack

    def close(self) -> None:
        close_quietly(
            [
                ("the reward scorer", self.scorer.close if self.scorer else lambda: None),
                ("the rollout engine", self.engine.close if self.engine else lambda: None),
                ("the distillation teachers", self.teachers.close if self.teachers else lambda: None),
            ]
        )


def check_router_replay(engine_name: str, model: torch.nn.Module, cfg: DapoConfig) -> None:
    """``actor.router_replay.mode`` needs a mixture-of-experts model whose routers can be replayed, and for R3 an
    engine that returns the experts it routed to."""
    mode = cfg.actor.router_replay.mode
    problem = moe_problem(model)
    if problem is not None:
        raise TrainingError(f"actor.router_replay.mode={mode}: {cfg.model.path or 'the model'} cannot: {problem}")
    why_not = engine_capabilities(engine_name).no_routed_experts
    if mode == "R3" and why_not is not None:
        raise TrainingError(
            f"actor.router_replay.mode=R3: the {engine_name} engine cannot record routes: {why_not}; "
            "use rollout.name=hf, or mode=R2 (replays the actor's own old-log-prob routes)"
        )


def check_router_aux_loss(model: torch.nn.Module, cfg: DapoConfig) -> None:
    """``actor.router_aux_loss_coef > 0`` needs a mixture-of-experts model whose family has the loss in
    Transformers."""
    problem = aux_loss_problem(model)
    if problem is not None:
        raise TrainingError(
            f"actor.router_aux_loss_coef={cfg.actor.router_aux_loss_coef}: {cfg.model.path or 'the model'} "
            f"cannot: {problem}"
        )


def check_true_on_policy(engine_name: str, model: torch.nn.Module, cfg: DapoConfig) -> None:
    """``rollout.true_on_policy`` needs an engine that decodes batch-invariantly and a model family that can."""
    if not engine_capabilities(engine_name).batch_invariant:
        raise TrainingError(
            f"rollout.true_on_policy=true: the {engine_name} engine does not decode "
            "batch-invariantly; use rollout.name=hf"
        )
    reason = unsupported_reason(model)
    if reason is not None:
        raise TrainingError(f"rollout.true_on_policy=true: {cfg.model.path or 'the model'} cannot: {reason}")


def build_run(cfg: DapoConfig, world: World = World(), split: JobSplit | None = None) -> Run:
    """Set the run up: seeds, data, model (sharded under fsdp2), optimizer, resume, engine, scorer, weight sync,
    and the run's record on disk (module docstring). ``world``: the torchrun job; with rollout ranks of its own
    (``split``, ``dapo.training.rank_split``) this trainer rank trains in the world of the trainer ranks."""
    split = split or split_job(cfg, world)
    if split.trainers is None:
        raise TrainingError(f"rank {world.rank} is a rollout rank: it serves the trainer and builds no run")
    job, world = split.job, split.trainers
    wall0 = time.perf_counter()
    memory = PeakMemory()  # per-phase peaks reset the kernel's high-water mark, so the run's peak is kept here
    if cfg.trainer.num_threads is not None:
        torch.set_num_threads(cfg.trainer.num_threads)
    random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)
    run_dir = run_dir_of(cfg)
    check_engine_name(cfg.rollout.name)
    if cfg.async_training.mode != "sync" and world.distributed and not split.rollout_ranks:
        raise TrainingError(
            f"async_training.mode={cfg.async_training.mode} under torchrun gives the rollout ranks of "
            "its own: set rollout.n_gpus_per_node=R (the last R ranks generate, the others train), "
            "or use async_training.mode=sync"
        )
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
    placement = placement_of(cfg, job, "trainer")
    policy = with_lora(load_policy(cfg.model, device=placement.actor_device), cfg.model)
    spec = engine_spec_of(cfg, world)
    if cfg.rollout.true_on_policy:  # before the engine loads: refused in seconds, not after its start-up
        check_true_on_policy(spec.name, policy.model, cfg)
    if cfg.actor.router_replay.mode != "disabled":  # likewise
        check_router_replay(spec.name, policy.model, cfg)
    if cfg.actor.router_aux_loss_coef > 0:
        check_router_aux_loss(policy.model, cfg)
    # The Transformers engine's own copy (before sharding: the same architecture and weights), when the actor is
    # sharded or rollout.dtype differs from the actor's; None: it shares the actor's module.
    engine_module = (
        hf_engine_copy(spec, policy.model, sharded=cfg.actor.strategy == "fsdp2")
        if cfg.async_training.mode == "sync"
        else None
    )
    if cfg.actor.strategy == "fsdp2":
        policy = dataclasses.replace(
            policy,
            model=shard_actor(
                policy.model,
                cfg.actor.fsdp,
                world,
                gradient_checkpointing=cfg.actor.gradient_checkpointing,
                checkpoint_context_fn=(
                    checkpoint_context_fn(policy.model, cfg.actor) if cfg.actor.gradient_checkpointing else None
                ),
            ),
        )
    checkpoint_format(cfg, policy.model)  # a format this actor cannot write fails now, not at the first save
    task = encode_task(records, data_cfg, policy.tokenizer)  # only the prompt lengths need the tokenizer
    if warning := repeated_prompt_warning(task.val, cfg.rollout.val_kwargs.n):
        log.warning("%s", warning)
    optimizer = build_optimizer(policy.model, cfg.actor.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.actor.optim)
    state = RunState(PromptSampler.from_config(task.train, cfg), DynamicSamplingBuffer.from_config(cfg))
    # Rank 0 picks the checkpoint and every rank loads that one (a rank that cannot read it fails, never diverges).
    resume_from = world.broadcast_object(find_resume_checkpoint(run_dir, cfg) if world.is_main else None)
    try:
        teachers = build_teachers(cfg, device=pick_device(cfg.trainer.device), student_tokenizer=policy.tokenizer)
    except TeacherError as exc:
        raise TrainingError(str(exc)) from None
    identity = teachers.identity() if teachers is not None else {}
    if resume_from is not None:
        check_resume_config(run_dir, resume_from, cfg)  # never continue a run silently with other hyper-parameters
        resume_run(resume_from, state, policy, optimizer, scheduler)
        check_resume_teachers(state.teachers, identity, cfg)
    state.teachers = identity
    policy.model.train()

    if split.leads_rollout or not split.shares_batches:
        engine = build_engine(cfg, spec, policy, engine_module, job, placement)
        engine = with_tool_rollout(engine, cfg, policy.tokenizer)  # rollout.multi_turn: the same engine, with a tool
    else:
        receive_contacts(job)  # its part in the hand-over; the leader alone drives the engines
        engine = None
    scorer = reward_scorer_of(cfg)
    writing = run_dir / "metrics.jsonl"
    try:
        # The run is known to start: only now is its record touched. A resumed run keeps the metrics up to its
        # checkpoint; a fresh run in an old run dir starts a fresh record. (config.yaml: after the first step.)
        if world.is_main:
            truncate_metrics_after(run_dir, state.step if state.step > 0 else -1)
    except OSError as exc:
        close_quietly(
            [("the reward scorer", scorer.close), ("the rollout engine", engine.close if engine else lambda: None)]
        )
        raise TrainingError(describe_os_error(exc, f"writing the run record {writing}")) from exc
    actor_dtype = next(policy.model.parameters()).dtype
    probe_dtype = engine_compute_dtype(spec, policy.model)
    engine_dtype = probe_dtype if probe_dtype.itemsize < actor_dtype.itemsize else None
    if engine is None:
        sync = PushPartner(
            policy.model, task.train[0].input_ids, enabled=cfg.rollout.weight_sync_probe, engine_dtype=engine_dtype
        )
    else:
        sync = WeightSync(
            engine,
            policy.model,
            task.train[0].input_ids,
            threshold=cfg.rollout.probe_logprob_threshold,
            enabled=cfg.rollout.weight_sync_probe,
            engine_dtype=engine_dtype,
        )
    return Run(
        cfg,
        world,
        run_dir,
        policy,
        optimizer,
        scheduler,
        task,
        state,
        engine,
        sync,
        scorer,
        total_steps_of(cfg, len(task.train)),
        resume_from,
        engine is not None and samples_from_module(engine, policy.model),
        memory,
        wall0,
        StepPerf.for_run(policy.model, cfg, engine_dtype=probe_dtype, num_devices=world.world_size),
        steps_before=state.step,
        shares_batches=split.shares_batches,
        teachers=teachers,
    )
