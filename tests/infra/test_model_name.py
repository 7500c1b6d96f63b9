"""The name a model folder is reported and served under: a checkpoint's hf/ folder by its run and step."""

from __future__ import annotations

from dapo.infra.model_name import model_name
from dapo.serve import ServeConfig


def test_a_checkpoint_is_named_by_its_run_and_step():
    assert model_name("runs/tiny-synth/checkpoints/global_step_30/hf") == "tiny-synth-global_step_30"
    assert model_name("runs/tiny-synth/checkpoints/global_step_30/hf/") == "tiny-synth-global_step_30"
    assert model_name("runs/lora/checkpoints/global_step_4/hf/merged") == "lora-global_step_4"  # LoRA's merged model
    assert model_name("copied/global_step_7/hf") == "global_step_7"  # outside a run's checkpoints/ folder


def test_other_folders_keep_their_name_and_the_embedded_model_is_tiny_qwen2():
    assert model_name("/models/Qwen2.5-7B") == "Qwen2.5-7B"
    assert model_name("somewhere/hf") == "hf"
    assert model_name(None) == "tiny-qwen2"


def test_dapo_serve_serves_a_checkpoint_under_that_name():
    assert ServeConfig(model="runs/x/checkpoints/global_step_2/hf").model_name == "x-global_step_2"
    assert ServeConfig(model="runs/x/checkpoints/global_step_2/hf", served_model_name="mine").model_name == "mine"
