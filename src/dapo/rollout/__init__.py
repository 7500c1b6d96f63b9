"""Rollout: sample responses (token ids, log-probs, finish reasons) from the policy for a batch of prompts.

Callers build an engine with :func:`build_rollout_engine` and use it through the :class:`RolloutEngine` interface.
"""

from dapo.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from dapo.rollout.factory import ENGINE_NAMES, EngineUnavailableError, build_rollout_engine
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.rollout.sampler import draw_from, sample_next_tokens, truncate_logits

__all__ = [
    "ENGINE_NAMES",
    "EngineUnavailableError",
    "HFRolloutEngine",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingParams",
    "build_rollout_engine",
    "draw_from",
    "sample_next_tokens",
    "truncate_logits",
]
