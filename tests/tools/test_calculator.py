"""The calculator tool: values computed by hand, and every malformed or hostile expression an error string the model
reads (category "error"), never an exception."""

from __future__ import annotations

import pytest

from dapo.tools.calculator import MAX_INTEGER_DIGITS, CalculatorError, CalculatorTool, evaluate_arithmetic
from dapo.tools.call_format import ToolCallFormat

CALC = CalculatorTool(
    ToolCallFormat(start="<calculator>", end="</calculator>", response_template="<result>{output}</result>")
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("7 + 5", 12),
        ("12 * (3 + 4) / 5", 16.8),  # 12 * 7 = 84, 84 / 5 = 16.8
        ("2 ** 10", 1024),
        ("-3 // 2", -2),  # floor division rounds down
        ("17 % 5", 2),
        ("2 ** -1", 0.5),
        ("-(4 - 10) * +3", 18),
        ("123456789 * 987654321", 121932631112635269),
        ("  1.5 + 2.25\n", 3.75),
    ],
)
def test_values_by_hand(expression: str, value: float) -> None:
    assert evaluate_arithmetic(expression) == value
    assert type(evaluate_arithmetic(expression)) is type(value)  # exact integers stay integers


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("", "empty expression"),
        ("1 +", "not an arithmetic expression"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("abc + 1", "not Name"),
        ("__import__('os').system('true')", "not Call"),
        ("(1).real", "not Attribute"),
        ("'7' * 3", "not Constant"),
        ("True + 1", "not Constant"),
        ("[1, 2]", "not List"),
        ("9 ** 9 ** 9", "exponent"),  # refused before it is computed
        ("(10 ** 4000) ** 9999", f"more than {MAX_INTEGER_DIGITS} digits"),
        ("10 ** 4300", f"more than {MAX_INTEGER_DIGITS} digits"),
        ("1e308 * 10", "result too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1" * 1001, "longer than 1000"),
    ],
)
def test_refusals_name_the_reason(expression: str, reason: str) -> None:
    with pytest.raises(CalculatorError, match=reason.replace("(", r"\(").replace("*", r"\*")):
        evaluate_arithmetic(expression)


def test_a_bad_call_is_an_error_string_for_the_model_and_the_others_still_run() -> None:
    results = CALC.run_many(["6 * 7", "6 *", "1 / 0", "import os"])
    assert [r.output for r in results] == [
        "42",
        "error: not an arithmetic expression: '6 *'",
        "error: division by zero",
        "error: not an arithmetic expression: 'import os'",
    ]
    assert [r.category for r in results] == ["ok", "error", "error", "error"]
    assert all(r.exit_code is None for r in results)  # in-process: no process ran


def test_from_config_takes_its_own_call_format() -> None:
    from dapo.config import build_config

    mt = build_config(
        {}, ["rollout.multi_turn.calculator.tool_call_start=CALC(", "rollout.multi_turn.calculator.tool_call_end=)"]
    ).rollout.multi_turn
    tool = CalculatorTool.from_config(mt)
    assert tool.call_format == ToolCallFormat(start="CALC(", end=")", response_template="<result>{output}</result>")
