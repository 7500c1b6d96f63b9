"""A real actor step of the tiny model with a distillation teacher, and teacher folders to point it at."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.config import build_config
from dapo.data.task import load_task
from dapo.distillation.teachers import TeacherSet, build_teachers
from dapo.distributed.world import World
from dapo.infra.timing import PhaseTimer
from dapo.model.loading import EMBEDDED_MODEL_DIR, load_policy
from dapo.reward.scored_groups import score_rollout
from dapo.rollout.factory import build_rollout_engine
from dapo.training.actor_step import update_actor
from dapo.training.generation import rollout_params
from dapo.training.run import engine_spec_of

STUDENT = str(EMBEDDED_MODEL_DIR)


def perturbed_teacher(folder: Path, scale: float = 0.05, seed: int = 7) -> str:
    """The tiny model with Gaussian noise on every weight, saved as a Hugging Face folder: a teacher that is not the
    student but shares its tokenizer."""
    from dapo.config import ModelConfig

    policy = load_policy(ModelConfig())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale * p.abs().mean())
    policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return str(folder)


def distill_overrides(teacher: str, *more: str) -> list[str]:
    return [
        "distillation.enabled=true",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        "distillation.distillation_loss.loss_mode=k1",
        "distillation.distillation_loss.use_policy_gradient=true",
        *more,
    ]


def actor_step(
    overrides: list[str], *, teachers: TeacherSet | None = None, same_rewards: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, torch.Tensor]]:
    """One real actor step of the tiny model on 2 prompts x 4 samples; returns the weights after it, its metrics and
    the weights before. ``same_rewards``: every sample right, so the task reward's advantage is 0 everywhere."""
    cfg = build_config(
        None,
        [
            "data.train_batch_size=2",
            "actor.ppo_mini_batch_size=2",
            "rollout.n=4",
            "data.max_response_length=12",
            "reward_model.overlong_buffer.len=4",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    policy = load_policy(cfg.model)
    task = load_task(cfg.data, policy.tokenizer)
    engine = build_rollout_engine(engine_spec_of(cfg, World()), policy)
    prompts = task.train[:2]
    rollout = engine.generate([p.input_ids for p in prompts], rollout_params(cfg, 1, 0))
    groups = [
        dataclasses.replace(
            g,
            scores=[1.0 if same_rewards else (-1.0) ** k for k in range(len(g.scores))],
            acc=[same_rewards or k % 2 == 0 for k in range(len(g.acc))],
        )
        for g in score_rollout(prompts, rollout, policy.tokenizer, cfg)
    ]
    if teachers is None and cfg.distillation.enabled:
        teachers = build_teachers(cfg, device="cpu", student_tokenizer=policy.tokenizer)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    optimizer = build_optimizer(policy.model, cfg.actor.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.actor.optim)
    metrics = update_actor(groups, policy, optimizer, scheduler, cfg, 1, PhaseTimer(), teachers=teachers)
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}, metrics, before
