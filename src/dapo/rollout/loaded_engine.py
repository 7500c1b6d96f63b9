"""Load a model and build its engine: the one way every command that serves or samples a model folder gets its
engine (``dapo serve``, ``dapo eval``, ``dapo generate``, a spawned rollout worker). The trainer builds its own from
the actor it trains (``dapo.training.run``), since that engine shares or copies the actor's module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dapo.infra.device import resolve_device
from dapo.rollout.factory import build_rollout_engine, resolve_engine_name
from dapo.rollout.spec import EngineSpec

if TYPE_CHECKING:
    from dapo.config import ModelConfig
    from dapo.model.loading import Policy
    from dapo.rollout.base import RolloutEngine

DEFAULT_MAX_MODEL_LEN = 4096  # a model whose config names no max_position_embeddings


@dataclass(frozen=True)
class LoadedEngine:
    """An engine and the policy it was loaded from; ``spec`` as built (its name and ``max_model_len`` resolved)."""

    engine: RolloutEngine
    policy: Policy
    spec: EngineSpec
    device: str

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer


def load_model_engine(
    model_cfg: ModelConfig,
    spec: EngineSpec,
    *,
    device: str = "cpu",
    remote_code_switch: str | None = None,
    fresh_adapters: bool = False,
) -> LoadedEngine:
    """Load ``model_cfg``'s policy onto ``device`` and build ``spec``'s engine from it.

    ``device``: ``auto`` is resolved here (``dapo.infra.device.resolve_device``); ``spec.name``: ``auto`` is the
    device's default engine (``dapo.rollout.factory.default_engine_name``), resolved before the model loads;
    ``spec.max_model_len``: None is the model's ``max_position_embeddings`` (4096 where it names none).
    ``remote_code_switch``: how the calling command allows custom model code, for the message when it is needed.
    ``fresh_adapters``: the engine of a rollout worker whose trainer trains LoRA adapters (``model.lora_rank >= 1``):
    the model carries ``model_cfg``'s adapters, untrained (their B factors are 0, so the model is the base model),
    under the names the trainer's adapter-only pushes carry; each push then fills them.
    """
    from dapo.model.lora import with_lora
    from dapo.model.loading import load_policy

    device = resolve_device(device)
    name = resolve_engine_name(spec.name, device.split(":")[0])  # the device's type: cuda:1 is a cuda device
    switch = {} if remote_code_switch is None else {"remote_code_switch": remote_code_switch}
    policy = load_policy(model_cfg, device=device, **switch)
    if fresh_adapters:
        policy = with_lora(policy, model_cfg)
    max_len = spec.max_model_len or int(
        getattr(policy.model.config, "max_position_embeddings", 0) or DEFAULT_MAX_MODEL_LEN
    )
    spec = spec.replace(name=name, max_model_len=max_len)
    return LoadedEngine(build_rollout_engine(spec, policy), policy, spec, device)
