"""Validation: every bad record is reported with its file, row and field, all at once."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
from data_helpers import good_row, write_jsonl_rows, write_parquet_rows

from dapo.data import DapoRecord, DataValidationError, Message, load_dataset, load_records
from dapo.data.schema import MAX_PROBLEMS_SHOWN, DataProblem


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A good row with the value at `path` replaced (or deleted when value is DELETE)."""
    row = copy.deepcopy(good_row(1))
    target: Any = row
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return row


DELETE = object()

# (case id, bad row, field named in the error, words of the message, representable in parquet)
BAD_RECORDS = [
    (
        "missing ground truth",
        _with(("reward_model", "ground_truth"), DELETE),
        "reward_model.ground_truth",
        "missing",
        True,
    ),
    ("null ground truth", _with(("reward_model", "ground_truth"), None), "reward_model.ground_truth", "missing", True),
    ("empty ground truth", _with(("reward_model", "ground_truth"), ""), "reward_model.ground_truth", "empty", True),
    ("blank ground truth", _with(("reward_model", "ground_truth"), "  "), "reward_model.ground_truth", "empty", True),
    ("no reward_model", _with(("reward_model",), DELETE), "reward_model.ground_truth", "missing", True),
    ("bool ground truth", _with(("reward_model", "ground_truth"), True), "reward_model.ground_truth", "bool", False),
    ("list ground truth", _with(("reward_model", "ground_truth"), [1]), "reward_model.ground_truth", "list", False),
    ("reward_model not object", _with(("reward_model",), "34"), "reward_model", "expected an object", False),
    ("missing prompt", _with(("prompt",), DELETE), "prompt", "missing", True),
    ("empty prompt", _with(("prompt",), []), "prompt", "empty message list", True),
    ("prompt is text", _with(("prompt",), "What is 2+2?"), "prompt", "expected a list of messages", False),
    ("message is text", _with(("prompt",), ["What is 2+2?"]), "prompt[0]", "expected a message", False),
    ("message without role", _with(("prompt", 0, "role"), DELETE), "prompt[0].role", "missing", True),
    ("message without content", _with(("prompt", 0, "content"), DELETE), "prompt[0].content", "missing", True),
    ("unknown role", _with(("prompt", 0, "role"), "robot"), "prompt[0].role", "unknown role 'robot'", True),
    ("empty text", _with(("prompt", 0, "content"), ""), "prompt[0].content", "empty text", True),
    ("blank text", _with(("prompt", 0, "content"), " \n\t"), "prompt[0].content", "empty text", True),
    ("content not text", _with(("prompt", 0, "content"), 7), "prompt[0].content", "expected a string, got int", False),
    ("missing data_source", _with(("data_source",), DELETE), "data_source", "missing", True),
    ("empty data_source", _with(("data_source",), ""), "data_source", "empty", True),
    ("data_source not text", _with(("data_source",), 3), "data_source", "expected a string, got int", False),
    ("ability not text", _with(("ability",), 3), "ability", "expected a string, got int", False),
    ("style not text", _with(("reward_model", "style"), 3), "reward_model.style", "expected a string", False),
    ("extra_info not object", _with(("extra_info",), [1, 2]), "extra_info", "expected an object, got list", False),
]


def _write(fmt: str, tmp_path: Path, rows: list[Any]) -> Path:
    if fmt == "jsonl":
        return write_jsonl_rows(tmp_path / "bad.jsonl", rows)
    return write_parquet_rows(tmp_path / "bad.parquet", rows)


# Each case in JSON lines; in parquet too where one column can hold the good and the bad value.
CASES = [pytest.param("jsonl", *c, id=f"jsonl-{c[0]}") for c in BAD_RECORDS] + [
    pytest.param("parquet", *c, id=f"parquet-{c[0]}") for c in BAD_RECORDS if c[4]
]


@pytest.mark.parametrize(("fmt", "case", "bad", "field", "words", "in_parquet"), CASES)
def test_every_bad_record_is_named_by_file_row_and_field(
    tmp_path: Path, fmt: str, case: str, bad: dict[str, Any], field: str, words: str, in_parquet: bool
) -> None:
    path = _write(fmt, tmp_path, [good_row(0), bad, good_row(2)])
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    problems = info.value.problems
    assert [(p.source, p.row, p.field) for p in problems] == [(str(path), 1, field)]
    message = str(info.value)
    assert str(path) in message and "row 1" in message and f"'{field}'" in message and words in message
    if fmt == "jsonl":
        assert problems[0].line == 2 and "(line 2)" in message


def test_a_parquet_column_of_the_wrong_type_is_reported_for_every_row(tmp_path: Path) -> None:
    rows = [dict(good_row(i), data_source=i) for i in range(3)]
    path = write_parquet_rows(tmp_path / "d.parquet", rows)
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    assert [(p.row, p.field, p.message) for p in info.value.problems] == [
        (i, "data_source", "expected a string, got int") for i in range(3)
    ]


def test_an_integer_ground_truth_column_in_parquet_is_stringified(tmp_path: Path) -> None:
    rows = [_with(("reward_model", "ground_truth"), 10 * i) for i in range(3)]
    records = load_records(write_parquet_rows(tmp_path / "d.parquet", rows))
    assert [r.ground_truth for r in records] == ["0", "10", "20"]


def test_a_row_that_is_not_an_object_is_reported(tmp_path: Path) -> None:
    path = write_jsonl_rows(tmp_path / "d.jsonl", [good_row(0), [1, 2]])
    with pytest.raises(DataValidationError, match=r"row 1 \(line 2\), field '<row>': expected an object"):
        load_records(path)


def test_all_problems_of_one_row_are_reported_together(tmp_path: Path) -> None:
    row = {"data_source": "", "prompt": [{"role": "bot", "content": ""}], "reward_model": {"style": "rule"}}
    path = write_jsonl_rows(tmp_path / "d.jsonl", [row])
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    assert [p.field for p in info.value.problems] == [
        "data_source",
        "prompt[0].role",
        "prompt[0].content",
        "reward_model.ground_truth",
    ]


def test_problems_of_all_rows_are_collected_and_the_message_is_capped(tmp_path: Path) -> None:
    n_bad = MAX_PROBLEMS_SHOWN + 5
    rows = [good_row(0)] + [_with(("reward_model", "ground_truth"), "") for _ in range(n_bad)]
    path = write_parquet_rows(tmp_path / "d.parquet", rows)
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    assert [p.row for p in info.value.problems] == list(range(1, n_bad + 1))
    message = str(info.value)
    assert message.startswith(f"{n_bad} problems in {path}:")
    assert message.count("  - ") == MAX_PROBLEMS_SHOWN
    assert message.endswith("... and 5 more problems")


def test_load_dataset_reports_the_problems_of_every_file_at_once(tmp_path: Path) -> None:
    a = write_jsonl_rows(tmp_path / "a.jsonl", [good_row(0), _with(("prompt",), [])])
    b = write_parquet_rows(tmp_path / "b.parquet", [_with(("prompt", 0, "role"), "robot"), good_row(1)])
    c = write_jsonl_rows(tmp_path / "c.jsonl", [good_row(3)])
    with pytest.raises(DataValidationError) as info:
        load_dataset([a, b, c])
    assert [(p.source, p.row, p.field) for p in info.value.problems] == [
        (str(a), 1, "prompt"),
        (str(b), 0, "prompt[0].role"),
    ]
    assert str(a) in str(info.value) and str(b) in str(info.value)


def test_a_file_without_the_schema_gets_one_hint_not_one_error_per_row(tmp_path: Path) -> None:
    path = write_jsonl_rows(tmp_path / "raw.jsonl", [{"question": "1+1?", "answer": "2"}] * 50)
    with pytest.raises(DataValidationError) as info:
        load_records(path)
    assert len(info.value.problems) == 1
    assert "not in the DAPO schema" in str(info.value) and "dapo data prepare" in str(info.value)
    assert "['answer', 'question']" in str(info.value)


@pytest.mark.parametrize(
    ("ground_truth", "expected"),
    [(42, "42"), (-7, "-7"), (3.0, "3"), (2.5, "2.5"), (1e20, "100000000000000000000"), (" 12 ", "12")],
)
def test_numeric_ground_truths_in_jsonl_are_stringified(tmp_path: Path, ground_truth: Any, expected: str) -> None:
    path = write_jsonl_rows(tmp_path / "d.jsonl", [_with(("reward_model", "ground_truth"), ground_truth)])
    assert load_records(path)[0].ground_truth == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_ground_truths_are_rejected(tmp_path: Path, value: float) -> None:
    path = write_jsonl_rows(tmp_path / "d.jsonl", [_with(("reward_model", "ground_truth"), value)])
    with pytest.raises(DataValidationError, match="finite"):
        load_records(path)


def test_optional_fields_take_their_documented_defaults(tmp_path: Path) -> None:
    row = {
        "data_source": "unit",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?", "name": "x"}],
        "reward_model": {"ground_truth": "2"},
    }
    (record,) = load_records(write_jsonl_rows(tmp_path / "d.jsonl", [row]))
    assert record == DapoRecord(
        data_source="unit",
        prompt=(Message("system", "Be brief."), Message("user", "1+1?")),
        ability="math",
        ground_truth="2",
        style="rule",
        extra_info={},
    )
    assert record.messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]


def test_unknown_extra_columns_are_ignored(tmp_path: Path) -> None:
    rows = [dict(good_row(i), __index_level_0__=7 * i, comment="x") for i in range(3)]
    records = load_records(write_parquet_rows(tmp_path / "d.parquet", rows))
    assert [r.to_row() for r in records] == [good_row(i) for i in range(3)]


def test_from_row_and_to_row_are_inverse_and_from_row_raises_with_location() -> None:
    row = good_row(5)
    assert DapoRecord.from_row(row, source="mem", row_index=0).to_row() == row
    with pytest.raises(DataValidationError, match=r"mem, row 9, field 'prompt': empty message list"):
        DapoRecord.from_row(_with(("prompt",), []), source="mem", row_index=9)


def test_problem_text_names_its_location() -> None:
    located = DataProblem("f.jsonl", 3, "prompt", "missing", line=5)
    assert str(located) == "f.jsonl, row 3 (line 5), field 'prompt': missing"
    assert str(DataProblem("f.parquet", None, "prompt", "no column")) == "f.parquet, field 'prompt': no column"
