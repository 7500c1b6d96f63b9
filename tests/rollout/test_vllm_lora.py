"""vLLM's native LoRA (dapo.rollout.vllm_lora): an adapter-only push changes the engine's log-probs to the LoRA actor's,
and equals a full push of the merged weights into a plain engine. Skips with ``vllm_available()``'s reason without
vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dapo
from dapo.config import load_config
from dapo.model.loading import load_policy
from dapo.model.lora import adapter_config, adapter_named_parameters, merged_named_parameters, with_lora
from dapo.rollout.spec import EngineSpec, VLLMOptions
from dapo.rollout.vllm_engine import VLLMRolloutEngine, vllm_available
from dapo.rollout.vllm_lora import vllm_lora_rank
from dapo.training.weight_sync import actor_log_probs_of

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
EOS = 2
PROMPT = [1, 369, 201, 371, 267, 378, 300, 250, 12, 40]
RESPONSE = [19, 22, 383, 223, 27, 310]
SPEC = EngineSpec(name="vllm", dtype="float32", max_model_len=64, vllm=VLLMOptions(cpu_kvcache_space_gb=0.25))


def test_vllm_lora_ranks_round_up_to_vllms_slots() -> None:
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="exceeds vLLM's largest max_lora_rank"):
        vllm_lora_rank(513)


def test_an_adapter_only_push_moves_the_engine_to_the_actor_and_equals_a_merged_full_push() -> None:
    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)
    cfg = load_config(
        None, ["model.lora_rank=8", "model.lora_alpha=16", "model.target_modules=[q_proj,v_proj,up_proj]"]
    )
    torch.manual_seed(0)
    policy = with_lora(load_policy(cfg.model), cfg.model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a trained adapter: B away from its zero start
        for name, p in adapter_named_parameters(policy.model):
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    actor = actor_log_probs_of(policy.model, PROMPT, RESPONSE)

    engine = VLLMRolloutEngine(ASSET, SPEC, eos_token_ids=EOS, lora_config=adapter_config(policy.model))
    try:
        base = torch.tensor(engine.log_probs_of(PROMPT, RESPONSE))
        with pytest.raises(ValueError, match="is not a LoRA adapter tensor"):
            engine.update_weights(policy.model.named_parameters())
        engine.update_weights(adapter_named_parameters(policy.model))
        adapted = torch.tensor(engine.log_probs_of(PROMPT, RESPONSE))
        engine.update_weights(adapter_named_parameters(policy.model))  # a second push replaces the first
        again = torch.tensor(engine.log_probs_of(PROMPT, RESPONSE))
    finally:
        engine.close()
    assert (adapted - base).abs().mean() > 0.05  # the push changed the engine
    torch.testing.assert_close(adapted, actor, rtol=0, atol=1e-4)
    assert torch.equal(again, adapted)

    plain = VLLMRolloutEngine(ASSET, SPEC, eos_token_ids=EOS)
    try:
        plain.update_weights(list(merged_named_parameters(policy.model)))
        merged = torch.tensor(plain.log_probs_of(PROMPT, RESPONSE))
    finally:
        plain.close()
    torch.testing.assert_close(adapted, merged, rtol=0, atol=1e-4)
