"""Batch scoring: input order, in-process vs pool agreement, and a pool that survives hanging and crashing
scorers (real worker processes, a real custom reward file)."""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dapo.reward.batch import RewardInput, RewardResult, RewardScoringError, RewardWorkerPool, score_batch
from dapo.reward.registry import ScorerRegistry, UnknownDataSourceError, score_one

# Real custom reward function: hangs on "HANG", kills its own process on "CRASH", raises on "RAISE",
# else +1 if the response equals the ground truth. Returns a float, so acc = score > 0.
CUSTOM_SOURCE = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "HANG":
        time.sleep(3600)
    if solution_str == "CRASH":
        os._exit(3)
    if solution_str == "RAISE":
        raise ValueError("bad response " + str(extra_info))
    return 1.0 if solution_str == ground_truth else -1.0
"""


@pytest.fixture
def custom_spec(tmp_path: Path) -> str:
    path = tmp_path / "custom_reward.py"
    path.write_text(textwrap.dedent(CUSTOM_SOURCE), encoding="utf-8")
    return f"{path}:compute_score"


def mixed_items(n: int) -> list[RewardInput]:
    """Responses of every built-in kind, right and wrong, so order mistakes change the results."""
    items = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            items.append(RewardInput("math_dapo", f"step {i}\nAnswer: {i}", str(i if i % 3 else i + 1)))
        elif kind == 1:
            items.append(RewardInput("gsm8k-test", f"so\n#### {i:,}", f"work\n#### {i}"))
        elif kind == 2:
            items.append(RewardInput("synth", f"Answer: {i}.", str(i), {"index": i}))
        else:
            items.append(RewardInput("aime-2024", "x" * 400 + f"\\boxed{{{i}}}", str(i)))  # no Answer: line
    return items


def test_in_process_results_equal_score_one_in_order() -> None:
    items = mixed_items(40)
    expected = [score_one(it.data_source, it.solution_str, it.ground_truth, it.extra_info) for it in items]
    results = score_batch(items)
    assert results == expected
    assert [r.acc for r in results[:8]] == [False, True, True, False, True, True, True, False]


@pytest.mark.timeout(300)
def test_pool_agrees_with_in_process_and_is_reusable() -> None:
    items = mixed_items(203)  # not a multiple of the chunk size
    expected = score_batch(items)
    with RewardWorkerPool(2, timeout_s=30.0, chunk_size=16) as pool:
        assert pool.score(items) == expected
        assert pool.score(items[::-1]) == expected[::-1]
        assert pool.score([]) == []
        assert pool.kills == 0


@pytest.mark.timeout(300)
def test_pool_recovers_from_a_hanging_and_a_crashing_item(custom_spec: str) -> None:
    items = [RewardInput("any", str(i), str(i) if i % 2 else "other") for i in range(24)]
    items[5] = RewardInput("any", "HANG", "HANG")
    items[17] = RewardInput("any", "CRASH", "CRASH")
    with RewardWorkerPool(2, timeout_s=2.0, custom_fn_spec=custom_spec, chunk_size=4) as pool:
        results = pool.score(items)
        assert pool.kills == 2
        expected = [RewardResult(1.0, True, "") if i % 2 else RewardResult(-1.0, False, "") for i in range(24)]
        expected[5] = expected[17] = RewardResult.failed()
        assert results == expected
        # The replacement workers serve the next batch.
        assert pool.score(items[:4] + items[6:10]) == expected[:4] + expected[6:10]
        assert pool.kills == 2


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to see that the worker is gone")
def test_pool_replaces_a_worker_that_died_while_idle() -> None:
    items = mixed_items(40)
    expected = score_batch(items)
    # One worker: it scored the first batch, so it is the one that later dies (with two, the victim might never have
    # said "ready" and the second batch end before its death is seen).
    with RewardWorkerPool(1, timeout_s=30.0, chunk_size=8) as pool:
        assert pool.score(items) == expected
        victim = pool.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        while Path(f"/proc/{victim}/stat").exists() and Path(f"/proc/{victim}/stat").read_text().split()[2] != "Z":
            time.sleep(0.01)  # wait until it is gone (a zombie has closed its pipe)
        assert pool.score(items) == expected  # no item is blamed for a death between batches
        assert pool.kills == 1 and victim not in pool.worker_pids


@pytest.mark.timeout(300)
def test_a_worker_that_dies_after_taking_a_chunk_but_before_its_first_item_blames_no_item() -> None:
    items = mixed_items(40)
    expected = score_batch(items)
    with RewardWorkerPool(1, timeout_s=30.0, chunk_size=8) as pool:  # one worker: the victim surely takes a chunk
        assert pool.score(items) == expected
        victim = pool.worker_pids[0]
        os.kill(victim, signal.SIGSTOP)  # its pipe stays open: the next batch sends it a chunk it never starts
        killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
        killer.start()
        try:
            assert pool.score(items) == expected  # its chunk went to the replacement; no item failed
        finally:
            killer.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        assert pool.kills == 1 and victim not in pool.worker_pids


def test_score_batch_with_a_custom_function_in_process(custom_spec: str) -> None:
    items = [RewardInput("unregistered-source", "7", "7"), RewardInput("unregistered-source", "7", "8")]
    expected = [RewardResult(1.0, True, ""), RewardResult(-1.0, False, "")]
    assert score_batch(items, custom_fn_spec=custom_spec) == expected


def test_a_raising_scorer_is_reported_with_its_item_in_process(custom_spec: str) -> None:
    items = [RewardInput("s", "1", "1"), RewardInput("s", "RAISE", "1", {"index": 41})]
    with pytest.raises(RewardScoringError, match=r"item 1 \(data_source='s'\) raised ValueError: bad response"):
        score_batch(items, custom_fn_spec=custom_spec)


@pytest.mark.timeout(300)
def test_a_raising_scorer_is_reported_with_its_item_from_the_pool(custom_spec: str) -> None:
    items = [RewardInput("s", "1", "1"), RewardInput("s", "2", "2"), RewardInput("s", "RAISE", "1", {"index": 41})]
    message = r"(?s)item 2 \(data_source='s'\).*ValueError: bad response \{'index': 41\}"
    with pytest.raises(RewardScoringError, match=message):
        score_batch(items, num_workers=1, custom_fn_spec=custom_spec)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_unknown_data_source_fails_before_any_work(num_workers: int) -> None:
    items = [RewardInput("math_dapo", "Answer: 1", "1"), RewardInput("olympiad", "Answer: 1", "1")]
    with pytest.raises(UnknownDataSourceError, match="no reward scorer for data_source 'olympiad'"):
        score_batch(items, num_workers=num_workers)


def test_unpicklable_scorers_are_refused_before_starting_workers() -> None:
    registry = ScorerRegistry()
    registry.register("*", lambda s, t, e: 1.0)
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        RewardWorkerPool(1, registry=registry)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_workers": -1}, "num_workers must be an int >= 0"), ({"num_workers": 1.5}, "num_workers must be an int")],
)
def test_bad_arguments_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        score_batch([RewardInput("math_dapo", "Answer: 1", "1")], **kwargs)


def test_items_must_be_reward_inputs() -> None:
    with pytest.raises(TypeError, match=r"items\[1\] must be a RewardInput, got tuple"):
        score_batch([RewardInput("math_dapo", "Answer: 1", "1"), ("math_dapo", "1", "1")])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, "num_workers must be an int >= 1"),
        ({"num_workers": 1, "timeout_s": 0}, "timeout_s"),
        ({"num_workers": 1, "chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_pool_arguments_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RewardWorkerPool(**kwargs)
