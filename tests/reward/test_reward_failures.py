"""A reward function cannot lie or kill the trainer: strict return values, every failure bounded, counted and
decided by the policy (real custom reward files, real worker processes)."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from dapo.reward.batch import RewardInput, RewardResult, RewardScorer, RewardScoringError, score_batch
from dapo.reward.records import InvalidRewardError, as_reward_result
from dapo.reward.registry import ScorerRegistry

HOSTILE = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "HANG":
        time.sleep(60)
    if solution_str == "EXIT":
        os._exit(7)
    if solution_str == "RAISE":
        raise RuntimeError("cannot score " + solution_str)
    if solution_str == "LIAR":
        return {"score": -1, "acc": "False"}
    if solution_str == "HUGE":
        return 1e39
    return 1.0 if solution_str == ground_truth else -1.0
"""


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    path = tmp_path / "hostile_reward.py"
    path.write_text(textwrap.dedent(HOSTILE), encoding="utf-8")
    return f"{path}:compute_score"


# --------------------------------------------------------------------------------------- return values
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ({"score": -1, "acc": "False"}, "'False'"),
        ({"score": 1, "acc": 2}, "int 2"),
        ({"score": 1, "acc": None}, "None"),
        ({"score": "1.0"}, "'1.0'"),
        ("1", "'1'"),
        (1e39, "1e+39"),
        (-3.5e38, "-3.5e+38"),
        (10**400, "1000"),
        ({"score": float("nan")}, "nan"),
        ([1.0], "[1.0]"),
        (None, "None"),
    ],
)
def test_invalid_returns_are_errors_naming_the_function_and_the_value(raw: object, shown: str) -> None:
    with pytest.raises(InvalidRewardError, match="my_fn") as info:
        as_reward_result(raw, where="custom reward function f.py:my_fn")
    assert shown in str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"score": -1, "acc": False}, RewardResult(-1.0, False, "")),
        ({"score": 0.5, "acc": 1}, RewardResult(0.5, True, "")),
        ({"score": 0.5, "acc": 0.0}, RewardResult(0.5, False, "")),
        ({"score": np.float32(2.0), "acc": np.bool_(True)}, RewardResult(2.0, True, "")),
        (np.int64(-1), RewardResult(-1.0, False, "")),
        (3.0e38, RewardResult(3.0e38, True, "")),
    ],
)
def test_valid_returns_are_accepted(raw: object, expected: RewardResult) -> None:
    assert as_reward_result(raw, where="f") == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize(("response", "shown"), [("LIAR", "'False'"), ("HUGE", "1e+39")])
def test_an_invalid_return_stops_scoring_whatever_the_policy(
    hostile: str, num_workers: int, response: str, shown: str
) -> None:
    items = [RewardInput("s", "1", "1"), RewardInput("s", response, "1")]
    with RewardScorer(num_workers=num_workers, custom_fn_spec=hostile, on_failure="score_as_failed") as scorer:
        with pytest.raises(
            RewardScoringError, match=r"(?s)item 1 \(data_source='s'\).*hostile_reward.py:compute_score"
        ) as info:
            scorer.score(items)
    assert shown in str(info.value)


# ------------------------------------------------------------------------------- bounded, counted calls
@pytest.mark.timeout(120)
def test_hang_exit_and_raise_are_bounded_and_counted_with_num_workers_0(hostile: str) -> None:
    items = [RewardInput("s", str(i), str(i) if i % 2 else "x") for i in range(8)]
    items[1] = RewardInput("s", "HANG", "1")
    items[4] = RewardInput("s", "EXIT", "1")
    items[6] = RewardInput("s", "RAISE", "1")
    t0 = time.monotonic()
    with RewardScorer(num_workers=0, timeout_s=1.0, custom_fn_spec=hostile) as scorer:
        results = scorer.score(items)
        assert scorer.counts == {"timeout": 1, "worker_crash": 1, "error": 1}
        assert time.monotonic() - t0 < 30  # the 60 s sleep was cut at timeout_s
        assert [results[i].failure for i in (1, 4, 6)] == ["timeout", "worker_crash", "error"]
        assert "exit code 7" in results[4].error and "cannot score RAISE" in results[6].error
        expected = [RewardResult(1.0, True, "") if i % 2 else RewardResult(-1.0, False, "") for i in range(8)]
        expected[1] = expected[4] = expected[6] = RewardResult.failed()
        assert results == expected
        assert scorer.score(items[2:4]) == expected[2:4]  # the scorer carries on
    assert os.getpid()  # this process survived the os._exit


def test_score_batch_bounds_a_custom_function_with_num_workers_0(hostile: str) -> None:
    items = [RewardInput("s", "EXIT", "1"), RewardInput("s", "2", "2")]
    results = score_batch(items, custom_fn_spec=hostile)
    assert results == [RewardResult.failed(), RewardResult(1.0, True, "")]
    assert results[0].failure == "worker_crash"


def test_builtin_scorer_errors_are_counted_in_process() -> None:
    registry = ScorerRegistry()
    registry.register("*", lambda s, t, e: 1.0 if s == t else (1 / 0 if s == "ZERO" else -1.0))
    with RewardScorer(registry=registry) as scorer:
        results = scorer.score([RewardInput("s", "1", "1"), RewardInput("s", "ZERO", "1")])
    assert results == [RewardResult(1.0, True, ""), RewardResult.failed()]
    assert scorer.counts["error"] == 1 and "ZeroDivisionError" in results[1].error


# ------------------------------------------------------------------------------------------- the policy
def test_policy_stop_stops_at_the_first_failure(hostile: str) -> None:
    with RewardScorer(custom_fn_spec=hostile, on_failure="stop") as scorer:
        with pytest.raises(
            RewardScoringError, match=r"(?s)on_failure=stop.*sample 1 \(data_source='s'\).*cannot score"
        ):
            scorer.score([RewardInput("s", "1", "1"), RewardInput("s", "RAISE", "1")])


def test_policy_stops_after_max_failures(hostile: str) -> None:
    items = [RewardInput("s", "1", "1"), RewardInput("s", "RAISE", "1")]
    with RewardScorer(custom_fn_spec=hostile, max_failures=2) as scorer:
        scorer.score(items)
        scorer.score(items)
        with pytest.raises(
            RewardScoringError, match=r"3 calls .* failed in this run, more than reward_model.max_failures=2"
        ):
            scorer.score(items)


def test_a_batch_where_every_call_fails_blames_the_reward_function(hostile: str) -> None:
    with RewardScorer(custom_fn_spec=hostile, max_failures=None) as scorer:
        with pytest.raises(
            RewardScoringError,
            match=r"every call to the custom reward function .*hostile_reward.py"
            r".* failed in a batch of 3 .*broken, not the data",
        ):
            scorer.score([RewardInput("s", "RAISE", "1")] * 3)


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="on_failure"):
        RewardScorer(on_failure="ignore")
