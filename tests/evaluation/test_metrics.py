"""pass@k, maj@K and the summary against hand-computed cases; repeats and --n give the same avg@K."""

from __future__ import annotations

import math

import pytest

from dapo.evaluation.metrics import (
    SampleOutcome,
    majority_vote,
    pass_at_k,
    pass_ks,
    summarize_samples,
)


def test_pass_at_k_hand_computed():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; pass@4 = 1.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_at_k(3, 0, 2) == 0.0
    assert pass_at_k(32, 32, 1) == 1.0


def test_pass_at_k_equals_binomial_formula_everywhere():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("args", [(0, 0, 1), (3, 4, 1), (3, 1, 4), (3, 1, 0), (3, True, 1)])
def test_pass_at_k_rejects_bad_arguments(args):
    with pytest.raises((ValueError, TypeError)):
        pass_at_k(*args)


def test_majority_vote_counts_normalised_predictions():
    # "$12$" and "12" normalise to the same answer: 2 votes for 12 beat 1 for 7.
    assert majority_vote(["7", "$12$", "12"], [False, True, True]) == ("12", True)


def test_majority_vote_tie_goes_to_first_occurrence():
    assert majority_vote(["5", "6", "6", "5"], [True, False, False, True]) == ("5", True)
    assert majority_vote(["6", "5", "5", "6"], [False, True, True, False]) == ("6", False)


def test_majority_vote_ignores_empty_predictions():
    assert majority_vote(["", "", "3"], [False, False, False]) == ("3", False)
    assert majority_vote(["", None], [False, False]) == ("", False)


def _samples(problem, accs, preds=None, source="s", tokens=None, truncated=None):
    preds = preds or [""] * len(accs)
    return [
        SampleOutcome(problem, source, j, a, p, (tokens or [10] * len(accs))[j], (truncated or [False] * len(accs))[j])
        for j, (a, p) in enumerate(zip(accs, preds))
    ]


def test_summary_hand_computed():
    samples = _samples(
        "p1",
        [True, False, False, False],
        ["1", "2", "2", "3"],
        tokens=[4, 8, 12, 16],
        truncated=[False, False, False, True],
    ) + _samples("p2", [True, True, False, True], ["9", "9", "8", "9"], tokens=[2, 2, 2, 2])
    m = summarize_samples(samples)["overall"]
    assert m["problems"] == 2 and m["samples"] == 8 and m["k"] == 4
    assert m["avg@4"] == pytest.approx((0.25 + 0.75) / 2)
    # per-problem accuracies 0.25 and 0.75: s = sqrt(0.125), half-width 1.96 s / sqrt(2) = 0.49
    assert m["avg@4/ci95"] == pytest.approx(1.96 * 0.125**0.5 / 2**0.5)
    assert m["pass@1"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx((0.5 + 1.0) / 2)  # p2: c=3 of 4, any pair has a correct one
    assert m["pass@4"] == pytest.approx(1.0)
    assert m["maj@4"] == pytest.approx(0.5)  # p1 votes "2" (wrong), p2 votes "9" (right)
    assert m["response_length/mean"] == pytest.approx((10 + 2) / 2)
    assert m["truncation_rate"] == pytest.approx((0.25 + 0.0) / 2)


def test_multi_turn_samples_add_tool_metrics_by_hand():
    import dataclasses

    calls = [("ok",), (), ("ok", "error"), ("timeout",)]
    samples = [dataclasses.replace(s, tool_calls=c) for s, c in zip(_samples("p1", [True, False, True, False]), calls)]
    m = summarize_samples(samples)["overall"]
    assert m["tool/samples_with_call"] == pytest.approx(3 / 4) and m["tool/calls_per_sample"] == pytest.approx(1.0)
    assert (m["tool/errors"], m["tool/timeouts"], m["tool/result/ok"]) == (2.0, 1.0, 2.0)
    assert m["tool/acc_with_call"] == pytest.approx(2 / 3) and m["tool/acc_without_call"] == 0.0
    assert not any(k.startswith("tool/") for k in summarize_samples(_samples("p1", [True]))["overall"])


def test_summary_per_data_source_and_overall():
    samples = _samples("a", [True, True], source="x") + _samples("b", [False, False], source="y")
    out = summarize_samples(samples)
    assert list(out) == ["x", "y", "overall"]
    assert out["x"]["avg@2"] == 1.0 and out["y"]["avg@2"] == 0.0 and out["overall"]["avg@2"] == 0.5
    assert out["x"]["avg@2/ci95"] is None  # one problem: no interval (null in the JSON summary)


def test_avg_at_32_is_the_published_row_mean():
    # eval_aime24.py prints the mean of `res` over all 960 rows (30 problems x 32 repeats).
    import random

    rng = random.Random(0)
    samples, rows = [], []
    for p in range(30):
        accs = [rng.random() < p / 30 for _ in range(32)]
        rows += accs
        samples += _samples(f"p{p}", accs)
    m = summarize_samples(samples)["overall"]
    assert m["avg@32"] == pytest.approx(sum(rows) / len(rows))
    assert m["pass@1"] == pytest.approx(m["avg@32"])
    assert [k for k in m if k.startswith("pass@")] == [f"pass@{k}" for k in (1, 2, 4, 8, 16, 32)]


def test_sample_order_does_not_change_the_summary():
    samples = _samples("p1", [True, False, True], ["1", "2", "1"]) + _samples(
        "p2", [False, True, False], ["", "5", "6"]
    )
    assert summarize_samples(samples) == summarize_samples(list(reversed(samples)))


def test_pass_ks():
    assert pass_ks(1) == [1]
    assert pass_ks(8) == [1, 2, 4, 8]
    assert pass_ks(12) == [1, 2, 4, 8, 12]
