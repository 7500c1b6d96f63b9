"""Rollout: sample responses (token ids, log-probs, finish reasons) from the policy for a batch of prompts."""

from dapo.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.rollout.sampler import draw_from, sample_next_tokens, truncate_logits

__all__ = [
    "HFRolloutEngine",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingParams",
    "draw_from",
    "sample_next_tokens",
    "truncate_logits",
]
