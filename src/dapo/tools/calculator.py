"""The calculator tool: an arithmetic expression (``12 * (3 + 4) / 5``) evaluated in-process from its syntax tree.

No ``eval``, no ``exec``, no sandbox: :func:`evaluate_arithmetic` walks the tree of ``ast.parse(..., mode="eval")``
and accepts only numbers, parentheses, the unary signs and ``+ - * / // % **``; a name, a call, an attribute, a
string is refused before anything runs. Bounds keep a hostile expression cheap: the text's length, the exponent of
``**`` and the digits of every intermediate integer (``9 ** 9 ** 9`` is refused, not computed). A malformed or
refused expression, a division by zero or an overflow is an error *string* the model reads (category ``error``),
never an exception: a policy learns from a bad call, a rollout must not die of one.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from dapo.tools.call_format import ToolCallFormat
from dapo.tools.result import ToolResult

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 10_000
MAX_INTEGER_DIGITS = 4300  # Python's own int <-> str limit: a longer result could not be printed back anyway

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is what the model reads."""


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of ``expression`` (ints stay exact; ``/`` gives a float as in Python). Raises
    :class:`CalculatorError` with a short reason for anything that is not bounded arithmetic on numbers."""
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {text[:80]!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        if isinstance(result, complex):  # (-8) ** 0.5
            raise CalculatorError("the result is not a real number")
        if isinstance(result, float) and not math.isfinite(result):  # 1e308 * 10
            raise CalculatorError("result too large")
        if isinstance(result, int) and _digits(result) > MAX_INTEGER_DIGITS:
            raise CalculatorError(f"result has more than {MAX_INTEGER_DIGITS} digits")
        return result
    raise CalculatorError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _digits(value: int) -> int:
    return len(str(abs(value))) if abs(value) < 10**18 else int(abs(value).bit_length() * math.log10(2)) + 1


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power before computing it when its exponent or (for an exact integer power) its digits pass the
    bounds: ``(10 ** 4000) ** 9999`` would take minutes to build and be refused only afterwards."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent:g} is larger than {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * (abs(base).bit_length() - 1) * math.log10(2) > MAX_INTEGER_DIGITS:
            raise CalculatorError(f"result has more than {MAX_INTEGER_DIGITS} digits")


class CalculatorTool:
    name: ClassVar[str] = "calculator"

    def __init__(self, call_format: ToolCallFormat) -> None:
        self.call_format = call_format

    @classmethod
    def from_config(cls, multi_turn: Any) -> "CalculatorTool":
        own = multi_turn.calculator
        return cls(
            ToolCallFormat(
                start=own.tool_call_start, end=own.tool_call_end, response_template=own.tool_response_template
            )
        )

    def run_many(self, codes: Sequence[str], max_workers: int = 1) -> list[ToolResult]:
        """Each expression's value (``12``, ``3.5``) or ``error: <reason>``; ``max_workers`` is unused (each call
        takes microseconds)."""
        return [self.run(code) for code in codes]

    def run(self, code: str) -> ToolResult:
        start = time.perf_counter()
        try:
            output, category = str(evaluate_arithmetic(code)), "ok"
        except CalculatorError as exc:
            output, category = f"error: {exc}", "error"
        return ToolResult(output, category, None, time.perf_counter() - start)
