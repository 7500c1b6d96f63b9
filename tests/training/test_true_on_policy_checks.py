"""rollout.true_on_policy's refusals: the config combinations the mode cannot run are refused at validation, naming
the key, and a run checks the engine and the model family before the engine starts."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from dapo.config import DapoConfig
from dapo.training.errors import TrainingError
from dapo.training.run import check_true_on_policy

MODE = {"rollout": {"true_on_policy": True}}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"async_training": {"mode": "one_step_off"}}, "async_training.mode=sync"),
        ({"rollout": {"true_on_policy": True, "top_p": 0.9}}, "rollout.top_p=1.0"),
        ({"rollout": {"true_on_policy": True, "top_k": 20}}, "rollout.top_k=-1"),
        ({"rollout": {"true_on_policy": True, "dtype": "bfloat16"}}, "rollout.dtype=auto"),
        ({"actor": {"layout": "shared_prompt"}}, "not shared_prompt"),
        ({"model": {"lora_rank": 4, "lora_dropout": 0.1}}, "model.lora_dropout=0"),
    ],
)
def test_combinations_the_mode_cannot_run_are_refused_naming_the_key(extra, named) -> None:
    with pytest.raises(ValueError, match="rollout.true_on_policy=true") as refused:
        DapoConfig.model_validate({**MODE, **extra})
    assert named in str(refused.value)


def test_the_mode_alone_is_accepted() -> None:
    assert DapoConfig.model_validate(MODE).rollout.true_on_policy


def test_an_engine_without_the_capability_is_refused() -> None:
    cfg = DapoConfig.model_validate(MODE)
    with pytest.raises(TrainingError, match="the vllm engine does not decode batch-invariantly"):
        check_true_on_policy("vllm", torch.nn.Linear(1, 1), cfg)


def test_a_family_outside_the_mode_is_refused_with_its_reason() -> None:
    moe = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_experts=4,
            num_experts_per_tok=2,
        )
    )
    with pytest.raises(TrainingError, match="qwen3_moe"):
        check_true_on_policy("hf", moe, DapoConfig.model_validate(MODE))
