"""Loaders and writers: file dispatch, clear file errors, exact parquet schema, lossless round trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import good_row, write_jsonl_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo.data import (
    DapoRecord,
    DataFileError,
    DataValidationError,
    Message,
    load_dataset,
    load_records,
    write_jsonl,
    write_parquet,
    write_records,
)

EXPECTED_TYPES = {
    "data_source": pa.string(),
    "prompt": pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())])),
    "ability": pa.string(),
    "reward_model": pa.struct([("ground_truth", pa.string()), ("style", pa.string())]),
}


def _record(i: int, **extra: Any) -> DapoRecord:
    return DapoRecord(
        data_source="unit",
        prompt=(Message("system", "Be brief."), Message("user", f"Problem {i}: 2 + {i}?")),
        ability="math",
        ground_truth=str(2 + i),
        style="rule",
        extra_info={"index": i, "split": "train", **extra},
    )


def test_missing_file_directory_and_unknown_suffix_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"nope\.parquet: no such file"):
        load_records(tmp_path / "nope.parquet")
    with pytest.raises(DataFileError, match="not a file"):
        load_records(tmp_path)
    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DataFileError, match=r"unsupported file type '\.csv'"):
        load_records(csv)


def test_unreadable_content_is_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"this is not parquet")
    with pytest.raises(DataFileError, match=r"fake\.parquet: cannot read as parquet"):
        load_records(fake)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataFileError, match="contains no records"):
        load_records(empty)


def test_non_utf8_bytes_are_reported_by_row_and_line_not_byte_offset(tmp_path: Path) -> None:
    good = json.dumps(good_row(0)) + "\n"
    latin1 = tmp_path / "latin1.jsonl"
    # line 1 good, line 2 blank (not a row), line 3 good, line 4 = row 2 holds a latin-1 e-acute (0xe9)
    latin1.write_bytes((good + "\n" + good).encode() + '{"data_source": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataValidationError) as info:
        load_records(latin1)
    assert [(p.row, p.line) for p in info.value.problems] == [(2, 4)]
    assert "latin1.jsonl, row 2 (line 4), field '<line>': not UTF-8 text: byte 0xe9 at column 21" in str(info.value)

    array = tmp_path / "array.json"  # one JSON array: no row before it parses, so line and column
    array.write_bytes(b'[\n  {"data_source": "ok"},\n  {"data_source": "caf\xe9"}\n]\n')
    with pytest.raises(DataFileError, match=r"array\.json, line 3: not UTF-8 text: byte 0xe9 at column 23"):
        load_records(array)

    parquet = tmp_path / "bad.parquet"  # a writer that does not check UTF-8: the string column holds raw bytes
    sources = pa.array([b"ok", b"caf\xe9", b"fine", b"\xff"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"data_source": sources}), parquet)
    with pytest.raises(DataValidationError) as info:
        load_records(parquet)
    assert [p.row for p in info.value.problems] == [1, 3]
    assert "bad.parquet, row 1, field '<row>': not UTF-8 text: byte 0xe9" in str(info.value)


def test_bad_json_lines_are_reported_with_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(good_row(0)), "", "{not json", json.dumps(good_row(1)), '{"a": 1']
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    assert [(p.row, p.line, p.field) for p in info.value.problems] == [(1, 3, "<line>"), (3, 5, "<line>")]
    assert "invalid JSON" in str(info.value)


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n" + json.dumps(good_row(0)) + "\n\n" + json.dumps({**good_row(1), "prompt": []}) + "\n")
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    (problem,) = info.value.problems
    assert (problem.row, problem.line) == (1, 4)


def test_json_file_may_be_an_array_or_json_lines(tmp_path: Path) -> None:
    array = tmp_path / "array.json"
    array.write_text(json.dumps([good_row(0), good_row(1)], indent=2))
    lines = write_jsonl_rows(tmp_path / "lines.json", [good_row(0), good_row(1)])
    assert load_records(array) == load_records(lines)
    assert [r.to_row() for r in load_records(array)] == [good_row(0), good_row(1)]


def test_load_dataset_concatenates_in_order_and_accepts_one_path(tmp_path: Path) -> None:
    a = write_jsonl_rows(tmp_path / "a.jsonl", [good_row(0), good_row(1)])
    b = write_parquet(load_records(write_jsonl_rows(tmp_path / "b.jsonl", [good_row(2)])), tmp_path / "b.parquet")
    records = load_dataset([str(a), b])
    assert [r.extra_info["index"] for r in records] == [0, 1, 2]
    assert load_dataset(str(a)) == load_records(a)
    with pytest.raises(DataFileError, match="no data files"):
        load_dataset([])


def test_parquet_has_the_exact_dapo_schema_and_reads_back_identically(tmp_path: Path) -> None:
    records = [_record(i) for i in range(4)]
    path = write_parquet(records, tmp_path / "out" / "d.parquet")
    schema = pq.read_schema(path)
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for name, expected in EXPECTED_TYPES.items():
        assert schema.field(name).type == expected, name
    assert schema.field("extra_info").type == pa.struct([("index", pa.int64()), ("split", pa.string())])
    assert load_records(path) == records


def test_parquet_reads_like_a_verl_style_loader_expects(tmp_path: Path) -> None:
    path = write_parquet([_record(i) for i in range(3)], tmp_path / "d.parquet")
    frame = pd.read_parquet(path)
    row = frame.iloc[2]
    assert row["extra_info"].get("index", 0) == 2
    assert row["reward_model"]["ground_truth"] == "4"
    assert [dict(m) for m in row["prompt"]][-1] == {"content": "Problem 2: 2 + 2?", "role": "user"}


def test_extra_info_keys_missing_in_some_records_read_back_as_none(tmp_path: Path) -> None:
    records = [_record(0, solution="2"), _record(1)]
    back = load_records(write_parquet(records, tmp_path / "d.parquet"))
    assert back[0] == records[0]
    assert back[1].extra_info == {**records[1].extra_info, "solution": None}


def test_records_without_extra_info_omit_the_column_and_read_back_empty(tmp_path: Path) -> None:
    records = [DapoRecord("unit", (Message("user", "1+1?"),), "math", "2")]
    path = write_parquet(records, tmp_path / "d.parquet")
    assert "extra_info" not in pq.read_schema(path).names
    assert load_records(path) == records


def test_extra_info_with_clashing_types_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    with pytest.raises(DataFileError, match="extra_info"):
        write_parquet([_record(0, tag=1), _record(1, tag="one")], path)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = write_parquet([_record(0)], tmp_path / "d.parquet")
    before = path.read_bytes()
    with pytest.raises(DataFileError, match="cannot write parquet"):
        write_parquet([_record(1, nested={})], path)  # parquet cannot store an empty struct
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["d.parquet"]


def test_writers_refuse_an_empty_data_set_and_unknown_suffixes(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="no records"):
        write_parquet([], tmp_path / "d.parquet")
    with pytest.raises(DataFileError, match="no records"):
        write_jsonl([], tmp_path / "d.jsonl")
    with pytest.raises(DataFileError, match=r"unsupported output type '\.csv'"):
        write_records([_record(0)], tmp_path / "d.csv")


def test_write_records_dispatches_on_suffix(tmp_path: Path) -> None:
    records = [_record(i) for i in range(2)]
    for name in ("d.parquet", "d.jsonl", "d.json"):
        assert load_records(write_records(records, tmp_path / name)) == records
    first_line = (tmp_path / "d.jsonl").read_text(encoding="utf-8").splitlines()[0]
    assert json.loads(first_line) == records[0].to_row()


_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(str.strip)
_message = st.builds(Message, role=st.sampled_from(["system", "user", "assistant"]), content=_text)
_record_strategy = st.builds(
    DapoRecord,
    data_source=_text,
    prompt=st.lists(_message, min_size=1, max_size=3).map(tuple),
    ability=st.text(max_size=10),
    ground_truth=_text.map(str.strip),
    style=st.text(max_size=10),
    extra_info=st.fixed_dictionaries(
        {"index": st.integers(-(2**62), 2**62), "raw_problem": st.text(max_size=20), "ok": st.booleans()}
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_record_strategy, min_size=1, max_size=5))
def test_round_trip_is_lossless_for_any_valid_records(tmp_path: Path, records: list[DapoRecord]) -> None:
    assert load_records(write_parquet(records, tmp_path / "p.parquet")) == records
    assert load_records(write_jsonl(records, tmp_path / "j.jsonl")) == records


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path: Path) -> None:
    record = DapoRecord("unit", (Message("user", "a\u2028b\x85c\rd"),), "math", "1", extra_info={"note": "\u2029"})
    path = write_jsonl([record], tmp_path / "d.jsonl")
    assert load_records(path) == [record]


def test_json_nested_deeper_than_python_parses_is_a_row_problem(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(good_row(0)) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(
        DataValidationError,
        match=r"deep\.jsonl, row 1 \(line 2\), field '<line>': invalid JSON "
        r"\(nested too deeply\)",
    ):
        load_records(path)
