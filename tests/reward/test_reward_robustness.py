"""Hostile model output never breaks the rule reward: no exception, a well-formed result, bounded time.

Time is bounded by pytest-timeout marks (generous, so never flaky): each pathological input here is
quadratic or worse for a naive implementation and takes milliseconds for ours.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dapo.reward.gsm8k import gsm8k_score
from dapo.reward.math_dapo import compute_score

latexish = st.lists(
    st.sampled_from(
        [
            "Answer:",
            "answer :",
            "####",
            "\n",
            " ",
            "$",
            "{",
            "}",
            "\\boxed{",
            "\\text{",
            "\\frac",
            "\\sqrt",
            "=",
            ",",
            ".",
            "-",
            "0",
            "7",
            "a ",
            "an ",
            "degrees",
            "\\left(",
            "\\right)",
            "\u2212",
            "\u00b2",
        ]
    ),
    max_size=60,
).map("".join)
any_text = st.one_of(st.text(max_size=400), latexish)


def assert_well_formed(result: dict[str, Any]) -> None:
    assert set(result) == {"score", "acc", "pred"}
    assert result["score"] in (1.0, -1.0)
    assert result["acc"] is (result["score"] == 1.0)
    assert isinstance(result["pred"], str)


@settings(max_examples=300, deadline=None)
@given(any_text, any_text, st.booleans())
def test_any_text_gives_a_well_formed_result(response: str, truth: str, strict: bool) -> None:
    assert_well_formed(compute_score(response, truth, strict_box_verify=strict))
    assert_well_formed(gsm8k_score(response, truth))
    assert_well_formed(gsm8k_score(response, truth, flexible=True))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=600), st.integers(min_value=-(10**40), max_value=10**40))
def test_a_final_answer_line_is_found_after_any_text(prefix: str, n: int) -> None:
    assume("nswer" not in prefix.lower())  # another "Answer:" could swallow the line below
    response = prefix + f"\nAnswer: {n}"
    assert compute_score(response, str(n))["acc"]
    assert compute_score(response, f"{n:,}")["acc"]
    assert not compute_score(response, str(n + 1))["acc"]


@settings(max_examples=100, deadline=None)
@given(any_text)
def test_a_response_never_matches_an_empty_ground_truth(response: str) -> None:
    assert not compute_score(response, "")["acc"]


TEN_MB = 10_000_000

PATHOLOGICAL: list[tuple[str, str]] = [
    ("10 MB of digits", "1" * TEN_MB),
    ("10 MB of digits, then an answer", "1" * TEN_MB + "\nAnswer: 5"),
    ("deeply nested braces", "\\boxed{" * 1_000_000 + "5" + "}" * 1_000_000),
    ("unclosed braces", "{" * TEN_MB),
    ("answer markers", "Answer:" * 1_000_000),
    ("answer then spaces", "Answer:" + " " * TEN_MB),
    ("dollars", "$" * TEN_MB),
    ("text openers", "\\text{" * 1_000_000),
    ("alternating", "a " * 5_000_000),
    ("long line of nested fractions", "Answer: " + "\\frac{" * 2_000_000),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("response", [p[1] for p in PATHOLOGICAL], ids=[p[0] for p in PATHOLOGICAL])
def test_pathological_response_returns(response: str) -> None:
    for strict in (False, True):
        assert_well_formed(compute_score(response, "5", strict_box_verify=strict))
    assert_well_formed(compute_score(response, "5", strict_box_verify=True, pause_tokens_index=[0, 0, 0, 0]))
    assert_well_formed(gsm8k_score(response, "5", flexible=True))


def test_answer_after_ten_megabytes_is_found() -> None:
    assert compute_score("1" * TEN_MB + "\nAnswer: 5", "5")["acc"]
    assert compute_score("{" * TEN_MB + "\\boxed{5}", "5", strict_box_verify=True)["acc"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("truth", [p[1][:1_000_000] for p in PATHOLOGICAL], ids=[p[0] for p in PATHOLOGICAL])
def test_pathological_ground_truth_returns(truth: str) -> None:
    # Ground truths come from the data set, not the model, but a broken row must not stall training either.
    assert_well_formed(compute_score("Answer: 5", truth))
