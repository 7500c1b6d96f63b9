"""LoRA through PEFT (dapo.model.lora): config refusals, adapters only in the optimizer, the adapter folder a checkpoint
holds (loaded by plain PEFT), and the adapter-only push into the Transformers engine with the weight-sync probe."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from dapo.actor.optim import build_optimizer
from dapo.config import ConfigError, ModelConfig, load_config
from dapo.infra.checkpoint import load_checkpoint, save_checkpoint
from dapo.model.loading import EMBEDDED_MODEL_DIR, ModelLoadError, load_policy
from dapo.model.lora import (
    AdapterAndMergedExport,
    adapter_named_parameters,
    apply_lora,
    linear_module_names,
    load_adapter_state,
    merged_named_parameters,
    with_lora,
)
from dapo.rollout.factory import EngineSpec, build_rollout_engine, hf_engine_copy
from dapo.training.errors import TrainingError
from dapo.training.weight_sync import WeightSync, actor_log_probs_of

LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16"]
PROMPT, RESPONSE = [5, 17, 99, 3, 250, 41], [7, 7, 12, 301, 64, 2, 9, 88]


def _lora_policy(overrides=(), *, seed: int = 0):
    cfg = load_config(None, [*LORA, *overrides])
    torch.manual_seed(seed)
    return cfg, with_lora(load_policy(cfg.model), cfg.model)


def _perturb_adapters(model: torch.nn.Module, seed: int) -> None:
    """A stand-in for training: B starts at zero (the adapter is then a no-op), so give it values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in adapter_named_parameters(model):
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)


# ------------------------------------------------------------------------------------------------------ config
def test_verl_spellings_are_taken_as_written() -> None:
    cfg = load_config(None, [*LORA, "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"])
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.target_modules) == (8, 16.0, ["q_proj", "v_proj"])
    assert cfg.model.lora and not load_config(None, []).model.lora


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["model.lora_rank=-1"], "lora_rank"),
        (["model.lora_alpha=32"], "only apply with LoRA: set model.lora_rank >= 1"),
        (["model.target_modules=[q_proj]"], "only apply with LoRA"),
        (["model.lora_rank=4", "model.target_modules=[]"], "non-empty list"),
        (["model.lora_rank=4", "model.target_modules=some-linear"], "target_modules"),
        (["model.lora_rank=4", "model.lora_dropout=1.0"], "lora_dropout"),
        # An async fsdp2 actor needs rollout ranks beside its trainer ranks, LoRA or not (the refusal of every fsdp2
        # actor: a spawned worker serves one trainer process).
        (
            ["model.lora_rank=4", "actor.strategy=fsdp2", "async_training.mode=one_step_off"],
            "set rollout.n_gpus_per_node=R",
        ),
    ],
)
def test_lora_settings_that_cannot_work_are_refused(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


@pytest.mark.parametrize("mode", ["one_step_off", "fully_async"])
def test_lora_under_fsdp2_runs_in_both_async_modes_beside_rollout_ranks(mode: str) -> None:
    """Both modes push through the same sharded push and probe (weight_sync.sharded_push, PushPartner); the torchrun
    run of fully_async is tests/distributed/test_async_torchrun.py."""
    cfg = load_config(
        None,
        ["model.lora_rank=4", "actor.strategy=fsdp2", f"async_training.mode={mode}", "rollout.n_gpus_per_node=2"],
    )
    assert cfg.model.lora and cfg.actor.strategy == "fsdp2" and cfg.async_training.mode == mode


def test_an_unknown_target_module_is_refused_with_the_models_modules() -> None:
    cfg = load_config(None, ["model.lora_rank=4", "model.target_modules=[q_proj,qkv_proj]"])
    model = load_policy(cfg.model).model
    with pytest.raises(
        ModelLoadError,
        match=r"\['qkv_proj'\] is not a linear layer of Qwen2ForCausalLM; its linear "
        r"layers are \['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\]",
    ):
        apply_lora(model, cfg.model)
    assert linear_module_names(model) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def test_a_rank_above_the_narrowest_targeted_layer_is_refused() -> None:
    model = load_policy(load_config(None, []).model).model
    narrowest = min(
        min(m.in_features, m.out_features)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
    )
    too_big = load_config(None, [f"model.lora_rank={narrowest + 1}"])
    with pytest.raises(ModelLoadError, match=rf"model.lora_rank={narrowest + 1} exceeds {narrowest}, the smallest"):
        apply_lora(model, too_big.model)
    apply_lora(model, load_config(None, [f"model.lora_rank={narrowest}"]).model)  # the bound itself fits


def test_an_absurd_rank_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match="lora_rank"):
        load_config(None, ["actor_rollout_ref.model.lora_rank=1000000000"])


# ------------------------------------------------------------------------------------------------------- actor
def test_the_optimizer_holds_only_the_adapters() -> None:
    cfg, policy = _lora_policy()
    base = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR)
    # Hand count: every linear layer but the head gets A (r x in) and B (out x r).
    expected = sum(
        8 * (m.in_features + m.out_features)
        for name, m in base.named_modules()
        if isinstance(m, torch.nn.Linear) and name != "lm_head"
    )
    optimizer = build_optimizer(policy.model, cfg.actor.optim)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert sum(p.numel() for p in held) == expected
    assert {id(p) for p in held} == {id(p) for _, p in adapter_named_parameters(policy.model)}


def test_a_fresh_adapter_is_the_base_model_and_the_merged_weights_are_peft_s() -> None:
    _, policy = _lora_policy()
    base = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR)
    assert torch.equal(actor_log_probs_of(policy.model, PROMPT, RESPONSE), actor_log_probs_of(base, PROMPT, RESPONSE))
    _perturb_adapters(policy.model, seed=1)
    ours = dict(merged_named_parameters(policy.model))
    assert set(ours) == {name for name, _ in base.named_parameters()}
    peft_merged = dict(policy.model.merge_and_unload().named_parameters())
    for name, tensor in peft_merged.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------- checkpoint
def test_a_checkpoint_holds_the_adapter_folder_that_plain_peft_loads(tmp_path) -> None:
    cfg, policy = _lora_policy()
    _perturb_adapters(policy.model, seed=2)
    optimizer = build_optimizer(policy.model, cfg.actor.optim)
    path = save_checkpoint(
        tmp_path,
        3,
        model=policy.model,
        tokenizer=policy.tokenizer,
        optimizer=optimizer,
        scheduler=None,
        trainer_state={"step": 3},
    )
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (path / "hf").iterdir()}
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR), path / "hf")
    trained = actor_log_probs_of(policy.model, PROMPT, RESPONSE)
    assert torch.equal(actor_log_probs_of(plain, PROMPT, RESPONSE), trained)

    # dapo's own resume path: a fresh LoRA actor gets exactly the saved adapters back
    _, fresh = _lora_policy(seed=9)
    load_checkpoint(
        path,
        model=fresh.model,
        optimizer=None,
        scheduler=None,
        load_weights=lambda adapter: load_adapter_state(fresh.model, adapter),
    )
    for (name, a), (_, b) in zip(adapter_named_parameters(policy.model), adapter_named_parameters(fresh.model)):
        assert torch.equal(a, b), name


def test_eval_and_serve_load_a_lora_checkpoint_folder_as_its_merged_model(tmp_path) -> None:
    cfg, policy = _lora_policy()
    _perturb_adapters(policy.model, seed=6)
    AdapterAndMergedExport(policy.model, policy.tokenizer).save_pretrained(tmp_path / "hf", safe_serialization=True)
    loaded = load_policy(ModelConfig(path=str(tmp_path / "hf")))  # what `dapo eval` / `dapo serve` do with a path
    assert loaded.hf_dir == tmp_path / "hf" / "merged"
    torch.testing.assert_close(
        actor_log_probs_of(loaded.model, PROMPT, RESPONSE),
        actor_log_probs_of(policy.model, PROMPT, RESPONSE),
        rtol=0,
        atol=1e-5,
    )
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="is a PEFT adapter folder without a merged model"):
        load_policy(ModelConfig(path=str(tmp_path / "bare")))


def test_resuming_adapters_of_another_rank_is_refused_in_one_line(tmp_path) -> None:
    # Before: trainer.resume_with_changes=true with a new lora_rank died in PEFT's 105-line size-mismatch traceback;
    # resume_run turns this ValueError into its one-line TrainingError ("cannot resume from ...: does not fit").
    cfg, policy = _lora_policy()
    path = save_checkpoint(
        tmp_path,
        1,
        model=policy.model,
        tokenizer=policy.tokenizer,
        optimizer=build_optimizer(policy.model, cfg.actor.optim),
        scheduler=None,
        trainer_state={"step": 1},
    )
    _, other = _lora_policy(["actor_rollout_ref.model.lora_rank=4"])
    with pytest.raises(
        ValueError,
        match=r"has shape \(8, \d+\) in the checkpoint but \(4, \d+\) in this run: "
        r"the LoRA rank \(actor_rollout_ref.model.lora_rank\)",
    ) as info:
        load_checkpoint(
            path,
            model=other.model,
            optimizer=None,
            scheduler=None,
            load_weights=lambda adapter: load_adapter_state(other.model, adapter),
        )
    assert "\n" not in str(info.value)


def test_loading_a_full_models_weights_into_adapters_is_refused() -> None:
    _, policy = _lora_policy()
    with pytest.raises(KeyError, match="adapter weights not in the model"):
        load_adapter_state(policy.model, {"model.layers.0.self_attn.q_proj.weight": torch.zeros(1)})


# ------------------------------------------------------------------------------------------------- hf engine
def test_the_hf_engine_runs_the_adapter_of_the_shared_module() -> None:
    cfg, policy = _lora_policy()
    engine = build_rollout_engine(EngineSpec(), policy)
    before = torch.tensor(engine.log_probs_of(PROMPT, RESPONSE))
    _perturb_adapters(policy.model, seed=3)
    after = torch.tensor(engine.log_probs_of(PROMPT, RESPONSE))
    assert (after - before).abs().mean() > 1e-3
    torch.testing.assert_close(after, actor_log_probs_of(policy.model, PROMPT, RESPONSE), rtol=0, atol=1e-5)


def test_an_engine_copy_receives_only_the_adapters_and_the_probe_sees_each_push() -> None:
    # The engine gets its own copy of the module, as under FSDP2 or another rollout.dtype.
    cfg, policy = _lora_policy()
    copy = hf_engine_copy(EngineSpec(), policy.model, sharded=True)
    engine = build_rollout_engine(EngineSpec(), policy, module=copy)
    pushed: list[str] = []
    update = engine.update_weights
    engine.update_weights = lambda tensors: update([pushed.append(n) or (n, t) for n, t in tensors])
    sync = WeightSync(engine, policy.model, PROMPT + RESPONSE, threshold=0.05)
    sync.push(0)
    assert pushed and all(".lora_A." in n or ".lora_B." in n for n in pushed)
    assert len(pushed) == len(list(adapter_named_parameters(policy.model)))
    _perturb_adapters(policy.model, seed=4)
    assert sync.push(1)["rollout/probe_logprob_diff"] < 1e-5  # the push arrived
    _perturb_adapters(policy.model, seed=5)
    engine.update_weights = lambda tensors: None  # a push that never arrives
    with pytest.raises(TrainingError, match="stale"):
        sync.push(2)
