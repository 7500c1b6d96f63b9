"""The DAPO training loop: Algorithm 1 of the paper, and nothing else.

    for step = 1..M:
        sample a batch of prompts; the old policy samples G outputs for each          (generate)
        compute rewards: rule-based +1/-1 plus soft overlong punishment (Eq. 13)      (reward)
        keep groups with 0 < #correct < G (Eq. 11); repeat until the batch is full   (dynamic sampling)
        compute group-relative advantages (Eq. 9)
        for mu iterations: update the policy on mini-batches, maximising J_DAPO (Eq. 8, token-level Eq. 12)
        log metrics; validate every test_freq steps; checkpoint every save_freq steps

Each piece is a function from a lower layer; this file only calls them in order, times them, and keeps the state a
checkpoint needs.
"""

from __future__ import annotations

import hashlib
import logging
import random
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import compute_log_probs_and_entropy_batch
from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.actor.update import NonFiniteLossError, update_policy
from dapo.checkpoint import CheckpointError, find_latest_checkpoint, load_checkpoint, save_checkpoint
from dapo.config import DapoConfig, config_to_dict
from dapo.core.advantages import get_adv_estimator
from dapo.core.dynamic_sampling import DynamicSamplingAccumulator, group_accuracy_stats, select_informative_groups
from dapo.core.overlong import overlong_filter_mask
from dapo.groups import ScoredGroup, group_index_of, score_rollout
from dapo.model_loading import Policy, load_policy
from dapo.progress import TrainingProgress
from dapo.prompts import PromptSampler
from dapo.reward.custom_fn import load_custom_reward_fn
from dapo.rollout.base import SamplingParams
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.step_metrics import batch_metrics, policy_metrics
from dapo.task import Task, load_task
from dapo.tracking import Tracker, truncate_metrics_after
from dapo.validation import run_validation, val_acc_key

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """A run cannot continue; the message says why and what to change."""


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    wall_s: float
    peak_rss_mb: float
    val_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def val_acc(self, index: int) -> float | None:
        if not self.val_history:
            return None
        metrics = self.val_history[index][1]
        key = val_acc_key(metrics)
        return metrics[key] if key else None


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from (run seed, step, round, ...): rollouts reproduce exactly across resumes."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


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


# ------------------------------------------------------------------------------------------------ one step's pieces
def generate_and_filter(
    engine: HFRolloutEngine, sampler: PromptSampler, accumulator: DynamicSamplingAccumulator, policy: Policy,
    cfg: DapoConfig, step: int, timing: dict[str, float],
) -> tuple[list[ScoredGroup], dict[str, float]]:
    """Algorithm 1, lines 3-9: generate rounds of gen_batch_size prompts until train_batch_size groups are kept."""
    def params_of(rnd: int) -> SamplingParams:  # every round has its own seed, so a resumed run samples the same
        return SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
            max_tokens=cfg.data.max_response_length, seed=derive_seed(cfg.trainer.seed, "rollout", step, rnd),
        )

    generated_acc: list[float] = []
    generated_tokens = 0
    rnd = 0
    while accumulator.should_generate_more():
        prompts = sampler.next_batch(cfg.data.effective_gen_batch_size)
        t0 = time.perf_counter()
        rollout = engine.generate([p.input_ids for p in prompts], params_of(rnd))
        t1 = time.perf_counter()
        groups = score_rollout(prompts, rollout, policy.tokenizer, cfg)
        t2 = time.perf_counter()
        timing["gen"] += t1 - t0
        timing["reward"] += t2 - t1
        acc = torch.tensor([float(a) for g in groups for a in g.acc])
        sizes, group_index = group_index_of(groups)
        if cfg.algorithm.filter_groups.enable:
            kept_mask = select_informative_groups(acc, group_index)  # Eq. 11, on raw accuracy
            keep = kept_mask[torch.cumsum(sizes, 0) - sizes].tolist()  # a group's first sample speaks for it
        else:
            keep = [True] * len(groups)
        stats = group_accuracy_stats(acc, group_index)
        accumulator.add_round(
            [g for g, k in zip(groups, keep) if k],
            num_groups_generated=len(groups),
            num_all_correct=stats.num_all_correct,
            num_all_wrong=stats.num_all_wrong,
            wasted_tokens=sum(g.num_response_tokens for g, k in zip(groups, keep) if not k),
        )
        generated_acc.extend(acc.tolist())
        generated_tokens += sum(g.num_response_tokens for g in groups)
        rnd += 1
        if rnd % 10 == 0:  # unlimited rounds (max_num_gen_batches <= 0) must still show that they are running
            log.info("step %d: %d generation rounds so far, %d of %d groups kept", step, rnd,
                     accumulator.num_groups, cfg.data.train_batch_size)
    kept, report = accumulator.pop_batch()
    if report.partial:
        log.warning("step %d: dynamic sampling gave up after %d rounds; training on %d of %d groups", step,
                    report.num_gen_batches, len(kept), cfg.data.train_batch_size)
    metrics = {
        "train/num_gen_batches": float(report.num_gen_batches),
        "train/kept_group_ratio": float(report.kept_group_ratio),
        "train/wasted_tokens": float(report.wasted_tokens),
        "train/num_all_correct_groups": float(report.num_all_correct),
        "train/num_all_wrong_groups": float(report.num_all_wrong),
        "train/partial_batch": float(report.partial),
        "rollout/acc/mean": sum(generated_acc) / max(1, len(generated_acc)),
        "rollout/num_tokens": float(generated_tokens),
    }
    return kept, metrics


def build_train_batch(groups: list[ScoredGroup], cfg: DapoConfig) -> TrainBatch:
    """Group-relative advantages (Eq. 9) on the shaped reward, and the overlong-filter mask."""
    rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float32)
    _, group_index = group_index_of(groups)
    estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
    advantages = estimator(rewards, group_index, norm_adv_by_std=cfg.algorithm.norm_adv_by_std_in_grpo)
    truncated = torch.tensor([t for g in groups for t in g.truncated], dtype=torch.bool)
    sample_mask = overlong_filter_mask(truncated) if cfg.algorithm.overlong_filter else torch.ones_like(truncated)
    return TrainBatch(
        prompt_ids=[list(g.prompt.input_ids) for g in groups for _ in g.response_ids],
        response_ids=[r for g in groups for r in g.response_ids],
        advantages=advantages,
        sample_mask=sample_mask,
        group_index=group_index,
        rollout_log_probs=[torch.tensor(lp, dtype=torch.float32) for g in groups for lp in g.rollout_log_probs],
    )


def train_on_groups(groups: list[ScoredGroup], policy: Policy, optimizer, scheduler, cfg: DapoConfig, step: int,
                    timing: dict[str, float]) -> dict[str, float]:
    """Algorithm 1, lines 10-12: advantages, old log-probs, then mu passes of mini-batch updates."""
    # Line 10: group-relative advantages (Eq. 9).
    batch = build_train_batch(groups, cfg)

    # pi_theta_old: the actor recomputes the log-probs of the sampled tokens before updating.
    t0 = time.perf_counter()
    old_log_probs, entropies = compute_log_probs_and_entropy_batch(
        policy.model, batch, cfg.actor, temperature=cfg.rollout.temperature
    )
    batch = batch.with_old_log_probs(old_log_probs)
    timing["old_log_prob"] = time.perf_counter() - t0

    # Lines 11-12: mu passes of mini-batch updates maximising J_DAPO (Eq. 8).
    t0 = time.perf_counter()
    try:
        metrics = update_policy(policy.model, optimizer, scheduler, batch, cfg.actor,
                                temperature=cfg.rollout.temperature, norm_length=cfg.data.max_response_length)
    except NonFiniteLossError as exc:
        raise TrainingError(f"step {step}: {str(exc).rstrip('.')}. The last complete checkpoint is "
                            f"untouched; lower actor.optim.lr or use actor.dtype=fp32") from exc
    timing["update_actor"] = time.perf_counter() - t0

    metrics.update(batch_metrics(groups, batch.advantages, max_response_length=cfg.data.max_response_length))
    metrics.update(policy_metrics(old_log_probs, entropies, batch.rollout_log_probs))
    return metrics


# ------------------------------------------------------------------------------------------------ run state
def save_run_state(run_dir: Path, step: int, policy: Policy, optimizer, scheduler, sampler: PromptSampler,
                   accumulator: DynamicSamplingAccumulator, val_history: list, cfg: DapoConfig) -> Path:
    state = {
        "step": step,
        "sampler": sampler.state_dict(),
        "accumulator": accumulator.state_dict(to_state=lambda g: g.to_state()),
        "val_history": val_history,
    }
    return save_checkpoint(run_dir / "checkpoints", step, model=policy.model, tokenizer=policy.tokenizer,
                           optimizer=optimizer, scheduler=scheduler, trainer_state=state,
                           keep_last=cfg.trainer.max_ckpt_to_keep)


def resume_if_asked(run_dir: Path, cfg: DapoConfig, policy: Policy, optimizer, scheduler, sampler: PromptSampler,
                    accumulator: DynamicSamplingAccumulator) -> tuple[int, list]:
    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return 0, []
    path = find_latest_checkpoint(run_dir / "checkpoints") if mode == "auto" else Path(mode)
    if path is None:
        return 0, []
    if not path.exists():
        raise TrainingError(f"trainer.resume_mode: checkpoint '{path}' does not exist")
    state = load_checkpoint(path, model=policy.model, optimizer=optimizer, scheduler=scheduler)
    sampler.load_state_dict(state["sampler"])
    accumulator.load_state_dict(state["accumulator"], from_state=ScoredGroup.from_state)
    print(f"resumed from {path} (step {state['step']})", flush=True)
    return int(state["step"]), [tuple(x) for x in state.get("val_history", [])]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ------------------------------------------------------------------------------------------------ the loop
def train(cfg: DapoConfig) -> TrainResult:
    wall0 = time.perf_counter()
    if cfg.trainer.num_threads is not None:
        torch.set_num_threads(cfg.trainer.num_threads)
    seed_everything(cfg.trainer.seed)
    device = pick_device(cfg.trainer.device)
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))

    custom = cfg.custom_reward_function
    if custom.path is not None:  # fail now, not at the first generation round, if the function cannot be loaded
        try:
            load_custom_reward_fn(f"{custom.path}:{custom.name}")
        except (OSError, ImportError, AttributeError, TypeError, ValueError) as exc:
            raise TrainingError(f"custom_reward_function: {exc}") from exc

    policy = load_policy(cfg.model, device=device)
    task: Task = load_task(cfg.data, policy.tokenizer)
    engine = HFRolloutEngine(policy.model, eos_token_ids=policy.eos_token_ids, pad_token_id=policy.pad_token_id,
                             max_batch_size=cfg.rollout.max_batch_size)
    optimizer = build_optimizer(policy.model, cfg.actor.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.actor.optim)
    sampler = PromptSampler(task.train, seed=cfg.data.seed, shuffle=cfg.data.shuffle)
    fg = cfg.algorithm.filter_groups
    accumulator = DynamicSamplingAccumulator(
        target_num_groups=cfg.data.train_batch_size,
        max_num_gen_batches=fg.max_num_gen_batches if fg.enable else 1,
        on_exhausted=fg.on_exhausted if fg.enable else "train_on_partial",
        carry_over_surplus=fg.carry_over_surplus,
    )
    total_steps = total_steps_of(cfg, len(task.train))
    start_step, val_history = resume_if_asked(run_dir, cfg, policy, optimizer, scheduler, sampler, accumulator)
    if start_step >= total_steps:
        print(f"nothing to do: the checkpoint is at step {start_step} of {total_steps}", flush=True)
    # A resumed run keeps the metrics up to its checkpoint; a fresh run in an old run dir starts a fresh record.
    truncate_metrics_after(run_dir, start_step if start_step > 0 else -1)
    policy.model.train()

    print(f"dapo: model {policy.source}; task {task.description}; {len(task.train)} train / {len(task.val)} val "
          f"prompts; run dir {run_dir}", flush=True)

    def validate(step: int) -> dict[str, float]:
        if not task.val:
            return {}
        t0 = time.perf_counter()
        metrics, _ = run_validation(engine, task.val, policy.tokenizer, cfg, seed=derive_seed(cfg.trainer.seed, "val"))
        metrics["timing_s/val"] = time.perf_counter() - t0
        val_history.append((step, metrics))
        return metrics

    step = start_step
    with Tracker(run_dir, backends=cfg.trainer.logger, project=cfg.trainer.project_name,
                 experiment=cfg.trainer.experiment_name, config=config_to_dict(cfg)) as tracker, \
            TrainingProgress(total_steps, enabled=cfg.trainer.progress, initial_step=start_step) as progress:
        if cfg.trainer.val_before_train and start_step == 0 and task.val:
            tracker.log(validate(0), step=0)
        for step in range(start_step + 1, total_steps + 1):
            timing = {"gen": 0.0, "reward": 0.0}
            t_step = time.perf_counter()
            metrics: dict[str, float] = {}

            # Lines 3-9: sample, generate G outputs per prompt, reward, dynamic sampling until the batch is full.
            groups, ds_metrics = generate_and_filter(engine, sampler, accumulator, policy, cfg, step, timing)
            metrics.update(ds_metrics)

            if groups:
                metrics.update(train_on_groups(groups, policy, optimizer, scheduler, cfg, step, timing))
            else:  # train_on_partial after rounds that kept nothing: there is no gradient to take
                log.warning("step %d: no informative group after %d rounds; skipping the update", step,
                            int(metrics["train/num_gen_batches"]))
            engine.update_weights(())  # the HF engine shares the actor's module: nothing to copy
            timing["step"] = time.perf_counter() - t_step
            metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
            metrics["perf/throughput"] = metrics["rollout/num_tokens"] / max(timing["step"], 1e-9)

            is_last = step == total_steps
            if (cfg.trainer.test_freq > 0 and step % cfg.trainer.test_freq == 0) or is_last:
                metrics.update(validate(step))
            if (cfg.trainer.save_freq > 0 and step % cfg.trainer.save_freq == 0) or is_last:
                t0 = time.perf_counter()
                try:
                    save_run_state(run_dir, step, policy, optimizer, scheduler, sampler, accumulator, val_history, cfg)
                except CheckpointError as exc:
                    raise TrainingError(str(exc)) from exc
                metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0
            tracker.log(metrics, step=step)
            progress.update(step, metrics)

    return TrainResult(run_dir, step, time.perf_counter() - wall0, peak_rss_mb(), val_history)
