"""Seed statistics: hand-computed means and sample deviations, run summaries from hand-written metric records."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.evaluation.statistics import config_of_run, mean_std, seed_band, steps_to_reach, summarize_run, val_acc_key_of


def test_mean_and_sample_std_by_hand() -> None:
    s = mean_std([0.5, 0.7, 0.9])
    assert s.mean == pytest.approx(0.7) and s.std == pytest.approx(0.2) and s.n == 3  # var = (.04+0+.04)/2
    assert f"{s:.2f}" == "0.70 ± 0.20"
    assert s.ci95 == pytest.approx(1.96 * 0.2 / math.sqrt(3))
    one = mean_std([0.25, None, float("nan")])
    assert (one.mean, one.std, one.n) == (0.25, 0.0, 1) and f"{one:.2f}" == "0.25"
    assert one.ci95 is None  # one value has no interval
    assert mean_std([]).n == 0 and f"{mean_std([])}" == "n/a"


@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=8), st.floats(-1e3, 1e3))
def test_shifting_every_seed_shifts_the_mean_and_keeps_the_spread(xs: list[float], shift: float) -> None:
    a, b = mean_std(xs), mean_std([x + shift for x in xs])
    assert b.mean == pytest.approx(a.mean + shift, abs=1e-6)
    assert b.std == pytest.approx(a.std, abs=1e-6)


def test_runs_are_grouped_by_the_seed_suffix() -> None:
    assert config_of_run("ablation-3-clip-higher-s2") == ("ablation-3-clip-higher", 2)
    assert config_of_run("tiny-synth") == ("tiny-synth", None)


def test_steps_to_reach_is_the_first_step_at_or_above() -> None:
    points = [(0, 0.3), (5, 0.55), (10, 0.6), (15, 0.58)]
    assert steps_to_reach(points, 0.6) == 10
    assert steps_to_reach(points, 0.55) == 5
    assert steps_to_reach(points, 0.7) is None


def _records() -> list[dict]:
    # 6 steps; validation at 0, 3, 6; 2 generation rounds of 4 groups at step 2, otherwise 1 round
    rows = []
    for step in range(7):
        r: dict = {"step": step}
        if step % 3 == 0:
            r["val/acc/mean@8"] = [0.2, 0.5, 0.4][step // 3]
            r["val/acc/mean@1"] = 0.0  # a smaller k is not the run's headline accuracy
        if step > 0:
            r.update(
                {
                    "actor/entropy": float(step),
                    "response_length/mean": 10.0 + step,
                    "response_length/clip_ratio": 0.1,
                    "train/num_gen_batches": 2.0 if step == 2 else 1.0,
                    "train/num_all_correct_groups": 1.0,
                    "train/num_all_wrong_groups": 2.0 if step == 2 else 0.0,
                    "train/generated_tokens_total": 100.0 * step,
                }
            )
        if step in (1, 4):  # a step without an update logs no clip fraction
            r["actor/pg_clipfrac"] = 0.1 * step
        rows.append(r)
    return rows


def test_a_run_summary_by_hand() -> None:
    records = _records()
    assert val_acc_key_of(records) == "val/acc/mean@8"
    s = summarize_run(records, threshold=0.45, groups_per_round=4, window=2)
    assert (s.val_first, s.val_final, s.val_best, s.steps_to_threshold) == (0.2, 0.4, 0.5, 3)
    assert s.entropy_first == pytest.approx(1.5) and s.entropy_last == pytest.approx(5.5)  # steps 1-2, 5-6
    assert s.length_last == pytest.approx(15.5) and s.truncated_last == pytest.approx(0.1)
    # per step: correct 1/4, 1/8, 1/4, 1/4, 1/4, 1/4; wrong 0, 2/8, 0, 0, 0, 0
    assert s.all_correct_share == pytest.approx((5 / 4 + 1 / 8) / 6)
    assert s.all_wrong_share == pytest.approx(0.25 / 6)
    assert s.generated_tokens == 600.0 and s.steps == 6
    assert s.clip_fraction == pytest.approx((0.1 + 0.4) / 2)  # steps 1 and 4 only


def test_a_run_without_validation_has_no_accuracy_and_never_reached_the_threshold() -> None:
    records = [{k: v for k, v in r.items() if not k.startswith("val/")} for r in _records()]
    s = summarize_run(records, threshold=0.1, groups_per_round=4)
    assert (s.val_first, s.val_best, s.steps_to_threshold) == (None, None, None)
    with pytest.raises(ValueError, match="no steps"):
        summarize_run([], threshold=0.1, groups_per_round=4)


def test_seed_band_uses_the_steps_every_seed_logged() -> None:
    band = seed_band([[(0, 0.2), (5, 0.4), (10, 0.6)], [(0, 0.4), (5, 0.6)]])
    assert band.x == [0, 5] and band.n == 2
    assert band.mean == pytest.approx([0.3, 0.5])
    assert band.std == pytest.approx([math.sqrt(0.02)] * 2)
