"""Rollout: sample responses (token ids, log-probs, finish reasons) from the policy for a batch of prompts.

Callers build an engine with :func:`build_rollout_engine` and use it through the :class:`RolloutEngine` interface.
The engines (and torch/transformers/vLLM with them) are imported on first use, so importing the interface stays cheap
(the CLI and every spawned reward worker import it).
"""

from __future__ import annotations

import importlib
from typing import Any

from dapo.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

_LAZY = {
    "ENGINE_NAMES": "dapo.rollout.factory",
    "EngineUnavailableError": "dapo.rollout.errors",
    "EngineSpec": "dapo.rollout.spec",
    "build_rollout_engine": "dapo.rollout.factory",
    "engine_available": "dapo.rollout.factory",
    "HFRolloutEngine": "dapo.rollout.hf_engine",
    "draw_from": "dapo.rollout.sampler",
    "sample_next_tokens": "dapo.rollout.sampler",
    "truncate_logits": "dapo.rollout.sampler",
}

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dapo.rollout' has no attribute {name!r}")
