"""One place that turns ``rollout.name`` into an engine; everything above this layer sees only ``RolloutEngine``."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from dapo.rollout.base import RolloutEngine

if TYPE_CHECKING:
    from dapo.config import DapoConfig
    from dapo.model.loading import Policy

ENGINE_NAMES: tuple[str, ...] = ("hf", "vllm")


class EngineUnavailableError(RuntimeError):
    """The chosen engine cannot be built here; the message says what to install or change."""


def engine_available(name: str) -> tuple[bool, str]:
    """Whether engine ``name`` can be built here, and if not, why (for callers choosing a backend)."""
    if name == "hf":
        return True, ""
    if name == "vllm":
        from dapo.rollout.vllm_engine import vllm_available

        return vllm_available()
    return False, f"unknown engine {name!r}; choose one of {ENGINE_NAMES}"


def default_engine_name(device_type: str) -> str:
    """``auto``: vLLM on a GPU where it imports, the Transformers engine otherwise (CPU vLLM is a choice, not a default)."""
    return "vllm" if device_type == "cuda" and engine_available("vllm")[0] else "hf"


def build_rollout_engine(cfg: DapoConfig, policy: Policy, *, module: torch.nn.Module | None = None,
                         distributed: bool = False) -> RolloutEngine:
    """The engine ``cfg.rollout.name`` names, loaded with the policy's weights.

    ``hf`` shares the actor's module (the optimizer step is the weight update; pushes are no-ops), or generates from
    ``module``, an unsharded copy of it that every push refreshes (a sharded actor cannot generate: its forward runs
    collectives, and ranks decode different prompts for different numbers of steps). ``vllm`` loads the policy's
    Hugging Face folder in its own runtime and receives every update through ``update_weights``; under torchrun
    (``distributed``) every rank holds its own engine, or its tensor-parallel shard of one, inside the trainer's
    process group.
    """
    r = cfg.rollout
    if r.name == "hf" and r.tensor_model_parallel_size != 1:
        raise EngineUnavailableError(
            f"rollout.tensor_model_parallel_size={r.tensor_model_parallel_size}: the Transformers engine "
            "(rollout.name=hf) has no tensor parallelism; use rollout.name=vllm or set it to 1")
    if r.name == "hf":
        from dapo.rollout.hf_engine import HFRolloutEngine

        return HFRolloutEngine(policy.model if module is None else module, eos_token_ids=policy.eos_token_ids,
                               pad_token_id=policy.pad_token_id, max_batch_size=r.max_batch_size)
    if r.name == "vllm":
        ok, reason = engine_available("vllm")
        if not ok:
            raise EngineUnavailableError(f"rollout.name=vllm: {reason}")
        if policy.hf_dir is None:
            raise EngineUnavailableError(
                "rollout.name=vllm needs the policy as a Hugging Face folder; a GGUF model is converted to one when "
                "model.save_pretrained_cache=true"
            )
        from dapo.rollout.vllm_engine import VLLMRolloutEngine

        dtype = str(engine_compute_dtype(cfg, policy.model)).removeprefix("torch.")
        return VLLMRolloutEngine(
            str(policy.hf_dir),
            eos_token_ids=policy.eos_token_ids,
            dtype=dtype,
            seed=cfg.trainer.seed,
            gpu_memory_utilization=r.gpu_memory_utilization,
            tensor_parallel_size=r.tensor_model_parallel_size,
            enforce_eager=r.enforce_eager,
            max_num_batched_tokens=r.max_num_batched_tokens,
            max_num_seqs=r.max_num_seqs,
            # +1: vLLM must be able to generate one token after a teacher-forced probe of full length
            max_model_len=r.max_model_len or cfg.data.max_prompt_length + cfg.data.max_response_length + 1,
            free_cache_engine=r.free_cache_engine,
            cpu_kvcache_space_gb=r.cpu_kvcache_space_gb,
            enable_prefix_caching=r.enable_prefix_caching,
            join_process_group=distributed,
            lora_config=engine_lora_config(policy.model),
        )
    raise EngineUnavailableError(f"rollout.name: unknown engine {r.name!r}; choose one of {ENGINE_NAMES}")


def engine_lora_config(model: torch.nn.Module) -> dict | None:
    """A LoRA actor's adapter config, for an engine that runs adapters natively (vLLM); None for full fine-tuning."""
    from dapo.model.lora import adapter_config, is_lora

    return adapter_config(model) if is_lora(model) else None


def hf_engine_copy(cfg: DapoConfig, model: torch.nn.Module, *, sharded: bool) -> torch.nn.Module | None:
    """The Transformers engine's own copy of the actor's module, or None where it shares the module itself.

    A copy where the actor will be sharded (its forward runs collectives; call this before sharding) or where
    ``rollout.dtype`` asks for another dtype than the actor's: e.g. bfloat16 decoding from an fp32 actor. The copy
    holds no gradients; every weight push copies (and casts) the actor's parameters into it."""
    if cfg.rollout.name != "hf":
        return None
    actor_dtype = next(model.parameters()).dtype
    dtype = engine_compute_dtype(cfg, model)
    if not sharded and dtype == actor_dtype:
        return None
    # Parameters are copied straight into the new dtype (no transient full-precision copy of the model); buffers
    # (a rotary embedding's inv_freq) stay as they are, as from_pretrained(dtype=...) leaves them.
    memo: dict[int, object] = {id(p): torch.nn.Parameter(p.detach().to(dtype=dtype, copy=True), requires_grad=False)
                               for p in model.parameters()}
    return copy.deepcopy(model, memo).eval()


def engine_compute_dtype(cfg: DapoConfig, actor: torch.nn.Module) -> torch.dtype:
    """The dtype ``cfg.rollout``'s engine computes in for this actor: ``rollout.dtype``, with ``auto`` resolved as the
    engine resolves it (hf: the actor's; vllm: float32 on CPU, bfloat16 on a GPU)."""
    parameter = next(actor.parameters())
    if cfg.rollout.dtype != "auto":
        return getattr(torch, cfg.rollout.dtype)
    if cfg.rollout.name == "vllm":
        return torch.bfloat16 if parameter.device.type == "cuda" else torch.float32
    return parameter.dtype


def samples_from_module(engine: RolloutEngine, model: torch.nn.Module) -> bool:
    """Whether ``engine`` samples from ``model``'s own parameters in fp32 (the Transformers engine sharing the actor's
    module): its log-probs are then the actor's, up to the rounding of incremental decoding (measured ~4e-7)."""
    from dapo.rollout.hf_engine import HFRolloutEngine

    return (isinstance(engine, HFRolloutEngine) and engine.model is model
            and all(p.dtype == torch.float32 for p in model.parameters()))
