"""prepare_dataset on small hand-made inputs: extraction, filters, dedup, split, templating."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from data_helpers import write_jsonl_rows, write_parquet_rows
from hypothesis import given
from hypothesis import strategies as st

from dapo.data import DataFileError, apply_dapo_template, load_records, parse_integer_answer, prepare_dataset
from dapo.data.prepare import (
    DROP_BAD_ANSWER,
    DROP_BAD_PROBLEM,
    DROP_BAD_PROMPT,
    DROP_EMPTY_ANSWER,
    DROP_EMPTY_PROBLEM,
    DROP_MISSING_ANSWER,
    DROP_MISSING_PROBLEM,
    DROP_NO_GSM8K_MARKER,
    DROP_NON_INTEGER,
    DROP_NOT_OBJECT,
    extract_gsm8k_answer,
    strip_dapo_template,
)


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", "42"),
        ("-5", "-5"),
        ("+5", "5"),
        ("007", "7"),
        ("-0", "0"),
        ("1,234", "1234"),
        ("-12,345,678", "-12345678"),
        (" 9 ", "9"),
        ("3/4", None),
        ("\\sqrt2", None),
        ("2.5", None),
        ("1,23", None),
        ("12,34,567", None),
        ("", None),
        ("1 234", None),
        ("5x", None),
        ("--5", None),
        ("1e3", None),
    ],
)
def test_parse_integer_answer(text: str, expected: str | None) -> None:
    assert parse_integer_answer(text) == expected


@given(st.integers(-(10**30), 10**30), st.integers(0, 3))
def test_parse_integer_answer_is_canonical_for_every_integer(n: int, zeros: int) -> None:
    sign = "-" if n < 0 else ""
    assert parse_integer_answer(str(n)) == str(n)
    assert parse_integer_answer(f"{n:,}") == str(n)
    assert parse_integer_answer(f"{sign}{'0' * zeros}{abs(n)}") == str(n)


def test_gsm8k_answer_and_template_helpers() -> None:
    assert extract_gsm8k_answer("She has 3 + 4 = <<3+4=7>>7.\n#### 7") == "7"
    assert extract_gsm8k_answer("a #### 1 #### 1,000 ") == "1,000"
    assert extract_gsm8k_answer("no marker") is None
    problem = "Find $x$ if $x + 1 = 2$."
    assert strip_dapo_template(apply_dapo_template(problem)) == problem
    assert strip_dapo_template(problem) == problem


def test_prepare_writes_templated_validated_parquet(tmp_path: Path) -> None:
    src = write_jsonl_rows(tmp_path / "toy.jsonl", _rows(5))
    summary = prepare_dataset(src, tmp_path / "out")
    assert (summary.rows_read, summary.kept, summary.train_size, summary.val_size) == (5, 5, 5, 0)
    assert summary.train_path == tmp_path / "out" / "train.parquet" and summary.val_path is None
    assert not (tmp_path / "out" / "val.parquet").exists()
    records = load_records(summary.train_path)
    assert [r.prompt[0].content for r in records] == [apply_dapo_template(f"What is {i} + 1?") for i in range(5)]
    assert [r.ground_truth for r in records] == ["1", "2", "3", "4", "5"]
    assert {(r.data_source, r.ability, r.style, r.prompt[0].role, len(r.prompt)) for r in records} == {
        ("toy", "math", "rule", "user", 1)
    }
    assert records[3].extra_info == {
        "index": 3,
        "split": "train",
        "raw_problem": "What is 3 + 1?",
        "source_file": "toy.jsonl",
        "source_row": 3,
    }


def test_no_template_and_data_source_override(tmp_path: Path) -> None:
    src = write_parquet_rows(tmp_path / "toy.parquet", _rows(2))
    summary = prepare_dataset(src, tmp_path / "out", apply_template=False, data_source="mine")
    records = load_records(summary.train_path)
    assert [(r.data_source, r.prompt[0].content) for r in records] == [
        ("mine", "What is 0 + 1?"),
        ("mine", "What is 1 + 1?"),
    ]


def test_dedup_keeps_the_first_copy_and_counts(tmp_path: Path) -> None:
    rows = [
        {"problem": "What is 1+1?", "answer": "2"},
        {"problem": "  What is\n1+1?  ", "answer": "2"},  # same problem, other whitespace
        {"problem": "What is 2+2?", "answer": "4"},
        {"problem": "What is 1+1?", "answer": "3"},  # duplicate with a conflicting answer
        {"problem": "What is 2 + 2?", "answer": "4"},  # different text: kept
    ]
    src = write_jsonl_rows(tmp_path / "d.jsonl", rows)
    summary = prepare_dataset(src, tmp_path / "out")
    assert (summary.duplicates, summary.conflicting_duplicates, summary.kept) == (2, 1, 3)
    records = load_records(summary.train_path)
    assert [(r.extra_info["source_row"], r.ground_truth) for r in records] == [(0, "2"), (2, "4"), (4, "4")]
    no_dedup = prepare_dataset(src, tmp_path / "all", dedup=False)
    assert (no_dedup.duplicates, no_dedup.kept) == (0, 5)


def test_dedup_runs_after_filters_so_a_dropped_row_hides_nothing(tmp_path: Path) -> None:
    rows = [{"problem": "P", "answer": "1/2"}, {"problem": "P", "answer": "5"}]
    summary = prepare_dataset(write_jsonl_rows(tmp_path / "d.jsonl", rows), tmp_path / "out")
    assert (summary.dropped, summary.duplicates, summary.kept) == ({DROP_NON_INTEGER: 1}, 0, 1)
    assert load_records(summary.train_path)[0].ground_truth == "5"


def test_integer_filter_normalises_and_drops_with_counts(tmp_path: Path) -> None:
    answers = ["1,234", "-5", "007", 12, 3.0, "3/4", "\\sqrt2", "2.5"]
    rows = [{"problem": f"Q{i}", "answer": a} for i, a in enumerate(answers)]
    src = write_jsonl_rows(tmp_path / "d.jsonl", rows)
    summary = prepare_dataset(src, tmp_path / "out")
    assert summary.dropped == {DROP_NON_INTEGER: 3}
    assert summary.first_dropped == {DROP_NON_INTEGER: "d.jsonl row 5"}
    assert [r.ground_truth for r in load_records(summary.train_path)] == ["1234", "-5", "7", "12", "3"]
    loose = prepare_dataset(src, tmp_path / "loose", integer_only=False)
    assert loose.dropped == {}
    assert [r.ground_truth for r in load_records(loose.train_path)][5:] == ["3/4", "\\sqrt2", "2.5"]


def test_gsm8k_answers_auto_plain_and_forced(tmp_path: Path) -> None:
    rows = [
        {"question": "Q0", "answer": "48/2 = <<48/2=24>>24\n#### 72"},
        {"question": "Q1", "answer": "big\n#### 1,000"},
        {"question": "Q2", "answer": "9"},  # no marker
    ]
    src = write_jsonl_rows(tmp_path / "gsm.jsonl", rows)
    auto = prepare_dataset(src, tmp_path / "auto", problem_key="question")
    assert [r.ground_truth for r in load_records(auto.train_path)] == ["72", "1000", "9"]
    forced = prepare_dataset(src, tmp_path / "forced", problem_key="question", answer_format="gsm8k")
    assert forced.dropped == {DROP_NO_GSM8K_MARKER: 1}
    assert [r.ground_truth for r in load_records(forced.train_path)] == ["72", "1000"]
    plain = prepare_dataset(src, tmp_path / "plain", problem_key="question", answer_format="plain")
    assert plain.dropped == {DROP_NON_INTEGER: 2}


def test_malformed_rows_are_dropped_with_reasons(tmp_path: Path) -> None:
    rows = [
        {"problem": "ok", "answer": "1"},
        {"answer": "1"},
        {"problem": "   ", "answer": "1"},
        {"problem": 5, "answer": "1"},
        {"problem": "no answer"},
        {"problem": "empty answer", "answer": " "},
        {"problem": "bool answer", "answer": True},
        {"problem": "list answer", "answer": [1]},
        {"problem": "empty after marker", "answer": "#### "},
        [1, 2],
    ]
    summary = prepare_dataset(write_jsonl_rows(tmp_path / "d.jsonl", rows), tmp_path / "out")
    assert summary.dropped == {
        DROP_NOT_OBJECT: 1,
        DROP_MISSING_PROBLEM: 1,
        DROP_EMPTY_PROBLEM: 1,
        DROP_BAD_PROBLEM: 1,
        DROP_MISSING_ANSWER: 1,
        DROP_EMPTY_ANSWER: 2,
        DROP_BAD_ANSWER: 2,
    }
    assert summary.kept == 1 and summary.rows_read == 10
    assert summary.rows_read == summary.kept + summary.total_dropped + summary.duplicates
    assert re.search(r"^dropped: missing problem +1 \(first: d\.jsonl row 1\)$", summary.format(), re.MULTILINE)


def test_dapo_schema_inputs_take_problem_from_prompt_and_answer_from_ground_truth(tmp_path: Path) -> None:
    raw_prompt = {
        "data_source": "DAPO-17k",
        "prompt": [{"role": "user", "content": "Raw problem A"}],
        "ability": "math",
        "reward_model": {"ground_truth": "34", "style": "rule"},
    }
    templated = {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": apply_dapo_template("Problem B")}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "540", "style": "rule-lighteval/MATH_v2"},
    }
    broken = {"data_source": "x", "prompt": [], "reward_model": {"ground_truth": "1"}}
    src = write_jsonl_rows(tmp_path / "dapo.jsonl", [raw_prompt, templated, templated, broken])
    summary = prepare_dataset(src, tmp_path / "out")
    assert (summary.kept, summary.duplicates, summary.dropped) == (2, 1, {DROP_BAD_PROMPT: 1})
    records = load_records(summary.train_path)
    assert [(r.data_source, r.prompt[0].content, r.ground_truth) for r in records] == [
        ("DAPO-17k", apply_dapo_template("Raw problem A"), "34"),
        ("math_dapo", apply_dapo_template("Problem B"), "540"),  # not templated twice
    ]


def test_seeded_split_is_deterministic_disjoint_and_complete(tmp_path: Path) -> None:
    src = write_jsonl_rows(tmp_path / "d.jsonl", _rows(40))

    def split(seed: int, name: str) -> tuple[list[int], list[int]]:
        summary = prepare_dataset(src, tmp_path / name, val_size=10, seed=seed)
        assert (summary.train_size, summary.val_size) == (30, 10)
        train = [r.extra_info["index"] for r in load_records(summary.train_path)]
        val = [r.extra_info["index"] for r in load_records(summary.val_path)]
        assert {r.extra_info["split"] for r in load_records(summary.val_path)} == {"val"}
        return train, val

    train, val = split(0, "a")
    assert split(0, "b") == (train, val)
    assert not set(train) & set(val) and sorted(train + val) == list(range(40))
    assert train == sorted(train) and val == sorted(val)  # each split keeps the input order
    assert split(1, "c")[1] != val
    by_fraction = prepare_dataset(src, tmp_path / "f", val_fraction=0.25, seed=0)
    assert by_fraction.val_size == 10
    assert [r.extra_info["index"] for r in load_records(by_fraction.val_path)] == val


def test_several_inputs_are_combined_and_deduplicated_across_files(tmp_path: Path) -> None:
    a = write_jsonl_rows(tmp_path / "a.jsonl", _rows(3))
    b = write_parquet_rows(tmp_path / "b.parquet", _rows(5))
    summary = prepare_dataset([a, b], tmp_path / "out")
    assert (summary.rows_read, summary.duplicates, summary.kept) == (8, 3, 5)
    assert [r.data_source for r in load_records(summary.train_path)] == ["a"] * 3 + ["b"] * 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"val_size": 4}, DataFileError, "leaves no training rows"),
        ({"val_size": 1, "val_fraction": 0.1}, ValueError, "not both"),
        ({"val_fraction": 1.0}, ValueError, "val_fraction"),
        ({"val_size": -1}, ValueError, "val_size"),
        ({"answer_format": "latex"}, ValueError, "answer_format"),
        ({"problem_key": "question"}, DataFileError, r"no problem column 'question'.*\['answer', 'problem'\]"),
        ({"answer_key": "solution"}, DataFileError, "no answer column 'solution'"),
        ({"data_source": " "}, ValueError, "data_source"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path: Path, kwargs: dict[str, Any], error: type, match: str) -> None:
    src = write_jsonl_rows(tmp_path / "d.jsonl", _rows(4))
    with pytest.raises(error, match=match):
        prepare_dataset(src, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_nothing_usable_is_an_error_with_the_summary(tmp_path: Path) -> None:
    src = write_jsonl_rows(tmp_path / "d.jsonl", [{"problem": "P", "answer": "1/2"}])
    with pytest.raises(DataFileError, match=r"no usable rows(.|\n)*non-integer answer"):
        prepare_dataset(src, tmp_path / "out")
    with pytest.raises(DataFileError, match="no such file"):
        prepare_dataset(tmp_path / "missing.jsonl", tmp_path / "out")
