"""AdamW parameter groups and the warm-up-then-constant learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from dapo.actor.optim import LinearWarmupThenConstant, build_lr_scheduler, build_optimizer
from dapo.config import OptimConfig
from tests.harness.models import ACTOR, tiny_qwen2


def test_weight_decay_only_on_matrices() -> None:
    model = tiny_qwen2(shape=ACTOR)
    optimizer = build_optimizer(model, OptimConfig(lr=3e-4, weight_decay=0.05, betas=(0.8, 0.95), eps=1e-6))
    decay, no_decay = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert "model.layers.0.self_attn.q_proj.weight" in decayed and "lm_head.weight" in decayed
    assert "model.embed_tokens.weight" in decayed
    assert "model.layers.0.self_attn.q_proj.bias" in kept  # Qwen2 has q/k/v biases
    assert "model.norm.weight" in kept and "model.layers.1.input_layernorm.weight" in kept
    assert decayed | kept == set(names.values()) and not decayed & kept
    assert decay["lr"] == 3e-4 and decay["betas"] == (0.8, 0.95) and decay["eps"] == 1e-6


def test_frozen_parameters_are_left_out() -> None:
    model = tiny_qwen2(shape=ACTOR)
    model.model.embed_tokens.weight.requires_grad_(False)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3))
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert id(model.model.embed_tokens.weight) not in in_optimizer


def test_warmup_then_constant_by_hand() -> None:
    param = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, OptimConfig(lr=1.0, lr_warmup_steps=4))
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_no_warmup_is_constant_and_schedule_survives_state_dict() -> None:
    assert [LinearWarmupThenConstant(0)(k) for k in range(3)] == [1.0, 1.0, 1.0]
    param = torch.nn.Parameter(torch.zeros(1, 1))
    optimizer = torch.optim.AdamW([param], lr=2.0)
    scheduler = build_lr_scheduler(optimizer, OptimConfig(lr=2.0, lr_warmup_steps=10))
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    fresh_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1, 1))], lr=2.0)
    fresh = build_lr_scheduler(fresh_opt, OptimConfig(lr=2.0, lr_warmup_steps=10))
    fresh.load_state_dict(state)
    fresh_opt.step()
    fresh.step()
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(2.0 * 5 / 10)  # step index 4 -> (4 + 1) / 10
