"""What a newcomer should know before choosing partial rollouts: their price, which the config alone cannot show."""

from __future__ import annotations

from dapo.config.schema import DapoConfig


def partial_rollout_notice(cfg: DapoConfig) -> str | None:
    """A note for ``async_training.partial_rollout=true``: each segment of ``partial_rollout_chunk_tokens`` tokens
    re-prefills its prompt and the tokens so far, one row per sample, so on the Transformers engine a step costs a
    multiple of one_step_off's (the recorded 30-step runs, docs/performance.md); without it a run looks stuck."""
    at = cfg.async_training
    if not (at.mode == "fully_async" and at.partial_rollout):
        return None
    return (
        f"async_training.partial_rollout=true: every {at.partial_rollout_chunk_tokens}-token segment "
        "(async_training.partial_rollout_chunk_tokens) prefills its prompt and the tokens so far again, one row "
        "per sample; on the Transformers engine (and a shared CPU) a step then takes several times one_step_off's "
        "(docs/performance.md, 'All asynchronous modes'). async_training.mode=one_step_off, or longer segments, "
        "cost less"
    )
