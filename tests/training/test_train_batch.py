"""build_train_batch (Algorithm 1, line 10): group-relative advantages of the shaped reward (Eq. 9 on score + soft
overlong penalty) against hand-computed values, the Dr. GRPO variant, the overlong-filter mask, contiguous group ids in
the order given, and the per-sample prompt / response / rollout log-prob fields."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dapo.actor.batch import TrainBatch
from dapo.config import DapoConfig, build_config
from dapo.data.prompts import PromptItem
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.train_batch import build_train_batch

EPS = 1e-6  # the estimator's default, added to the group std


def _group(uid: int, scores: list[float], penalty: list[float], truncated: list[bool] | None = None) -> ScoredGroup:
    n = len(scores)
    responses = [[10 * uid + k + 1] * (k + 1) for k in range(n)]  # response k of prompt uid has k + 1 tokens
    return ScoredGroup(
        prompt=PromptItem(uid, (uid + 1, uid + 2), "gt", "synth"),
        response_ids=responses,
        rollout_log_probs=[[-0.1 * (k + 1) - uid] * len(r) for k, r in enumerate(responses)],
        truncated=truncated if truncated is not None else [False] * n,
        scores=scores,
        acc=[s > 0 for s in scores],
        overlong_penalty=penalty,
        preds=[""] * n,
    )


def _groups() -> list[ScoredGroup]:
    return [
        # Shaped rewards (1, -1.5, -1): mean -0.5, deviations (1.5, -1, -0.5), unbiased var 3.5 / 2 = 1.75.
        _group(0, [1.0, -1.0, -1.0], [0.0, -0.5, 0.0], truncated=[False, True, False]),
        # Same score, but the second response is in the overlong buffer: shaped (1, 0), mean 0.5, var 0.5.
        _group(1, [1.0, 1.0], [0.0, -1.0], truncated=[False, True]),
        # All equal: no learning signal, advantage exactly 0.
        _group(2, [-1.0, -1.0], [0.0, 0.0]),
    ]


def test_grpo_advantages_of_the_shaped_reward_are_hand_computed() -> None:
    batch = build_train_batch(_groups(), DapoConfig())
    std_a, std_b = math.sqrt(1.75), math.sqrt(0.5)
    expected = [
        1.5 / (std_a + EPS),
        -1 / (std_a + EPS),
        -0.5 / (std_a + EPS),
        0.5 / (std_b + EPS),
        -0.5 / (std_b + EPS),
        0.0,
        0.0,
    ]
    assert isinstance(batch, TrainBatch)
    assert batch.advantages.dtype == torch.float32
    assert batch.advantages.tolist() == pytest.approx(expected, rel=1e-5)
    assert batch.advantages[5:].tolist() == [0.0, 0.0]


def test_group_with_equal_scores_gets_a_signal_only_from_the_overlong_penalty() -> None:
    # Raw scores of group 1 are equal (1, 1); only the penalty separates them. The soft penalty must be in the reward.
    batch = build_train_batch([_groups()[1]], DapoConfig())
    assert batch.advantages[0] > 0 > batch.advantages[1]
    no_penalty = _group(1, [1.0, 1.0], [0.0, 0.0])
    assert build_train_batch([no_penalty], DapoConfig()).advantages.tolist() == [0.0, 0.0]


def test_dr_grpo_only_subtracts_the_group_mean() -> None:
    cfg = build_config({}, ["algorithm.norm_adv_by_std_in_grpo=false"])
    batch = build_train_batch(_groups(), cfg)
    assert batch.advantages.tolist() == pytest.approx([1.5, -1.0, -0.5, 0.5, -0.5, 0.0, 0.0], abs=1e-6)


def test_overlong_filter_masks_the_truncated_samples() -> None:
    on = build_train_batch(_groups(), build_config({}, ["algorithm.overlong_filter=true"]))
    assert on.sample_mask.dtype == torch.bool
    assert on.sample_mask.tolist() == [True, False, True, True, False, True, True]
    off = build_train_batch(_groups(), DapoConfig())  # the default: off
    assert off.sample_mask.dtype == torch.bool
    assert off.sample_mask.tolist() == [True] * 7


def test_overlong_filter_does_not_change_the_advantages() -> None:
    on = build_train_batch(_groups(), build_config({}, ["algorithm.overlong_filter=true"]))
    off = build_train_batch(_groups(), DapoConfig())
    assert torch.equal(on.advantages, off.advantages)  # truncated samples still count in the group statistics


def test_samples_are_laid_out_group_after_group_in_the_order_given() -> None:
    groups = _groups()
    batch = build_train_batch(groups, DapoConfig())
    assert batch.group_index.dtype == torch.long
    assert batch.group_index.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert len(batch) == 7 and batch.num_groups == 3
    assert [p.tolist() for p in batch.prompt_ids] == [[1, 2]] * 3 + [[2, 3]] * 2 + [[3, 4]] * 2
    assert [r.tolist() for r in batch.response_ids] == [r for g in groups for r in g.response_ids]

    reordered = build_train_batch([groups[2], groups[0]], DapoConfig())
    assert reordered.group_index.tolist() == [0, 0, 1, 1, 1]  # ids are positions in the given order
    assert [p.tolist() for p in reordered.prompt_ids] == [[3, 4]] * 2 + [[1, 2]] * 3
    std_a = math.sqrt(1.75)
    assert reordered.advantages.tolist() == pytest.approx(
        [0.0, 0.0, 1.5 / (std_a + EPS), -1 / (std_a + EPS), -0.5 / (std_a + EPS)], rel=1e-5
    )


def test_rollout_log_probs_are_carried_per_response() -> None:
    groups = _groups()
    batch = build_train_batch(groups, DapoConfig())
    assert batch.rollout_log_probs is not None
    expected = [lp for g in groups for lp in g.rollout_log_probs]
    assert len(batch.rollout_log_probs) == 7
    for got, want, response in zip(batch.rollout_log_probs, expected, batch.response_ids):
        assert got.dtype == torch.float32 and got.shape == response.shape
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    # Nothing else is filled in at this point: the actor recomputes old log-probs, no reference, no IS weights yet.
    assert batch.old_log_probs is None and batch.ref_log_probs is None and batch.is_weights is None


def test_a_single_response_group_gets_zero_advantage() -> None:
    batch = build_train_batch([_group(4, [1.0], [-0.25])], DapoConfig())
    assert batch.advantages.tolist() == [0.0]
    assert batch.group_index.tolist() == [0]


def test_reinforce_plus_plus_whitens_over_action_tokens_not_tool_output() -> None:
    # One group of two, rewards (2, 0). Response 0: 4 tokens, the middle two a tool's output (action mask 1 0 0 1):
    # 2 action tokens. Response 1: 3 tokens, all actions. Over the 5 action tokens:
    #   reinforce_plus_plus: mean (2*2 + 3*0) / 5 = 0.8, centred (1.2, -0.8);
    #   _baseline: group mean 1, centred (1, -1), token mean (2*1 - 3*1) / 5 = -0.2, centred again (1.2, -0.8);
    #   both: unbiased variance (2 * 1.2^2 + 3 * 0.8^2) / 4 = 1.2, A = (1.2, -0.8) / sqrt(1.2 + 1e-8).
    # Counting the 2 tool tokens too (7 tokens) gives other values, which is what this test excludes.
    group = dataclasses.replace(
        _group(0, [2.0, 0.0], [0.0, 0.0]),
        response_ids=[[5, 6, 7, 8], [9, 9, 9]],
        rollout_log_probs=[[-0.1] * 4, [-0.2] * 3],
        action_masks=[[1, 0, 0, 1], [1, 1, 1]],
    )
    want = [1.2 / math.sqrt(1.2 + 1e-8), -0.8 / math.sqrt(1.2 + 1e-8)]
    for estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        batch = build_train_batch([group], build_config({}, [f"algorithm.adv_estimator={estimator}"]))
        assert batch.advantages.tolist() == pytest.approx(want, rel=1e-6), estimator
    # Single turn (no action mask) every token is an action: 4 + 3 tokens, mean 8/7, variance
    # (4 (6/7)^2 + 3 (8/7)^2) / 6 = 8/7.
    single = dataclasses.replace(group, action_masks=None)
    batch = build_train_batch([single], build_config({}, ["algorithm.adv_estimator=reinforce_plus_plus"]))
    assert batch.advantages.tolist() == pytest.approx(
        [(6 / 7) / math.sqrt(8 / 7 + 1e-8), (-8 / 7) / math.sqrt(8 / 7 + 1e-8)], rel=1e-6
    )
