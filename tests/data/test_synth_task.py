"""The built-in synthetic task as the config sets it: the operations knob, and a held-out set without repeats."""

from __future__ import annotations

import pytest

from dapo.config import ConfigError, build_config
from dapo.data.schema import DataError
from dapo.data.task import read_task

SUMS = [
    "data.synth.operations=[+]",
    "data.synth.max_value=9",
    "data.synth.max_operands=2",
    "data.synth.word_problems=false",
]


def test_single_digit_sums_hold_out_distinct_problems_never_trained_on() -> None:
    records = read_task(build_config({}, [*SUMS, "data.synth.num_val=64"]).data)
    val = [r.extra_info["raw_problem"] for r in records.val]
    train = {r.extra_info["raw_problem"] for r in records.train}
    assert len(val) == len(set(val)) == 64
    assert not train & set(val) and len(train) == 81 - 64  # the 17 other sums a + b with 1 <= a, b <= 9
    assert all(p.startswith("Compute ") and "-" not in p and "*" not in p for p in train | set(val))
    assert all(
        int(r.ground_truth) == sum(map(int, r.extra_info["raw_problem"][8:-1].split(" + "))) for r in records.val
    )


def test_more_held_out_problems_than_exist_is_a_data_error_naming_the_key() -> None:
    with pytest.raises(DataError, match=r"data\.synth\.num_val=82: only 81 distinct problems exist"):
        read_task(build_config({}, [*SUMS, "data.synth.num_val=82"]).data)


def test_an_unknown_operation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"data\.synth\.operations\.0"):
        build_config({}, ["data.synth.operations=[/]"])
