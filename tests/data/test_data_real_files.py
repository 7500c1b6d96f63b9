"""The data layer on the real public data sets in ../shared/data (skipped when that folder is absent)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dapo.data import apply_dapo_template, load_records, prepare_dataset, write_parquet

pytestmark = pytest.mark.shared_data


def test_aime_2024_loads_ignoring_its_pandas_index_column_and_round_trips(shared_data: Path, tmp_path: Path) -> None:
    source = shared_data / "aime-2024.parquet"
    assert "__index_level_0__" in pq.read_schema(source).names
    records = load_records(source)
    assert len(records) == 960
    assert len({r.extra_info["index"] for r in records}) == 30
    assert all(r.prompt[0].content == apply_dapo_template(r.extra_info["raw_problem"]) for r in records)
    copy = write_parquet(records, tmp_path / "aime.parquet")
    assert load_records(copy) == records
    ours, theirs = pq.read_schema(copy), pq.read_schema(source)
    for name in ("data_source", "prompt", "ability", "reward_model", "extra_info"):
        assert ours.field(name).type == theirs.field(name).type, name


def test_prepare_dapo_math_17k(shared_data: Path, tmp_path: Path) -> None:
    summary = prepare_dataset(shared_data / "dapo-math-17k.dedup.parquet", tmp_path, val_size=300, seed=0)
    assert summary.rows_read == 17917
    assert summary.dropped == {}  # all answers are integers (README)
    assert 15000 < summary.kept <= 17917 and summary.kept == 17917 - summary.duplicates
    assert (summary.train_size, summary.val_size) == (summary.kept - 300, 300)
    records = load_records(summary.train_path) + load_records(summary.val_path)
    assert all(re.fullmatch(r"-?(0|[1-9]\d*)", r.ground_truth) for r in records)
    assert all(r.prompt[0].content == apply_dapo_template(r.extra_info["raw_problem"]) for r in records)
    assert len({" ".join(r.extra_info["raw_problem"].split()) for r in records}) == len(records)
    assert {r.data_source for r in records} == {"DAPO-17k"}


def test_prepare_gsm8k_train_takes_answers_after_the_marker(shared_data: Path, tmp_path: Path) -> None:
    source = shared_data / "gsm8k-train.jsonl"
    raw = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    summary = prepare_dataset(source, tmp_path, problem_key="question")
    assert summary.rows_read == len(raw) == 7473
    assert summary.kept + summary.total_dropped + summary.duplicates == summary.rows_read
    assert summary.kept > 7400
    for record in load_records(summary.train_path):
        original = raw[record.extra_info["source_row"]]
        marker = original["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert record.ground_truth == str(int(marker))
        assert record.prompt[0].content == apply_dapo_template(original["question"])
