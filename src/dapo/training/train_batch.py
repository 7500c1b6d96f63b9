"""Algorithm 1, line 10: the kept groups become a train batch with group-relative advantages (Eq. 9) on the shaped
reward and the overlong-filter mask (Sec. 3.4)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.actor.batch import TrainBatch
from dapo.config import DapoConfig
from dapo.core.advantages import get_adv_estimator
from dapo.core.overlong import overlong_filter_mask
from dapo.reward.scored_groups import ScoredGroup, group_index_of


def action_token_counts(groups: Sequence[ScoredGroup]) -> torch.Tensor:
    """``[N]`` tokens per response that enter the loss: in a multi-turn batch only the model's own (its action mask;
    tool output is context, as verl's whitening mask), else every token. The same rule as the batch's action_mask."""
    if any(g.action_masks is None for g in groups):
        return torch.tensor([len(r) for g in groups for r in g.response_ids], dtype=torch.long)
    return torch.tensor([sum(1 for a in m if a) for g in groups for m in g.action_masks], dtype=torch.long)


def build_train_batch(groups: Sequence[ScoredGroup], cfg: DapoConfig) -> TrainBatch:
    """One sample per response, groups contiguous, in the order given."""
    rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float32)
    group_index = group_index_of(groups)
    estimator = get_adv_estimator(cfg.algorithm.adv_estimator)
    advantages = estimator(
        rewards,
        group_index,
        norm_adv_by_std=cfg.algorithm.norm_adv_by_std_in_grpo,
        token_counts=action_token_counts(groups),
    )
    truncated = torch.tensor([t for g in groups for t in g.truncated], dtype=torch.bool)
    sample_mask = overlong_filter_mask(truncated) if cfg.algorithm.overlong_filter else torch.ones_like(truncated)
    return TrainBatch(
        prompt_ids=[list(g.prompt.input_ids) for g in groups for _ in g.response_ids],
        response_ids=[r for g in groups for r in g.response_ids],
        advantages=advantages,
        sample_mask=sample_mask,
        group_index=group_index,
        rollout_log_probs=[torch.tensor(lp, dtype=torch.float32) for g in groups for lp in g.rollout_log_probs],
        # multi-turn: a tool's output is context, not an action (no gradient, no entropy, not counted in Eq. 12)
        action_mask=None
        if any(g.action_masks is None for g in groups)
        else [torch.tensor(m, dtype=torch.bool) for g in groups for m in g.action_masks],
        # R3: the rollout's routes, replayed by the actor's passes
        routed_experts=None
        if any(g.routed_experts is None for g in groups)
        else [r for g in groups for r in g.routed_experts],
    )
