"""A synthetic task a small model can solve only with a code interpreter: products of multi-digit numbers and sums of
many large numbers.

``Compute 48213 * 90317.`` has one exact integer answer that a 135M-parameter model almost never gets digit for digit
by "mental arithmetic", while one line of Python gets it every time; so accuracy on it measures whether the policy
learned to call the tool (and to copy its result into the ``Answer:`` line), which is what a tool-integrated DAPO run
(ReTool, arXiv 2504.11536) is meant to teach. The prompt is the DAPO template with one paragraph saying how to call
the interpreter (:data:`TOOL_INSTRUCTION`); the answer is scored by the unchanged rule-based DAPO reward (data_source
``synth_big_arith`` matches the ``synth*`` scorer: the last ``Answer:`` line, exact match).

Generation is seeded with its own ``random.Random`` and deterministic, like :mod:`dapo.data.synth`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dapo.data.template import apply_dapo_template

BIG_ARITH_KINDS: tuple[str, ...] = ("product", "sum")
DATA_SOURCE = "synth_big_arith"

TOOL_INSTRUCTION = (
    "You can run Python code: write it in a ```python code block and end the block with ```; the output it prints is "
    "shown to you in an ```output block, and you can continue after it."
)


@dataclass(frozen=True)
class BigArithConfig:
    """Difficulty knobs.

    kind: "product" (``a * b``, the operands' digit counts drawn in [min_digits, max_digits]) or "sum" (``operands``
        numbers of that many digits each, added).
    min_digits/max_digits: digits per operand.
    operands: how many numbers a problem combines (2 for a product of two numbers).
    """

    kind: str = "product"
    min_digits: int = 4
    max_digits: int = 6
    operands: int = 2

    def __post_init__(self) -> None:
        if self.kind not in BIG_ARITH_KINDS:
            raise ValueError(f"BigArithConfig.kind must be one of {BIG_ARITH_KINDS}, got {self.kind!r}")
        if not isinstance(self.min_digits, int) or isinstance(self.min_digits, bool) or self.min_digits < 1:
            raise ValueError(f"BigArithConfig.min_digits must be an int >= 1, got {self.min_digits!r}")
        if (
            not isinstance(self.max_digits, int)
            or isinstance(self.max_digits, bool)
            or not self.min_digits <= self.max_digits <= 30
        ):
            raise ValueError(
                f"BigArithConfig.max_digits must be an int in [min_digits={self.min_digits}, 30], "
                f"got {self.max_digits!r}"
            )
        if not isinstance(self.operands, int) or isinstance(self.operands, bool) or not 2 <= self.operands <= 20:
            raise ValueError(f"BigArithConfig.operands must be an int in [2, 20], got {self.operands!r}")


@dataclass(frozen=True)
class BigArithProblem:
    """One problem: its statement, exact integer answer, and the code that solves it (a reference tool call)."""

    problem: str
    answer: int
    operands: tuple[int, ...]
    reference_code: str


def generate_big_arith_problems(
    num: int, seed: int, config: BigArithConfig = BigArithConfig()
) -> list[BigArithProblem]:
    """``num`` problems drawn deterministically from ``seed`` (own ``random.Random``; the global RNG is untouched)."""
    if not isinstance(num, int) or isinstance(num, bool) or num < 0:
        raise ValueError(f"generate_big_arith_problems: num must be an int >= 0, got {num!r}")
    if not isinstance(config, BigArithConfig):
        raise TypeError(f"generate_big_arith_problems: config must be a BigArithConfig, got {type(config).__name__}")
    rng = random.Random(seed)
    symbol = " * " if config.kind == "product" else " + "
    problems = []
    for _ in range(num):
        operands = tuple(_draw(rng, rng.randint(config.min_digits, config.max_digits)) for _ in range(config.operands))
        answer = math.prod(operands) if config.kind == "product" else sum(operands)
        expression = symbol.join(str(n) for n in operands)
        problems.append(BigArithProblem(f"Compute {expression}.", answer, operands, f"print({expression})"))
    return problems


def _draw(rng: random.Random, digits: int) -> int:
    """A number of exactly ``digits`` digits."""
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def big_arith_prompt(problem: str) -> str:
    """The DAPO template around the problem, with the interpreter instruction before the answer-format reminder."""
    return apply_dapo_template(f"{problem}\n\n{TOOL_INSTRUCTION}")


def big_arith_records(problems: Sequence[BigArithProblem], *, split: str = "train") -> list[dict[str, Any]]:
    """DAPO-schema rows (as :func:`dapo.data.synth.synth_records` writes them) for the tool task."""
    records = []
    for i, p in enumerate(problems):
        if not isinstance(p, BigArithProblem):
            raise TypeError(f"big_arith_records: item {i} is {type(p).__name__}, expected BigArithProblem")
        records.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": big_arith_prompt(p.problem)}],
                "ability": "math",
                "reward_model": {"ground_truth": str(p.answer), "style": "rule"},
                "extra_info": {
                    "index": i,
                    "split": split,
                    "raw_problem": p.problem,
                    "solution": f"```python\n{p.reference_code}\n```\nAnswer: {p.answer}",
                },
            }
        )
    return records
