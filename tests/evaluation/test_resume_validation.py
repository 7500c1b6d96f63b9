"""``dapo eval`` resume reads back only genuine sample lines: types checked, the line named, foreign files untouched.

Before: a line with ``"acc": "False"`` (a truthy string) counted as correct, and a binary samples file was cut at its
last newline byte before the crash.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dapo.evaluation.backends import EvalError, LocalBackend
from dapo.evaluation.problems import load_problems
from dapo.evaluation.runner import EvalSettings, read_samples, run_eval, write_summary
from tests.evaluation.eval_helpers import answering_engine, dapo_row, write_jsonl
from tests.harness.tokenizers import CharTokenizer


@pytest.fixture()
def finished(tmp_path):
    """A complete eval's samples file (5 problems x 4 samples) and what it takes to run it again."""
    rows = [dapo_row(f"Problem {i}: what is {i % 4}?", str(i % 4), index=i) for i in range(5)]
    problems = load_problems([write_jsonl(tmp_path / "t.jsonl", rows)])
    settings = EvalSettings(
        model="fake", test_files=("t.jsonl",), n=4, temperature=1.0, top_p=1.0, max_tokens=64, seed=3, batch_size=2
    )
    out = tmp_path / "o.jsonl"
    run_eval(problems, LocalBackend(answering_engine(), CharTokenizer()), settings, out)
    return problems, settings, out


def _rerun(problems, settings, out):
    return run_eval(problems, LocalBackend(answering_engine(), CharTokenizer()), settings, out)


def _edit_line(out, index, **fields):
    lines = out.read_text().splitlines(keepends=True)
    row = json.loads(lines[index])
    row.update(fields)
    lines[index] = json.dumps(row) + "\n"
    out.write_text("".join(lines))


def _drop_field(out, index, name):
    lines = out.read_text().splitlines(keepends=True)
    row = json.loads(lines[index])
    del row[name]
    lines[index] = json.dumps(row) + "\n"
    out.write_text("".join(lines))


def _first_wrong(out):
    return next(i for i, line in enumerate(out.read_text().splitlines()) if not json.loads(line)["acc"])


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("acc", "False", '"acc": "False", which must be true or false'),
        ("acc", 1, '"acc": 1, which must be true or false'),
        ("sample_index", "0", '"sample_index": "0", which must be an integer'),
        ("sample_index", True, '"sample_index": true, which must be an integer'),
        ("score", None, '"score": null, which must be an integer or a number'),
        ("response_tokens", -3, '"response_tokens": -3, which must be >= 0'),
        ("problem_key", ["k"], '"problem_key": ["k"], which must be a string'),
        ("tool_calls", ["ok", "crashed"], '"tool_calls": ["ok", "crashed"], which must be a list of ok, error'),
        ("tool_calls", "ok", '"tool_calls": "ok", which must be a list of'),
    ],
)
def test_a_resumed_line_of_the_wrong_type_is_refused_with_its_line_number(finished, field, value, says):
    problems, settings, out = finished
    index = _first_wrong(out) if field == "acc" else 6
    _edit_line(out, index, **{field: value})
    before = out.read_bytes()
    with pytest.raises(EvalError, match=f"line {index + 1} ") as info:
        _rerun(problems, settings, out)
    assert says in str(info.value)
    assert out.read_bytes() == before


def test_a_line_without_a_field_is_refused(finished):
    problems, settings, out = finished
    _drop_field(out, 2, "acc")
    with pytest.raises(EvalError, match='line 3 has no "acc"'):
        read_samples(out)


def test_a_binary_file_is_refused_and_left_unmodified(finished):
    problems, settings, out = finished
    out.write_bytes(bytes(range(256)) * 19 + b"\x00\x01\x02\x03")  # 4,868 bytes with newlines inside, no final one
    before = out.read_bytes()
    with pytest.raises(EvalError, match="line 1 is not JSON"):
        _rerun(problems, settings, out)
    assert out.read_bytes() == before


def test_a_file_without_any_newline_is_not_truncated_to_nothing(finished):
    problems, settings, out = finished
    out.write_bytes(b"PK\x03\x04 a zip archive, say" * 100)
    before = out.read_bytes()
    with pytest.raises(EvalError, match="line 1 .*not the start of a sample line"):
        _rerun(problems, settings, out)
    assert out.read_bytes() == before


def test_an_invalid_utf8_line_is_refused_with_its_number(finished):
    problems, settings, out = finished
    lines = out.read_bytes().split(b"\n")
    lines[4] = lines[4].replace(b'"response": "', b'"response": "\xff\xfe', 1)
    out.write_bytes(b"\n".join(lines))
    before = out.read_bytes()
    with pytest.raises(EvalError, match="line 5 is not UTF-8 text"):
        _rerun(problems, settings, out)
    assert out.read_bytes() == before


def test_a_torn_last_line_is_still_cut_off_and_resumed(finished):
    problems, settings, out = finished
    full = out.read_bytes()
    lines = full.split(b"\n")
    torn = b"\n".join(lines[:9]) + b"\n" + lines[9][:40]
    out.write_bytes(torn + "é".encode()[:1])  # killed in the middle of a two-byte character
    _rerun(problems, settings, out)
    assert len(read_samples(out)) == 20


def _as_multi_turn(finished, calls_of_line6):
    """The finished file turned into a multi-turn one (every line records tool calls), its summary rewritten."""
    problems, settings, out = finished
    multi = dataclasses.replace(settings, multi_turn={"max_assistant_turns": 3})
    rows = [dict(json.loads(line), tool_calls=[]) for line in out.read_text().splitlines()]
    rows[6]["tool_calls"] = calls_of_line6
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_summary(out, multi, rows, total=len(rows))
    return problems, multi, out


def test_a_resumed_multi_turn_line_with_more_calls_than_turns_is_refused(finished):
    # Before: the category of each call was checked, not their number: a line edited to 200,000 calls was summed.
    problems, multi, out = _as_multi_turn(finished, ["ok"] * 200_000)
    with pytest.raises(EvalError, match="records 200000 tool calls, more than the 2 this loop can make"):
        _rerun(problems, multi, out)


def test_a_resumed_multi_turn_line_at_the_bound_is_accepted(finished):
    problems, multi, out = _as_multi_turn(finished, ["ok", "error"])  # 3 turns: calls in the first two
    summary = _rerun(problems, multi, out)
    assert summary["status"] == "complete" and summary["metrics"]["overall"]["tool/calls"] == 2


def test_a_single_turn_line_with_tool_calls_is_refused(finished):
    problems, settings, out = finished
    _edit_line(out, 6, tool_calls=["ok"])
    with pytest.raises(EvalError, match="records 1 tool calls, more than the 0"):
        _rerun(problems, settings, out)


def test_a_multi_turn_line_without_tool_calls_is_refused(finished):
    problems, multi, out = _as_multi_turn(finished, [])
    _drop_field(out, 3, "tool_calls")
    with pytest.raises(EvalError, match='has no "tool_calls", which every multi-turn sample records'):
        _rerun(problems, multi, out)
