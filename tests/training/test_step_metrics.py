"""Per-step metrics under verl's names: prompt_length/*, score and reward max/min, memory."""

from __future__ import annotations

import pytest
import torch

from dapo.data.prompts import PromptItem
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.step_metrics import batch_metrics, memory_metrics


def _group(prompt_len: int, acc: list[bool], penalty: float) -> ScoredGroup:
    return ScoredGroup(
        PromptItem(0, tuple(range(prompt_len)), "1", "s"),
        [[1, 2]] * len(acc),
        [[-1.0, -1.0]] * len(acc),
        [False] * len(acc),
        [1.0 if a else -1.0 for a in acc],
        acc,
        [penalty] * len(acc),
        [""] * len(acc),
    )


def test_prompt_length_score_and_reward_extremes():
    groups = [_group(3, [True, False], -0.5), _group(7, [False, False], 0.0)]
    m = batch_metrics(groups, torch.tensor([1.0, -1.0, 0.0, 0.0]), max_response_length=8)
    assert m["prompt_length/mean"] == pytest.approx(5.0)
    assert (m["prompt_length/max"], m["prompt_length/min"]) == (7.0, 3.0)
    assert (m["critic/score/max"], m["critic/score/min"]) == (1.0, -1.0)
    assert (m["critic/rewards/max"], m["critic/rewards/min"]) == (0.5, -1.5)
    assert m["perf/cpu_memory_used_gb"] > 0


def test_memory_metrics_names():
    m = memory_metrics()
    assert set(m) == {"perf/cpu_memory_used_gb"}
    assert 0 < m["perf/cpu_memory_used_gb"] < 1024
