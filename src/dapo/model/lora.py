"""LoRA adapters on the actor through Hugging Face PEFT (``model.lora_rank >= 1``).

The policy's module becomes a ``peft.PeftModel``: the base weights are frozen, every targeted linear layer gets
trainable low-rank factors A (r x in) and B (out x r), and the layer computes W x + (alpha / r) B A x (LoRA, Hu et al.
2021, Eq. 3; B starts at zero, so the first policy is the base model). Everything that trains, checkpoints or pushes the
policy keeps working on it unchanged: PEFT forwards ``config``, ``get_decoder()`` and the other Hugging Face methods
to the base model, whose linear layers now hold the adapters; the optimizer takes the trainable parameters (the
adapters only); ``save_pretrained`` writes the adapter folder that ``peft.PeftModel.from_pretrained`` loads.

With the adapters disabled (``model.disable_adapter()``) the module is the base model: the reference policy of a KL
term, without a second copy of the weights.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from dapo.config import ModelConfig
from dapo.model.loading import ModelLoadError, Policy

__all__ = [
    "ADAPTER_NAME",
    "AdapterAndMergedExport",
    "MERGED_SUBFOLDER",
    "merged_model",
    "adapter_config",
    "adapter_named_parameters",
    "adapter_parameters_of_file",
    "lora_model_from_state",
    "apply_lora",
    "is_lora",
    "linear_module_names",
    "load_adapter_state",
    "merged_named_parameters",
    "with_lora",
]

ADAPTER_NAME = "default"  # PEFT's name of a model's first adapter; it appears in parameter names, not in saved files


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (an actor training LoRA adapters)."""
    peft = sys.modules.get("peft")  # not imported: no model can be a PEFT model (and a full run never imports it)
    return peft is not None and isinstance(model, peft.PeftModel)


def _linear_layers(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """``model``'s linear layers under their last names (what ``target_modules`` names), output head excluded."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module is not head:
            yield name.rsplit(".", 1)[-1], module


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last names of ``model``'s linear layers (what ``target_modules`` names), output head excluded."""
    return sorted({name for name, _ in _linear_layers(model)})


def apply_lora(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """``model`` with LoRA adapters of ``cfg``'s rank, alpha, dropout and target modules (a ``peft.PeftModel``; the
    base model's layers are wrapped in place). Raises ``ModelLoadError`` for a target module name the model lacks,
    listing the names it has."""
    from peft import LoraConfig, get_peft_model

    if not cfg.lora:
        raise ValueError("apply_lora: model.lora_rank is 0 (full fine-tuning)")
    available = linear_module_names(model)
    if isinstance(cfg.target_modules, list):
        unknown = [m for m in cfg.target_modules if m not in available]
        if unknown:
            raise ModelLoadError(
                f"model.target_modules: {unknown} {'is' if len(unknown) == 1 else 'are'} not a linear layer of "
                f"{type(model).__name__}; its linear layers are {available} (or use 'all-linear')"
            )
    _check_rank_fits(model, cfg)
    config = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, adapter_name=ADAPTER_NAME)


def _check_rank_fits(model: nn.Module, cfg: ModelConfig) -> None:
    """Refuse a rank above min(in, out) of the narrowest targeted layer: B A (out x r times r x in) has rank at most
    min(in, out), so a larger r adds only parameters and compute (a rank of 4096 on a 128-wide model ran ~10x slower
    with the same function class; 10^9 tried to allocate 512 GB).

    A scalar gate (one output: Qwen2-MoE's and Qwen3.5-MoE's ``shared_expert_gate``) does not bound it: 'all-linear'
    targets it too, and counting it refused every rank above 1 on those families (tests/model/test_family_matrix.py).
    """
    targets = cfg.target_modules
    widths = [
        min(m.in_features, m.out_features)
        for name, m in _linear_layers(model)
        if (targets == "all-linear" or name in targets) and m.out_features > 1
    ]
    if widths and cfg.lora_rank > min(widths):
        raise ModelLoadError(
            f"model.lora_rank={cfg.lora_rank} exceeds {min(widths)}, the smallest min(in, out) of the targeted linear "
            f"layers of {type(model).__name__} (a LoRA update B A cannot have a higher rank); use a rank <= {min(widths)}"
        )


def with_lora(policy: Policy, cfg: ModelConfig) -> Policy:
    """``policy`` itself for full fine-tuning; with ``model.lora_rank >= 1``, the policy whose module carries LoRA
    adapters (``apply_lora``). The one call the training loop makes for LoRA."""
    if not cfg.lora:
        return policy
    return dataclasses.replace(policy, model=apply_lora(policy.model, cfg))


def adapter_named_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapters' parameters under their module names (``base_model.model.<layer>.lora_A.default.weight``): the
    only tensors that training changes, hence the only ones a weight push must carry."""
    return ((name, p) for name, p in model.named_parameters() if p.requires_grad)


def adapter_config(model: nn.Module) -> dict:
    """The adapter's PEFT config as ``adapter_config.json`` holds it (an engine that loads adapters natively needs it
    beside the tensors)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    for key, value in list(config.items()):
        if isinstance(value, set):
            config[key] = sorted(value)
    return config


def _check_adapter_shapes(state: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]) -> None:
    # A resume with a new lora_rank under trainer.resume_with_changes: one line names the tensor and the two ranks.
    for key, tensor in state.items():
        if key in current and tuple(tensor.shape) != tuple(current[key].shape):
            raise ValueError(
                f"adapter tensor {key} has shape {tuple(tensor.shape)} in the checkpoint but "
                f"{tuple(current[key].shape)} in this run: the LoRA rank "
                f"(actor_rollout_ref.model.lora_rank) or target modules differ from the checkpoint's; "
                "keep the checkpoint's LoRA settings to resume, or start a new run"
            )


def adapter_parameters_of_file(
    model: nn.Module, state: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """An adapter file's tensors (PEFT's names without the adapter name) under ``model``'s parameter names
    (``...lora_A.default.weight``), and the adapter parameters the file lacks: for a model that loads them by
    parameter (a sharded actor, whose shards PEFT's own load cannot fill). ``model``: the PEFT model, or one whose
    parameters carry its names."""
    params = dict(adapter_named_parameters(model))
    by_file_name = {name.replace(f".{ADAPTER_NAME}", ""): name for name in params}
    unexpected = sorted(k for k in state if k not in by_file_name)
    if unexpected:
        raise KeyError(f"adapter weights not in the model: {unexpected[:5]}")
    _check_adapter_shapes(state, {key: params[name] for key, name in by_file_name.items()})
    missing = sorted(name for key, name in by_file_name.items() if key not in state)
    return {by_file_name[key]: tensor for key, tensor in state.items()}, missing


def _plain_model_like(base: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A new Hugging Face model of ``base``'s architecture (random weights, ``dtype``) with its generation config."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
    if getattr(base, "generation_config", None) is not None:
        plain.generation_config = base.generation_config
    return plain


def _load_all(model: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Load ``state`` into ``model``, every key: a key it leaves out must be tied to one it fills (a Hugging Face
    export omits ``lm_head.weight`` tied to the embeddings). Raises naming ``what`` otherwise."""
    result = model.load_state_dict(dict(state), strict=False)
    own = model.state_dict()
    loaded = {own[k].data_ptr() for k in own if k not in result.missing_keys}
    untied = [k for k in result.missing_keys if own[k].data_ptr() not in loaded]
    if result.unexpected_keys or untied:
        raise RuntimeError(f"{what} (unexpected {result.unexpected_keys[:3]}, missing {untied[:3]})")


def lora_model_from_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """A new, unsharded PEFT model with ``model``'s architecture and adapter config holding ``state`` (the full
    state dict of a sharded LoRA actor, PEFT's keys; tied keys may be left out), on the CPU: what a checkpoint's
    adapter folder and merged model are written from, as a replicated LoRA actor writes them."""
    from peft import get_peft_model

    base = model.get_base_model()
    copy = _plain_model_like(base, next(iter(state.values())).dtype)
    copy = get_peft_model(copy, dataclasses.replace(model.peft_config[ADAPTER_NAME]), adapter_name=ADAPTER_NAME)
    _load_all(copy, state, f"lora_model_from_state: the state does not fit {type(base).__name__} with its adapters")
    return copy.eval()


def load_adapter_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> list[str]:
    """Copy an adapter file's tensors (``adapter_model.safetensors``: PEFT's names without the adapter name) into
    ``model``'s adapters in place; return the adapter parameters the state did not fill."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    # Shapes first: PEFT's own load stops on a rank change with a deep size-mismatch traceback.
    _check_adapter_shapes(state, get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME))
    result = set_peft_model_state_dict(model, dict(state), adapter_name=ADAPTER_NAME)
    unexpected = [k for k in result.unexpected_keys]
    if unexpected:
        raise KeyError(f"adapter weights not in the model: {sorted(unexpected)[:5]}")
    adapters = {name for name, _ in adapter_named_parameters(model)}
    return sorted(k for k in result.missing_keys if k in adapters)


def merged_named_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's parameters under their Hugging Face names, each LoRA-wrapped weight merged:
    W + (alpha / r) B A. One at a time (each merged tensor is computed when it is taken), so a push of the merged model
    never holds a second copy of it; for an engine that cannot run adapters, and to compare one that can against."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    wrapped = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, parameter in base.named_parameters():
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer")
        if owner.endswith(".base_layer") and layer_name in wrapped:
            if leaf == "weight":
                with torch.no_grad():
                    delta = wrapped[layer_name].get_delta_weight(ADAPTER_NAME)
                    yield f"{layer_name}.weight", (parameter + delta.to(parameter.dtype)).detach()
            else:
                yield f"{layer_name}.{leaf}", parameter.detach()
        else:
            yield name, parameter.detach()


MERGED_SUBFOLDER = "merged"


def merged_model(model: nn.Module) -> nn.Module:
    """A new plain Hugging Face model (the base architecture, no adapters) holding the merged weights; the LoRA
    model is left as it is (PEFT's ``merge_and_unload`` would change it in place)."""
    base = model.get_base_model()
    merged = _plain_model_like(base, next(base.parameters()).dtype)
    _load_all(
        merged,
        dict(merged_named_parameters(model)),
        f"merged_model: the merged weights do not fit {type(merged).__name__}",
    )
    return merged.eval()


class AdapterAndMergedExport:
    """What a LoRA checkpoint's ``hf/`` holds, through the one ``save_pretrained`` call a checkpoint makes: the
    adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, for ``peft.PeftModel.from_pretrained``
    over the base model) and, in ``merged/``, the merged model with its tokenizer (for transformers, vLLM,
    ``dapo serve`` / ``dapo eval`` as any Hugging Face folder)."""

    def __init__(self, model: nn.Module, tokenizer: object) -> None:
        self.model, self.tokenizer = model, tokenizer

    def save_pretrained(self, folder, **kwargs) -> None:
        from pathlib import Path

        self.model.save_pretrained(folder, **kwargs)
        merged_dir = Path(folder) / MERGED_SUBFOLDER
        merged_model(self.model).save_pretrained(merged_dir, **kwargs)
        self.tokenizer.save_pretrained(merged_dir)
