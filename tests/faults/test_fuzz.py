"""Hypothesis fuzzing with bounded time: the reward return validator and the config parser raise nothing but their
documented errors, and anything the config accepts, the core functions accept."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.config import ConfigError, build_config
from dapo.core.overlong import compute_soft_overlong_penalty
from dapo.core.policy_loss import compute_policy_loss
from dapo.reward.records import FLOAT32_MAX, InvalidRewardError, RewardResult, as_reward_result

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                    st.binary(max_size=8), st.integers(min_value=-(10**400), max_value=10**400))
returns = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["score", "acc", "pred", "extra"]), inner, max_size=4)), max_leaves=8)


@pytest.mark.timeout(120)
@settings(max_examples=1500, deadline=None)
@given(returns)
def test_reward_return_validation_accepts_only_valid_rewards(raw: object) -> None:
    try:
        result = as_reward_result(raw, where="fuzzed scorer")
    except InvalidRewardError as exc:
        assert "fuzzed scorer" in str(exc)
        return
    assert isinstance(result, RewardResult) and type(result.acc) is bool and isinstance(result.pred, str)
    assert math.isfinite(result.score) and abs(result.score) <= FLOAT32_MAX
    if isinstance(raw, dict) and "acc" in raw:
        assert isinstance(raw["acc"], bool) or raw["acc"] in (0, 1)


KEYS = ["actor.clip_ratio_low", "actor.clip_ratio_high", "actor.clip_ratio_c", "actor.optim.lr", "actor.optim.betas",
        "reward_model.timeout_s", "reward_model.max_failures", "reward_model.on_failure", "data.max_response_length",
        "reward_model.overlong_buffer.len", "reward_model.overlong_buffer.penalty_factor", "rollout.n",
        "data.train_batch_size", "trainer.resume_mode", "no.such.key", "actor.grad_clip"]
values = st.one_of(st.floats(), st.integers(min_value=-5, max_value=300), st.sampled_from(
    ["null", "true", "[0.9, 0.999]", "[1.5, 0.9]", ".inf", ".nan", "stop", "score_as_failed", "{a: 1}", "[", "'x"]),
    st.text(max_size=10))


@pytest.mark.timeout(180)
@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), values), max_size=5))
def test_config_parser_raises_only_config_errors_and_what_it_accepts_the_run_accepts(pairs) -> None:
    overrides = [f"{k}={v}" for k, v in pairs]
    try:
        cfg = build_config({}, overrides)
    except ConfigError:
        return
    a = cfg.actor
    t = torch.zeros(1, 3)
    compute_policy_loss(t, t, torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), clip_ratio_low=a.clip_ratio_low,
                        clip_ratio_high=a.clip_ratio_high, clip_ratio_c=a.clip_ratio_c)
    ob = cfg.reward_model.overlong_buffer
    if ob.enable:
        compute_soft_overlong_penalty(torch.tensor([0, cfg.data.max_response_length]),
                                      max_response_length=cfg.data.max_response_length, overlong_buffer_len=ob.len,
                                      penalty_factor=ob.penalty_factor)
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=a.optim.lr, betas=a.optim.betas, eps=a.optim.eps,
                      weight_decay=a.optim.weight_decay)
