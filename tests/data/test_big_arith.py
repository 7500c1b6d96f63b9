"""The tool task: exact answers, determinism, valid DAPO rows, and the unchanged DAPO reward judging them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.data.big_arith import (
    DATA_SOURCE,
    TOOL_INSTRUCTION,
    BigArithConfig,
    big_arith_records,
    generate_big_arith_problems,
)
from dapo.data.schema import DapoRecord
from dapo.reward.registry import score_one
from dapo.tools.sandbox import PythonSandbox


@given(
    seed=st.integers(0, 2**32),
    kind=st.sampled_from(["product", "sum"]),
    lo=st.integers(1, 8),
    extra=st.integers(0, 4),
    operands=st.integers(2, 6),
)
def test_the_answer_is_the_exact_value_of_the_statement(
    seed: int, kind: str, lo: int, extra: int, operands: int
) -> None:
    config = BigArithConfig(kind=kind, min_digits=lo, max_digits=lo + extra, operands=operands)
    for p in generate_big_arith_problems(5, seed, config):
        symbol = " * " if kind == "product" else " + "
        numbers = [int(n) for n in p.problem.removeprefix("Compute ").removesuffix(".").split(symbol)]
        assert tuple(numbers) == p.operands and len(numbers) == operands
        assert p.answer == (math.prod(numbers) if kind == "product" else sum(numbers))
        assert all(lo <= len(str(n)) <= lo + extra for n in numbers if n != 0)


def test_a_hand_checked_problem_and_determinism() -> None:
    first = generate_big_arith_problems(20, seed=7)
    assert first == generate_big_arith_problems(20, seed=7) != generate_big_arith_problems(20, seed=8)
    a, b = first[0].operands
    assert first[0].problem == f"Compute {a} * {b}." and first[0].answer == a * b
    assert first[0].reference_code == f"print({a} * {b})"


def test_rows_are_valid_dapo_records_with_the_tool_instruction() -> None:
    rows = big_arith_records(generate_big_arith_problems(3, seed=0), split="val")
    records = [DapoRecord.from_row(row, source="<test>", row_index=i) for i, row in enumerate(rows)]
    assert [r.data_source for r in records] == [DATA_SOURCE] * 3
    content = rows[0]["prompt"][0]["content"]
    assert TOOL_INSTRUCTION in content and content.startswith("Solve the following math problem")
    assert content.index(TOOL_INSTRUCTION) < content.index("Remember to put your answer")


def test_the_dapo_reward_accepts_the_tool_computed_answer_and_rejects_a_near_miss() -> None:
    problem = generate_big_arith_problems(1, seed=3)[0]
    tool = PythonSandbox(mode="unsafe-no-isolation").run(problem.reference_code)  # the interpreter gets it exactly
    assert tool.ok and int(tool.output) == problem.answer
    right = f"```python\n{problem.reference_code}\n```\n```output\n{tool.output}```\nAnswer: {tool.output.strip()}"
    wrong = f"Answer: {problem.answer + 1}"
    assert score_one(DATA_SOURCE, right, str(problem.answer)).acc is True
    assert score_one(DATA_SOURCE, wrong, str(problem.answer)).acc is False


def test_bad_knobs_name_the_field() -> None:
    with pytest.raises(ValueError, match="BigArithConfig.kind"):
        BigArithConfig(kind="division")
    with pytest.raises(ValueError, match="BigArithConfig.max_digits"):
        BigArithConfig(min_digits=5, max_digits=4)
    with pytest.raises(ValueError, match="BigArithConfig.operands"):
        BigArithConfig(operands=1)
