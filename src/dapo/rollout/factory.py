"""The one registry of rollout engines: a name maps to how the engine is built from its own small spec.

Everything above this layer builds engines here (the trainer, ``dapo eval``, ``dapo serve``) from an
:class:`EngineSpec`, never from the whole training config, and every list of engine names (config checks, the
server's backends, the CLI's choices) is :data:`ENGINE_NAMES`, read off :data:`ENGINES`. Adding an engine is one
module plus one registry line. torch and the engines are imported on first use, so that the CLI can read the names
without loading torch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dapo.rollout.base import RolloutEngine

if TYPE_CHECKING:
    import torch

    from dapo.model.loading import Policy


class EngineUnavailableError(RuntimeError):
    """The chosen engine cannot be built here; the message says what to install or change."""


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is, apart from the weights it loads (a :class:`~dapo.model.loading.Policy`).

    Attributes:
        name: a registered engine (:data:`ENGINE_NAMES`).
        dtype: weights/activations dtype: ``auto`` (hf: the actor's; vllm: float32 on CPU, bfloat16 on a GPU) or a
            torch dtype name.
        seed: the engine's own random seed (engines that cannot seed each request draw from it).
        max_model_len: prompt + response tokens at most (vllm's context length); None: the engine's default.
        max_batch_size: hf: sequences decoded per call (None: all at once).
        tensor_parallel_size: vllm: ranks per engine.
        join_process_group: vllm: the engine lives inside an initialised torch.distributed group (torchrun).
        The other fields are vLLM's settings of the same names (``rollout.*``, docs/config.md).
    """

    name: str = "hf"
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_batch_size: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    free_cache_engine: bool = False
    cpu_kvcache_space_gb: float | None = 1.0
    enable_prefix_caching: bool = True
    join_process_group: bool = False

    def replace(self, **changes: object) -> EngineSpec:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine: its builder, and whether it can be built on this machine (and if not, why)."""

    build: Callable[[EngineSpec, Policy, torch.nn.Module | None], RolloutEngine]
    available: Callable[[], tuple[bool, str]]
    description: str


def _build_hf(spec: EngineSpec, policy: Policy, module: torch.nn.Module | None) -> RolloutEngine:
    if spec.tensor_parallel_size != 1:
        raise EngineUnavailableError(
            f"rollout.tensor_model_parallel_size={spec.tensor_parallel_size}: the Transformers engine "
            "(rollout.name=hf) has no tensor parallelism; use rollout.name=vllm or set it to 1")
    from dapo.rollout.hf_engine import HFRolloutEngine

    return HFRolloutEngine(policy.model if module is None else module, eos_token_ids=policy.eos_token_ids,
                           pad_token_id=policy.pad_token_id, max_batch_size=spec.max_batch_size)


def _vllm_available() -> tuple[bool, str]:
    from dapo.rollout.vllm_engine import vllm_available

    return vllm_available()


def _build_vllm(spec: EngineSpec, policy: Policy, module: torch.nn.Module | None) -> RolloutEngine:
    if policy.hf_dir is None:
        raise EngineUnavailableError(
            "rollout.name=vllm needs the policy as a Hugging Face folder; a GGUF model is converted to one when "
            "model.save_pretrained_cache=true"
        )
    from dapo.rollout.vllm_engine import VLLMRolloutEngine

    return VLLMRolloutEngine(
        str(policy.hf_dir),
        eos_token_ids=policy.eos_token_ids,
        dtype=str(engine_compute_dtype(spec, policy.model)).removeprefix("torch."),
        seed=spec.seed,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        tensor_parallel_size=spec.tensor_parallel_size,
        enforce_eager=spec.enforce_eager,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
        max_model_len=spec.max_model_len,
        free_cache_engine=spec.free_cache_engine,
        cpu_kvcache_space_gb=spec.cpu_kvcache_space_gb,
        enable_prefix_caching=spec.enable_prefix_caching,
        join_process_group=spec.join_process_group,
        lora_config=engine_lora_config(policy.model),
    )


def engine_lora_config(model: torch.nn.Module) -> dict | None:
    """A LoRA actor's adapter config, for an engine that runs adapters natively (vLLM); None for full fine-tuning."""
    from dapo.model.lora import adapter_config, is_lora

    return adapter_config(model) if is_lora(model) else None


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry(_build_hf, lambda: (True, ""), "the hand-written KV-cached Transformers engine"),
    "vllm": EngineEntry(_build_vllm, _vllm_available, "vLLM (its own runtime; weights pushed after every update)"),
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)


def check_engine_name(name: str, *, key: str = "rollout.name") -> None:
    """Raise ``EngineUnavailableError`` naming ``key`` when ``name`` is not a registered engine."""
    if name not in ENGINES:
        raise EngineUnavailableError(f"{key}: unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")


def engine_available(name: str) -> tuple[bool, str]:
    """Whether engine ``name`` can be built here, and if not, why (for callers choosing a backend)."""
    if name not in ENGINES:
        return False, f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}"
    return ENGINES[name].available()


def default_engine_name(device_type: str) -> str:
    """``auto``: vLLM on a GPU where it imports, the Transformers engine otherwise (CPU vLLM is a choice, not a default)."""
    return "vllm" if device_type == "cuda" and engine_available("vllm")[0] else "hf"


def build_rollout_engine(spec: EngineSpec, policy: Policy, *, module: torch.nn.Module | None = None) -> RolloutEngine:
    """The engine ``spec.name`` names, loaded with the policy's weights.

    ``hf`` shares the actor's module (the optimizer step is the weight update; pushes are no-ops), or generates from
    ``module``, an unsharded copy of it that every push refreshes (a sharded actor cannot generate: its forward runs
    collectives, and ranks decode different prompts for different numbers of steps). ``vllm`` loads the policy's
    Hugging Face folder in its own runtime and receives every update through ``update_weights``; under torchrun
    (``spec.join_process_group``) every rank holds its own engine, or its tensor-parallel shard of one, inside the
    trainer's process group.
    """
    check_engine_name(spec.name)
    ok, reason = engine_available(spec.name)
    if not ok:
        raise EngineUnavailableError(f"rollout.name={spec.name}: {reason}")
    return ENGINES[spec.name].build(spec, policy, module)


def hf_engine_copy(spec: EngineSpec, model: torch.nn.Module, *, sharded: bool) -> torch.nn.Module | None:
    """The Transformers engine's own copy of the actor's module, or None where it shares the module itself.

    A copy where the actor will be sharded (its forward runs collectives; call this before sharding) or where
    ``spec.dtype`` asks for another dtype than the actor's: e.g. bfloat16 decoding from an fp32 actor. The copy
    holds no gradients; every weight push copies (and casts) the actor's parameters into it."""
    import torch

    if spec.name != "hf":
        return None
    actor_dtype = next(model.parameters()).dtype
    dtype = engine_compute_dtype(spec, model)
    if not sharded and dtype == actor_dtype:
        return None
    # Parameters are copied straight into the new dtype (no transient full-precision copy of the model); buffers
    # (a rotary embedding's inv_freq) stay as they are, as from_pretrained(dtype=...) leaves them.
    memo: dict[int, object] = {id(p): torch.nn.Parameter(p.detach().to(dtype=dtype, copy=True), requires_grad=False)
                               for p in model.parameters()}
    return copy.deepcopy(model, memo).eval()


def engine_compute_dtype(spec: EngineSpec, actor: torch.nn.Module) -> torch.dtype:
    """The dtype ``spec``'s engine computes in for this actor: ``spec.dtype``, with ``auto`` resolved as the engine
    resolves it (hf: the actor's; vllm: float32 on CPU, bfloat16 on a GPU)."""
    import torch

    parameter = next(actor.parameters())
    if spec.dtype != "auto":
        return getattr(torch, spec.dtype)
    if spec.name == "vllm":
        return torch.bfloat16 if parameter.device.type == "cuda" else torch.float32
    return parameter.dtype


def samples_from_module(engine: RolloutEngine, model: torch.nn.Module) -> bool:
    """Whether ``engine`` samples from ``model``'s own parameters in fp32 (the Transformers engine sharing the actor's
    module): its log-probs are then the actor's, up to the rounding of incremental decoding (measured ~4e-7)."""
    import torch

    from dapo.rollout.hf_engine import HFRolloutEngine

    return (isinstance(engine, HFRolloutEngine) and engine.model is model
            and all(p.dtype == torch.float32 for p in model.parameters()))
