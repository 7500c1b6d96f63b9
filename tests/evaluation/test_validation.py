"""Validation (dapo.evaluation.validation): summarize_validation's mean@k, pass@k, score and per-data_source keys on
hand-computed groups, val_acc_key, and validation_groups end to end with the real HF engine on the shipped tiny model
(sampling settings from rollout.val_kwargs, seeded, groups in prompt order, metrics consistent with the groups)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
import torch

from dapo.config import DapoConfig, build_config
from dapo.data.prompts import PromptItem
from dapo.data.task import load_task
from dapo.evaluation.validation import summarize_validation, val_acc_key, validation_groups
from dapo.model.loading import Policy, load_policy
from dapo.reward.scored_groups import ScoredGroup
from dapo.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from dapo.rollout.factory import EngineSpec, build_rollout_engine


def _group(uid: int, source: str, acc: list[bool], lengths: list[int], penalty: float = 0.0) -> ScoredGroup:
    return ScoredGroup(
        prompt=PromptItem(uid, (1, 2), "3", source),
        response_ids=[[9] * n for n in lengths],
        rollout_log_probs=[[-1.0] * n for n in lengths],
        truncated=[False] * len(acc),
        scores=[1.0 if a else -1.0 for a in acc],
        acc=acc,
        overlong_penalty=[penalty] * len(acc),
        preds=[""] * len(acc),
    )


# ---- summarize_validation ------------------------------------------------------------------------------------------

# aime:    A solved once in 4 (lengths 2, 4, 6, 8), B never (lengths 1 x 4).
# math500: C solved 3 times in 4 (lengths 3 x 4).
GROUPS = [
    _group(0, "aime", [True, False, False, False], [2, 4, 6, 8], penalty=-0.5),
    _group(1, "aime", [False] * 4, [1, 1, 1, 1]),
    _group(2, "math500", [True, True, False, True], [3, 3, 3, 3]),
]


def _ours(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("val/")}


def test_summary_of_hand_computed_groups() -> None:
    metrics = _ours(summarize_validation(GROUPS, 4))
    assert metrics == pytest.approx(
        {
            "val/acc/mean@4": 4 / 12,  # 1 + 0 + 3 right answers of 12 samples
            "val/pass@4": 2 / 3,  # A and C solved at least once
            "val/score/mean@4": (-2 - 4 + 2) / 12,  # the rule score (+1/-1); the overlong penalty of A is not in it
            "val/response_length/mean": (20 + 4 + 12) / 12,
            "val/aime/acc/mean@4": 1 / 8,
            "val/math500/acc/mean@4": 3 / 4,
            # per-prompt accuracies 1/4, 0, 3/4: s = sqrt(7/48) (ddof 1), half-width 1.96 s / sqrt(3)
            "val/acc/mean@4/ci95": 1.96 * (7 / 48) ** 0.5 / 3**0.5,
        }
    )


def test_one_data_source_has_no_per_source_keys() -> None:
    metrics = _ours(summarize_validation(GROUPS[:2], 4))
    assert set(metrics) == {
        "val/acc/mean@4",
        "val/acc/mean@4/ci95",
        "val/pass@4",
        "val/score/mean@4",
        "val/response_length/mean",
    }
    assert metrics["val/acc/mean@4"] == pytest.approx(1 / 8)
    assert metrics["val/pass@4"] == pytest.approx(1 / 2)
    assert metrics["val/score/mean@4"] == pytest.approx(-6 / 8)


def test_multi_turn_groups_add_val_tool_metrics_by_hand() -> None:
    import dataclasses

    used = [
        dataclasses.replace(GROUPS[0], tool_categories=[["ok"], ["ok", "timeout"], [], []]),
        dataclasses.replace(GROUPS[2], tool_categories=[["ok"], [], ["error"], ["ok"]]),
    ]
    tool = {k: v for k, v in summarize_validation(used, 4).items() if k.startswith("val/tool/")}
    assert tool["val/tool/samples_with_call"] == pytest.approx(5 / 8)
    assert tool["val/tool/calls_per_sample"] == pytest.approx(6 / 8)
    assert (tool["val/tool/errors"], tool["val/tool/timeouts"]) == (2.0, 1.0)
    # with a call: A's samples 0 (right) and 1, C's 0, 2, 3 (right, wrong, right): 3 of 5; without: 0 of 1 + 1 of 1
    assert tool["val/tool/acc_with_call"] == pytest.approx(3 / 5)
    assert tool["val/tool/acc_without_call"] == pytest.approx(1 / 3)
    assert not any(k.startswith("val/tool/") for k in summarize_validation(GROUPS, 4))  # single-turn: none


def test_k_only_names_the_keys() -> None:
    metrics = summarize_validation([_group(0, "aime", [True, False], [1, 1])], 32)
    assert metrics["val/acc/mean@32"] == 0.5 and metrics["val/pass@32"] == 1.0


def test_all_right_and_all_wrong() -> None:
    right = summarize_validation([_group(0, "s", [True] * 3, [5, 5, 5])], 3)
    assert (right["val/acc/mean@3"], right["val/pass@3"], right["val/score/mean@3"]) == (1.0, 1.0, 1.0)
    wrong = summarize_validation([_group(0, "s", [False] * 3, [5, 5, 5])], 3)
    assert (wrong["val/acc/mean@3"], wrong["val/pass@3"], wrong["val/score/mean@3"]) == (0.0, 0.0, -1.0)


def test_no_groups_no_metrics() -> None:
    assert summarize_validation([], 8) == {}


def _problem(uid: int, source: str, prompt: tuple[int, ...], acc: list[bool], lengths: list[int]) -> ScoredGroup:
    group = _group(uid, source, acc, lengths)
    group.prompt = PromptItem(uid, prompt, "3", source)
    return group


def test_verl_names_group_samples_by_problem() -> None:
    # The official AIME layout: each problem repeated as separate rows, sampled once each (n=1).
    rows = [_problem(i, "math_dapo", (7,), [i < 3], [10]) for i in range(4)]  # problem X: 3 of 4 right
    rows += [_problem(4 + i, "math_dapo", (8,), [False], [20]) for i in range(4)]  # problem Y: 0 of 4
    metrics = summarize_validation(rows, 1)
    assert metrics["val/acc/mean@1"] == pytest.approx(3 / 8)
    assert metrics["val-core/math_dapo/acc/mean@4"] == pytest.approx(3 / 8)
    assert metrics["val-aux/math_dapo/score/mean@4"] == pytest.approx((0.5 + -1.0) / 2)
    assert metrics["val-aux/math_dapo/acc/best@4/mean"] == pytest.approx(1 / 2)
    assert metrics["val-aux/math_dapo/acc/std@4"] == pytest.approx((0.75 * 0.25) ** 0.5 / 2)
    assert metrics["val-aux/math_dapo/response_length/mean"] == pytest.approx(15.0)
    # The same problems as one group of 4 samples each (a de-duplicated file with n=4) give the same verl metrics.
    dedup = [
        _problem(0, "math_dapo", (7,), [True, True, True, False], [10] * 4),
        _problem(1, "math_dapo", (8,), [False] * 4, [20] * 4),
    ]
    verl_keys = [k for k in metrics if not k.startswith("val/")]
    assert {k: summarize_validation(dedup, 4)[k] for k in verl_keys} == pytest.approx(
        {k: metrics[k] for k in verl_keys}
    )


def test_verl_core_key_per_data_source() -> None:
    metrics = summarize_validation(GROUPS, 4)
    assert metrics["val-core/math500/acc/mean@4"] == pytest.approx(3 / 4)
    assert metrics["val-core/aime/acc/mean@8"] == pytest.approx(1 / 8)  # A and B share a prompt here: one problem


def test_repeated_prompt_warning() -> None:
    from dapo.evaluation.validation import repeated_prompt_warning

    repeated = [PromptItem(i, (5, i % 2), "1", "aime") for i in range(64)]  # 2 problems x 32 rows
    message = repeated_prompt_warning(repeated, 32)
    assert message is not None and "32x" in message and "1024" in message and "val_kwargs.n=1" in message
    assert repeated_prompt_warning(repeated, 1) is None
    assert repeated_prompt_warning([PromptItem(i, (i,), "1", "aime") for i in range(5)], 32) is None


# ---- val_acc_key ---------------------------------------------------------------------------------------------------


def test_val_acc_key_finds_the_mean_at_k_key() -> None:
    assert val_acc_key(summarize_validation(GROUPS, 4)) == "val/acc/mean@4"
    assert val_acc_key({"val/pass@16": 0.5, "val/aime/acc/mean@16": 0.1, "val/acc/mean@16": 0.2}) == "val/acc/mean@16"


def test_val_acc_key_is_none_without_validation_metrics() -> None:
    assert val_acc_key({}) is None
    assert val_acc_key({"train/acc": 0.5, "val/pass@4": 1.0, "val/aime/acc/mean@4": 0.5}) is None


# ---- validation_groups, end to end --------------------------------------------------------------------------------------

L_MAX = 64
K = 8


class RecordingEngine:
    """The real engine, recording the prompts and sampling parameters it is asked for."""

    def __init__(self, inner: RolloutEngine) -> None:
        self.inner = inner
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        self.calls.append(([list(p) for p in prompt_token_ids], params))
        return self.inner.generate(prompt_token_ids, params)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.update_weights(named_tensors)

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        return self.inner.log_probs_of(prompt_token_ids, response_ids)

    def close(self) -> None:
        self.inner.close()


def _cfg(*overrides: str) -> DapoConfig:
    return build_config(
        {},
        [
            "data.synth.num_val=4",
            "data.synth.num_train=8",
            f"data.max_response_length={L_MAX}",
            f"rollout.val_kwargs.n={K}",
            "rollout.n=2",
            "rollout.top_p=1.0",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(_cfg().model)  # the shipped tiny Qwen2, on the CPU


@pytest.fixture(scope="module")
def val_prompts(policy: Policy) -> list[PromptItem]:
    prompts = load_task(_cfg().data, policy.tokenizer).val
    assert len(prompts) == 4
    return prompts


def _validate(
    policy: Policy, prompts: list[PromptItem], cfg: DapoConfig, seed: int = 0
) -> tuple[RecordingEngine, dict[str, float], list[ScoredGroup]]:
    engine = RecordingEngine(build_rollout_engine(EngineSpec(seed=cfg.trainer.seed), policy))
    groups = validation_groups(engine, prompts, policy.tokenizer, cfg, seed=seed)
    return engine, summarize_validation(groups, cfg.rollout.val_kwargs.n), groups


def test_validation_groups_end_to_end(policy: Policy, val_prompts: list[PromptItem]) -> None:
    cfg = _cfg()
    engine, metrics, groups = _validate(policy, val_prompts, cfg, seed=0)

    # One generate call at the evaluation setting of rollout.val_kwargs, not the training rollout's n / top_p.
    ((asked_prompts, params),) = engine.calls
    assert asked_prompts == [list(p.input_ids) for p in val_prompts]
    vk = cfg.rollout.val_kwargs
    assert params == SamplingParams(
        n=K, temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k, max_tokens=L_MAX, stop_token_ids=(), seed=0
    )
    assert vk.top_p == 0.7  # the paper's evaluation setting (the default)

    # One group of K samples per prompt, in prompt order.
    assert [g.prompt for g in groups] == val_prompts
    assert all(len(g.response_ids) == len(g.acc) == len(g.scores) == K for g in groups)
    for g in groups:
        for ids, lps, truncated in zip(g.response_ids, g.rollout_log_probs, g.truncated):
            assert 1 <= len(ids) <= L_MAX and len(lps) == len(ids)
            assert all(lp <= 0.0 for lp in lps)
            ended = ids[-1] in policy.eos_token_ids
            assert truncated == (not ended)
            assert not truncated or len(ids) == L_MAX
        assert all((s == 1.0) == a for s, a in zip(g.scores, g.acc))

    # The metrics are those of the returned groups.
    assert metrics == summarize_validation(groups, K)
    assert val_acc_key(metrics) == f"val/acc/mean@{K}"
    assert 0.0 <= metrics[f"val/acc/mean@{K}"] <= metrics[f"val/pass@{K}"] <= 1.0
    # The tiny model solves some of its task (pass@8 about 0.9 in its pretraining report).
    assert metrics[f"val/pass@{K}"] > 0.0


def test_validation_groups_is_seeded(policy: Policy, val_prompts: list[PromptItem]) -> None:
    cfg = _cfg()
    _, m1, g1 = _validate(policy, val_prompts, cfg, seed=7)
    _, m2, g2 = _validate(policy, val_prompts, cfg, seed=7)
    assert g1 == g2 and m1 == m2
    _, _, g3 = _validate(policy, val_prompts, cfg, seed=8)
    assert [g.response_ids for g in g3] != [g.response_ids for g in g1]


def test_greedy_validation_gives_identical_samples(policy: Policy, val_prompts: list[PromptItem]) -> None:
    # rollout.temperature must be > 0, so a greedy run can only come from val_kwargs.
    cfg = _cfg("rollout.val_kwargs.temperature=0", "rollout.val_kwargs.n=3")
    engine, metrics, groups = _validate(policy, val_prompts[:2], cfg)
    assert engine.calls[0][1].greedy and engine.calls[0][1].n == 3
    for g in groups:
        assert len(g.response_ids) == 3 and all(r == g.response_ids[0] for r in g.response_ids)
    assert metrics["val/acc/mean@3"] == metrics["val/pass@3"]  # each group is all right or all wrong


def test_short_l_max_truncates_and_penalises(policy: Policy, val_prompts: list[PromptItem]) -> None:
    cfg = _cfg("data.max_response_length=4", "reward_model.overlong_buffer.len=2")
    _, metrics, groups = _validate(policy, val_prompts[:2], cfg)
    # A worked solution is far longer than 4 tokens: every sample is cut at L_max and gets the full penalty -1.
    for g in groups:
        assert all(len(r) == 4 for r in g.response_ids) and all(g.truncated)
        assert g.overlong_penalty == [-1.0] * K
        assert g.rewards == [s - 1.0 for s in g.scores]
    assert metrics["val/response_length/mean"] == 4.0
    assert metrics == summarize_validation(groups, K)  # the penalty is in the groups, not in the val metrics
