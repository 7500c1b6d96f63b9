"""The actor's update on a PEFT LoRA model: gradients reach the adapters only, and are the same in every layout, with
and without activation checkpointing (the shared-prompt layout's own, or Hugging Face's through PEFT)."""

from __future__ import annotations

import pytest
import torch

from actor_helpers import actor_config, plan_of
from dapo.actor.log_probs import LAYOUTS
from dapo.actor.update import accumulate_mini_batch_gradients, configure_model_for_training
from dapo.config import ModelConfig
from dapo.model.lora import adapter_named_parameters, apply_lora
from tests.harness.models import ACTOR, tiny_qwen2
from test_update import TEMPERATURE, assert_same_gradients, off_policy_batch


def _lora_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = apply_lora(tiny_qwen2(8, ACTOR), ModelConfig(lora_rank=4, lora_alpha=8))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B away from zero, so that A gets a gradient too
        for name, p in adapter_named_parameters(model):
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    model.train()
    return model


def _adapter_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in adapter_named_parameters(model)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lora_gradients_are_the_same_in_every_layout_and_under_checkpointing(layout: str) -> None:
    reference = _lora_model()
    batch = off_policy_batch(reference, seed=3)
    padded = actor_config(ppo_max_token_len_per_gpu=20, layout="padded")
    accumulate_mini_batch_gradients(
        reference, plan_of(reference, batch, padded, norm_length=8), padded, temperature=TEMPERATURE
    )
    want = _adapter_grads(reference)
    assert all(p.grad is None for p in reference.parameters() if not p.requires_grad)  # the base stays frozen

    model = _lora_model()
    cfg = actor_config(
        ppo_max_token_len_per_gpu=20, layout=layout, gradient_checkpointing=True, shared_prompt_chunk_tokens=6
    )
    configure_model_for_training(model, cfg)
    accumulate_mini_batch_gradients(model, plan_of(model, batch, cfg, norm_length=8), cfg, temperature=TEMPERATURE)
    assert_same_gradients(_adapter_grads(model), want)
