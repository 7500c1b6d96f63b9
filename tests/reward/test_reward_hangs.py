"""Hanging reward calls run side by side, and a failure policy stops a doomed batch early (real hanging functions
in real worker processes; short timeouts keep it fast).

Before: calls that timed out ran one after another (16 samples at a 10 s timeout: 3 min) and ``max_failures`` only
acted once the whole batch was done (128 samples at 2 s: 5 min 47 s). Each hanging call records when it started,
so the tests assert what happened (overlap, calls attempted), never how long it took.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dapo.reward.batch import RewardInput, RewardResult, RewardScorer, RewardScoringError
from dapo.reward.pool import RewardWorkerPool

REWARD = """
import os, time

LOG = {log!r}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("HANG"):
        with open(os.path.join(LOG, solution_str), "w") as f:
            f.write(repr(time.time()))
        time.sleep(60)
    if solution_str.startswith("SLOW"):
        time.sleep(0.6)
    return 1.0 if solution_str.endswith(ground_truth) else -1.0
"""


@pytest.fixture
def reward(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "started"
    log.mkdir()
    path = tmp_path / "hanging_reward.py"
    path.write_text(textwrap.dedent(REWARD.format(log=str(log))), encoding="utf-8")
    return f"{path}:compute_score", log


def _started(log: Path) -> list[float]:
    return sorted(float(p.read_text()) for p in log.iterdir())


def test_hanging_calls_run_side_by_side_and_each_fails_alone(reward: tuple[str, Path]) -> None:
    spec, log = reward
    items = [RewardInput("s", f"HANG{k}", "1") if k % 2 else RewardInput("s", f"ok{k}1", "1") for k in range(8)]
    with RewardScorer(num_workers=0, timeout_s=1.5, custom_fn_spec=spec, max_failures=None) as scorer:
        results = scorer.score(items)
    assert [r.failure for r in results] == ["", "timeout"] * 4
    assert [r.score for r in results[::2]] == [1.0] * 4
    starts = _started(log)
    assert len(starts) == 4  # every hanging call ran once, none was retried
    # Side by side: two hanging calls started less than a timeout apart, so they ran at the same time (before, each
    # one started only after the previous one had been killed at its timeout).
    assert min(b - a for a, b in zip(starts, starts[1:])) < 1.5, starts


def test_max_failures_stops_the_batch_at_the_failure_that_exceeds_it(reward: tuple[str, Path]) -> None:
    spec, log = reward
    items = [RewardInput("s", f"HANG{k}", "1") for k in range(16)] + [RewardInput("s", "ok1", "1")]
    with RewardScorer(num_workers=0, timeout_s=1.0, custom_fn_spec=spec, max_failures=2) as scorer:
        # Calls time out side by side, so several may fail at the same moment: at least 3, and the batch stops there.
        with pytest.raises(
            RewardScoringError,
            match=r"([3-9]|1[0-5]) calls .* failed in this run, more than "
            r"reward_model.max_failures=2 .*were not scored",
        ):
            scorer.score(items)
    # The batch stopped once a third call failed: at most the pool's workers (1 + 8 spares) had started a hanging
    # call by then, not all 16 (before: every one of them ran to its timeout first).
    assert 3 <= len(_started(log)) < 16


def test_on_failure_stop_stops_at_the_first_timeout(reward: tuple[str, Path]) -> None:
    spec, log = reward
    items = [RewardInput("s", f"HANG{k}", "1") for k in range(16)]
    with RewardScorer(num_workers=0, timeout_s=1.0, custom_fn_spec=spec, on_failure="stop") as scorer:
        with pytest.raises(RewardScoringError, match="on_failure=stop"):
            scorer.score(items)
    assert len(_started(log)) < 16


def test_a_slow_call_hands_the_rest_of_its_chunk_to_a_spare_and_every_result_keeps_its_place(
    reward: tuple[str, Path],
) -> None:
    spec, _ = reward
    items = [RewardInput("s", f"SLOW{k}1" if k in (0, 9) else f"x{k}{k % 2}", "1") for k in range(20)]
    with RewardWorkerPool(1, timeout_s=10.0, custom_fn_spec=spec, chunk_size=10, suspect_after_s=0.2) as pool:
        results = pool.score(items)
        assert len(pool.worker_pids) == 1  # the spares stopped at the end of the batch
        assert pool.score(items[:3]) == results[:3]  # and the pool carries on
    expected = [RewardResult(1.0 if k in (0, 9) or k % 2 else -1.0, k in (0, 9) or bool(k % 2), "") for k in range(20)]
    assert results == expected
    assert all(not r.failure for r in results)
