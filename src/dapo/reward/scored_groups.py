"""Scored prompt groups: a prompt's G responses with their rule reward, shaped reward and accuracy.

A group is the unit that Dynamic Sampling keeps or drops and that is never split (not by trimming, not across
mini-batches). The raw accuracy decides the filter (Eq. 11); the shaped reward (score + soft overlong punishment,
Eq. 13) feeds the advantage (Eq. 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from dapo.config import DapoConfig
from dapo.core.overlong import compute_soft_overlong_penalty
from dapo.data.prompts import PromptItem
from dapo.reward.batch import RewardInput, RewardScorer
from dapo.reward.registry import registry_for_compat
from dapo.rollout.base import RolloutOutput
from dapo.rollout.multi_turn import model_text


@dataclass
class ScoredGroup:
    prompt: PromptItem
    response_ids: list[list[int]]
    rollout_log_probs: list[list[float]]
    truncated: list[bool]  # finish reason "length": hit max_response_length
    scores: list[float]  # the rule-based reward, +1 / -1
    acc: list[bool]
    overlong_penalty: list[float]
    preds: list[str]
    # Multi-turn trajectories only (dapo.rollout.multi_turn): per response, 1 on the model's tokens and 0 on tool
    # output; and each response's tool-call result categories. None for single-turn rollouts.
    action_masks: list[list[int]] | None = None
    tool_categories: list[list[str]] | None = None
    # Per response, per sampled token: the weight version (trainer step) the engine held when it drew the token (a
    # trajectory's model tokens only, never its tool tokens: dapo.rollout.multi_turn); None until
    # the rollout side stamps it (asynchronous training reads the lag of each sample from here, dapo.training.staleness).
    token_versions: list[list[int]] | None = None
    # Per response, ``[prompt + response tokens, MoE layers, k]`` expert ids the rollout routed each token to (R3,
    # ``actor.router_replay.mode``; -1 where none was recorded); None otherwise.
    routed_experts: list[torch.Tensor] | None = None

    @property
    def rewards(self) -> list[float]:
        """Shaped reward R(y) + R_length(y) (Eq. 13 added to the rule reward)."""
        return [s + p for s, p in zip(self.scores, self.overlong_penalty)]

    @property
    def tool_use(self) -> list[tuple[list[str], bool]]:
        """Per response, its tool calls' result categories and whether it is right; empty for single-turn groups
        (what :func:`dapo.tools.metrics.tool_use_metrics` takes)."""
        return [] if self.tool_categories is None else list(zip(self.tool_categories, self.acc, strict=True))

    @property
    def num_response_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    def to_state(self) -> dict:
        """JSON-able form, so carried-over groups survive a checkpoint."""
        return {
            "prompt": {
                "uid": self.prompt.uid,
                "input_ids": list(self.prompt.input_ids),
                "ground_truth": self.prompt.ground_truth,
                "data_source": self.prompt.data_source,
                "extra_info": dict(self.prompt.extra_info),
            },
            "response_ids": self.response_ids,
            "rollout_log_probs": self.rollout_log_probs,
            "truncated": self.truncated,
            "scores": self.scores,
            "acc": self.acc,
            "overlong_penalty": self.overlong_penalty,
            "preds": self.preds,
            **(
                {}
                if self.action_masks is None
                else {"action_masks": self.action_masks, "tool_categories": self.tool_categories}
            ),
            **({} if self.token_versions is None else {"token_versions": self.token_versions}),
            **({} if self.routed_experts is None else {"routed_experts": [r.tolist() for r in self.routed_experts]}),
        }

    @classmethod
    def from_state(cls, state: dict) -> "ScoredGroup":
        p = state["prompt"]
        prompt = PromptItem(
            p["uid"], tuple(p["input_ids"]), p["ground_truth"], p["data_source"], dict(p.get("extra_info", {}))
        )  # checkpoints before extra_info was saved have none
        return cls(
            prompt,
            state["response_ids"],
            state["rollout_log_probs"],
            state["truncated"],
            state["scores"],
            state["acc"],
            state["overlong_penalty"],
            state["preds"],
            state.get("action_masks"),
            state.get("tool_categories"),
            state.get("token_versions"),
            None
            if "routed_experts" not in state
            else [torch.tensor(r, dtype=torch.int16) for r in state["routed_experts"]],
        )


def group_index_of(groups: Sequence[ScoredGroup]) -> torch.Tensor:
    """Per-sample group id (0, 0, ..., 1, 1, ...) of groups laid out one after another, as core functions take it."""
    sizes = torch.tensor([len(g.acc) for g in groups], dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(groups)), sizes)


def reward_scorer_of(cfg: DapoConfig) -> RewardScorer:
    """The ``RewardScorer`` that ``cfg.reward_model`` and ``cfg.custom_reward_function`` describe (close it after use)."""
    rm, custom = cfg.reward_model, cfg.custom_reward_function
    return RewardScorer(
        num_workers=rm.num_workers,
        timeout_s=rm.timeout_s,
        custom_fn_spec=f"{custom.path}:{custom.name}" if custom.path else None,
        on_failure=rm.on_failure,
        max_failures=rm.max_failures,
        registry=registry_for_compat(rm.compat),
    )


def score_rollout(
    prompts: Sequence[PromptItem],
    rollout: RolloutOutput,
    tokenizer,
    cfg: DapoConfig,
    scorer: RewardScorer | None = None,
) -> list[ScoredGroup]:
    """Decode (a multi-turn trajectory: the model's tokens only, :func:`~dapo.rollout.multi_turn.model_text`), score
    with the rule reward, add the soft overlong punishment, and regroup by prompt.

    ``scorer`` (kept across calls by a trainer) applies the failure policy; without one a scorer is built from ``cfg``
    for this call only.
    """
    action_masks = getattr(rollout, "action_mask", None)  # a multi-turn rollout says which tokens are the model's
    if action_masks is None:
        texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    else:  # the reward scores the model's own tokens: an "Answer:" line printed by the tool earns nothing
        texts = [model_text(tokenizer, ids, mask) for ids, mask in zip(rollout.response_ids, action_masks, strict=True)]
    inputs = [
        RewardInput(prompts[p].data_source, text, prompts[p].ground_truth, prompts[p].extra_info)
        for p, text in zip(rollout.prompt_index, texts)
    ]
    if scorer is not None:
        results = scorer.score(inputs)
    else:
        with reward_scorer_of(cfg) as one_off:
            results = one_off.score(inputs)
    lengths = torch.tensor([len(r) for r in rollout.response_ids], dtype=torch.long)
    ob = cfg.reward_model.overlong_buffer
    if ob.enable:
        penalty = compute_soft_overlong_penalty(
            lengths,
            max_response_length=cfg.data.max_response_length,
            overlong_buffer_len=ob.len,
            penalty_factor=ob.penalty_factor,
        ).tolist()
    else:
        penalty = [0.0] * len(lengths)

    tool_categories = getattr(rollout, "tool_categories", None)
    token_versions = rollout.token_versions  # set by an engine in a rollout worker (RemoteEngine), else None
    routed_experts = rollout.routed_experts  # R3: the rollout's routes, else None
    groups: dict[int, ScoredGroup] = {}
    for i, p in enumerate(rollout.prompt_index):
        g = groups.get(p)
        if g is None:
            g = groups[p] = ScoredGroup(prompts[p], [], [], [], [], [], [], [])
        g.response_ids.append(list(rollout.response_ids[i]))
        g.rollout_log_probs.append(list(rollout.logprobs[i]))
        g.truncated.append(rollout.finish_reason[i] == "length")
        g.scores.append(float(results[i].score))
        g.acc.append(bool(results[i].acc))
        g.overlong_penalty.append(float(penalty[i]))
        g.preds.append(results[i].pred)
        if action_masks is not None:
            g.action_masks = (g.action_masks or []) + [list(action_masks[i])]
            g.tool_categories = (g.tool_categories or []) + [list(tool_categories[i])]
        if token_versions is not None:
            g.token_versions = (g.token_versions or []) + [list(token_versions[i])]
        if routed_experts is not None:
            g.routed_experts = (g.routed_experts or []) + [routed_experts[i]]
    return [groups[p] for p in sorted(groups)]
