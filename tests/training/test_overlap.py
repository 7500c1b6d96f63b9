"""busy_overlap: the measured time two sides were busy at once (async/overlap_s), by hand-computed intervals."""

import pytest

from dapo.training.overlap import busy_overlap, busy_time


def test_disjoint_intervals_do_not_overlap():
    # serial: the trainer works in [0, 2], the producer in [2, 5] (touching) and [6, 7]
    assert busy_overlap([(0.0, 2.0)], [(2.0, 5.0), (6.0, 7.0)]) == 0.0


def test_nested_interval_overlaps_by_its_own_length():
    assert busy_overlap([(1.0, 4.0)], [(0.0, 10.0)]) == pytest.approx(3.0)
    assert busy_overlap([(0.0, 10.0)], [(1.0, 4.0)]) == pytest.approx(3.0)


def test_partial_overlap():
    # [0, 3] and [2, 6] share [2, 3]
    assert busy_overlap([(0.0, 3.0)], [(2.0, 6.0)]) == pytest.approx(1.0)


def test_several_intervals():
    # a: [0,2] [4,7]; b: [1,5] [6,9] -> [1,2] + [4,5] + [6,7] = 3
    assert busy_overlap([(0.0, 2.0), (4.0, 7.0)], [(1.0, 5.0), (6.0, 9.0)]) == pytest.approx(3.0)


def test_overlapping_intervals_of_one_side_count_once():
    # a's two intervals cover [0, 4] once; b = [1, 3] -> 2, not 3 (which a double count of [2, 3] gives)
    assert busy_overlap([(0.0, 3.0), (2.0, 4.0)], [(1.0, 3.0)]) == pytest.approx(2.0)
    assert busy_time([(0.0, 3.0), (2.0, 4.0), (5.0, 6.0)]) == pytest.approx(5.0)


def test_empty_sides():
    assert busy_overlap([], [(0.0, 1.0)]) == 0.0
    assert busy_overlap([(0.0, 1.0)], []) == 0.0
