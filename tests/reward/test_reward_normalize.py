"""Minerva normalisation: the linear-time helpers equal the reference's regular expressions on any input,
and numerals are canonical."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.reward.normalize import (
    canonical_numeral,
    first_inline_math_per_line,
    normalize_final_answer,
    unwrap_boxed_greedy,
    unwrap_command_lazy,
)

# The reference scorer's regular expressions, used here only as the specification (oracle).
REF_INLINE_MATH = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")
REF_TEXT = re.compile(r"(\\text\{)(.*?)(\})")
REF_BOXED = re.compile(r"(\\boxed\{)(.*)(\})")

# Strings built from the pieces these rules react to, so hypothesis reaches every branch.
latexish = st.lists(
    st.sampled_from(["a", "1", "{", "}", "$", "\n", " ", "\\text{", "\\boxed{", "\\textbf{"]), max_size=30
).map("".join)


@settings(max_examples=400, deadline=None)
@given(latexish)
def test_helpers_equal_the_reference_regexes(s: str) -> None:
    assert first_inline_math_per_line(s) == REF_INLINE_MATH.sub("$\\3$", s)
    assert unwrap_command_lazy(s, "\\text{") == REF_TEXT.sub("\\2", s)
    assert unwrap_boxed_greedy(s) == REF_BOXED.sub("\\2", s)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_helpers_equal_the_reference_regexes_on_any_text(s: str) -> None:
    assert first_inline_math_per_line(s) == REF_INLINE_MATH.sub("$\\3$", s)
    assert unwrap_command_lazy(s, "\\text{") == REF_TEXT.sub("\\2", s)
    assert unwrap_boxed_greedy(s) == REF_BOXED.sub("\\2", s)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("0", "0"),
        ("-0", "0"),
        ("+0.000", "0"),
        ("007", "7"),
        ("-007", "-7"),
        ("+12", "12"),
        ("1,234,567", "1234567"),
        ("-1,000.50", "-1000.5"),
        ("3.14159", "3.14159"),
        ("2.500", "2.5"),
        (".5", "0.5"),
        ("-.5", "-0.5"),
        ("10.", "10"),
        # not numerals: unchanged
        ("", ""),
        ("-", "-"),
        (".", "."),
        ("1,2", "1,2"),
        ("1,0000", "1,0000"),
        ("1.2.3", "1.2.3"),
        ("1e5", "1e5"),
        ("\u0664\u0662", "\u0664\u0662"),
        ("x", "x"),
    ],
)
def test_canonical_numeral(raw: str, canonical: str) -> None:
    assert canonical_numeral(raw) == canonical


@given(st.integers(min_value=-(10**30), max_value=10**30), st.integers(min_value=0, max_value=5))
def test_integers_normalise_to_their_decimal_value_however_spelled(n: int, zeros: int) -> None:
    sign = "-" if n < 0 else ""
    padded = sign + "0" * zeros + str(abs(n))
    grouped = f"{n:,}"
    assert normalize_final_answer(padded) == normalize_final_answer(grouped) == str(n)


def test_long_ground_truth_normalises_in_linear_time() -> None:
    # Quadratic for the reference regexes (each "\text{" rescans to the end); instant here.
    hostile = "\\text{" * 200_000 + "$" + "a" * 200_000
    assert normalize_final_answer(hostile).startswith("\\text{")
    assert normalize_final_answer("1" * 5_000_000) == "1" * 5_000_000
