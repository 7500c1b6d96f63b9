"""Test files through the data layer: DAPO schema, raw problem/answer, GSM8K question/answer, repeats grouped."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo.data.schema import DataError
from dapo.evaluation.problems import load_problems
from dapo.reward.registry import get_scorer, math_dapo_scorer
from tests.evaluation.eval_helpers import dapo_row, write_jsonl

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (the shared data sets)")


def test_repeated_rows_are_one_problem(tmp_path):
    rows = [dapo_row("What is 1+1?", "2", index=7)] * 3 + [dapo_row("What is 2+2?", "4", index=8)] * 3
    problems = load_problems([write_jsonl(tmp_path / "t.jsonl", rows)])
    assert [(p.problem_id, p.repeats, p.ground_truth) for p in problems] == [("7", 3, "2"), ("8", 3, "4")]


def test_raw_problem_answer_file_gets_the_dapo_template(tmp_path):
    path = write_jsonl(tmp_path / "math500.jsonl", [{"problem": "Find x.", "answer": "\\frac{1}{2}"}])
    [p] = load_problems([path])
    assert p.data_source == "math500" and p.ground_truth == "\\frac{1}{2}"
    assert "Find x." in p.prompt_text and "Answer:" in p.prompt_text
    [raw] = load_problems([path], template="raw")
    assert raw.prompt_text == "Find x."


def test_gsm8k_question_answer_file(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k-test.jsonl", [{"question": "Q?", "answer": "so 3 + 4 = 7\n#### 7"}])
    [p] = load_problems([path])
    assert p.data_source == "gsm8k-test" and p.ground_truth == "7"


def test_unusable_file_is_a_data_error(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(DataError):
        load_problems([path])


def test_synth_is_the_training_validation_set():
    problems = load_problems(["synth"])
    assert len(problems) == 128 and problems[0].data_source == "synth_arith"


@needs_shared
def test_official_aime_2024_file_is_30_problems_of_32():
    problems = load_problems([SHARED / "aime-2024.parquet"])
    assert len(problems) == 30 and {p.repeats for p in problems} == {32}
    assert get_scorer(problems[0].data_source) is math_dapo_scorer


@needs_shared
@pytest.mark.parametrize(
    "name, count, source",
    [("aime-2025.jsonl", 30, "aime-2025"), ("math500.jsonl", 500, "math500"), ("gsm8k-test.jsonl", 1319, "gsm8k-test")],
)
def test_shared_jsonl_benchmarks(name, count, source):
    problems = load_problems([SHARED / name])
    assert len(problems) == count and problems[0].data_source == source


def test_synth_names_the_held_out_set_of_the_given_training_config() -> None:
    from dapo.config import build_config
    from dapo.data.task import read_task

    data = build_config(
        {},
        [
            "data.synth.operations=[+]",
            "data.synth.max_value=9",
            "data.synth.max_operands=2",
            "data.synth.word_problems=false",
            "data.synth.num_val=64",
        ],
    ).data
    problems = load_problems(["synth"], synth=data)
    trained_on = read_task(data).val  # the set dapo train validates on, in its order
    assert [p.ground_truth for p in problems] == [r.ground_truth for r in trained_on]
    assert len(problems) == 64 and all(p.repeats == 1 for p in problems)  # distinct sums: one row each
    assert [p.ground_truth for p in load_problems(["synth"])] != [p.ground_truth for p in problems]  # default task
