"""The MoE router's load-balancing auxiliary loss in the update (``actor.router_aux_loss_coef``,
dapo.model.router_aux_loss): off (0, the default) the update is bit for bit what it was; on, the gradient moves by
exactly coef x the gradient of the Hugging Face model's own aux loss (its forward with output_router_logits=True),
on both layouts that take it; ``moe/aux_loss`` is that loss; families without one are refused by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from families import build_tiny_model, sampled_batch

from dapo.actor.log_probs import pack_sequences, pad_sequences
from dapo.actor.mini_batch_plan import plan_mini_batch
from dapo.actor.update import accumulate_mini_batch_gradients, update_policy
from dapo.config import ActorConfig, DapoConfig
from dapo.model.router_aux_loss import aux_loss_problem, router_aux_loss
from dapo.training.errors import TrainingError
from dapo.training.run import check_router_aux_loss

COEF = 0.5


def _batch(model: torch.nn.Module):
    """The engine's samples of the family's prompts, with advantages that are not zero (a zero advantage trains
    nothing) and one micro-batch for the whole mini-batch."""
    batch, _ = sampled_batch(model)
    generator = torch.Generator().manual_seed(3)
    return dataclasses.replace(batch, advantages=torch.randn(len(batch), generator=generator), routed_experts=None)


def _gradients(model: torch.nn.Module, batch, cfg: ActorConfig, layout: str) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    plan = plan_mini_batch(batch, cfg, layout=layout, norm_length=max(batch.response_lengths))
    assert len(plan.micro_batches) == 1
    accumulate_mini_batch_gradients(model, plan, cfg, temperature=1.0, on_policy=True)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _hf_aux_loss_gradients(model: torch.nn.Module, batch, layout: str) -> tuple[float, dict[str, torch.Tensor]]:
    """The aux loss the Hugging Face model computes for the forward's tokens, and its gradient."""
    build = pad_sequences if layout == "padded" else pack_sequences
    rows = build(batch.prompt_ids, batch.response_ids)
    model.zero_grad(set_to_none=True)
    out = model(
        input_ids=rows.input_ids,
        position_ids=rows.position_ids,
        attention_mask=rows.attention_mask,
        output_router_logits=True,
        use_cache=False,
    )
    out.aux_loss.backward()
    return float(out.aux_loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_update_adds_exactly_coef_times_the_models_own_aux_loss_gradient(layout: str) -> None:
    model = build_tiny_model("qwen3_moe").train()
    batch = _batch(model)
    off = ActorConfig(layout=layout, ppo_micro_batch_size_per_gpu=64)
    on = off.model_copy(update={"router_aux_loss_coef": COEF})
    without = _gradients(model, batch, off, layout)
    with router_aux_loss(model):
        hooked_off = _gradients(model, batch, off, layout)
        with_aux = _gradients(model, batch, on, layout)
    _, aux_grads = _hf_aux_loss_gradients(model, batch, layout)
    # coefficient 0: nothing is added, the hooks change nothing: bit for bit
    assert hooked_off.keys() == without.keys()
    assert all(torch.equal(hooked_off[n], without[n]) for n in without)
    # > 0: the difference is coef x d(aux)/d(theta), everywhere (round-off of one addition); routers included
    routers = [n for n in aux_grads if ".mlp.gate." in n]
    assert routers and all(float(aux_grads[n].abs().max()) > 1e-4 for n in routers)
    for name, grad in with_aux.items():
        expected = COEF * aux_grads.get(name, torch.zeros_like(grad))
        torch.testing.assert_close(grad - without[name], expected, rtol=1e-4, atol=1e-6)


def test_moe_aux_loss_is_logged_as_the_models_own() -> None:
    model = build_tiny_model("qwen3_moe").train()
    batch = _batch(model)
    cfg = ActorConfig(layout="padded", ppo_micro_batch_size_per_gpu=64, router_aux_loss_coef=COEF)
    aux, _ = _hf_aux_loss_gradients(model, batch, "padded")  # before the step: pi_old's aux loss
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    with router_aux_loss(model):
        metrics = update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0, on_policy=True)
    assert metrics["moe/aux_loss"] == pytest.approx(aux, rel=1e-5)
    assert metrics["moe/aux_loss_coef"] == COEF
    assert 1.0 <= aux <= 4.0  # experts x sum(share x probability): 1 when balanced, experts when collapsed


def test_families_without_the_loss_and_layouts_that_cannot_take_it_are_refused() -> None:
    cfg = DapoConfig.model_validate({"actor": {"router_aux_loss_coef": 0.01}})
    assert DapoConfig().actor.router_aux_loss_coef == 0.0
    with pytest.raises(TrainingError, match="router_aux_loss_coef=0.01: .* has no router dapo knows"):
        check_router_aux_loss(build_tiny_model("qwen3"), cfg)
    assert "score-correction bias" in str(aux_loss_problem(build_tiny_model("deepseek_v3")))
    for family in ("qwen3_moe", "qwen3_5_moe", "gpt_oss"):
        assert aux_loss_problem(build_tiny_model(family)) is None
    for actor in ({"layout": "shared_prompt"}, {"gradient_checkpointing": True}):
        with pytest.raises(ValueError, match="router_aux_loss_coef > 0"):
            DapoConfig.model_validate({"actor": {**actor, "router_aux_loss_coef": 0.01}})


def test_dapo_train_logs_moe_aux_loss(tmp_path: Path) -> None:
    from test_router_replay_training import trained_steps

    steps = trained_steps(tmp_path, "qwen3_moe", "actor_rollout_ref.actor.router_aux_loss_coef=0.01")
    for step in steps:
        assert 1.0 <= step["moe/aux_loss"] <= 4.0
        assert step["moe/aux_loss_coef"] == 0.01
