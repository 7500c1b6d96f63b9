"""The DAPO rule reward on hand-written (response, ground truth) pairs: every normalisation rule and every
documented difference from the reference scorer (marked "differs")."""

from __future__ import annotations

import pytest

from dapo.reward.math_dapo import TAIL_CHARS, compute_score

COT = "Let me work through this carefully. First, we expand the product and collect terms.\n"

# (id, response, ground truth, expected acc, expected pred)
CASES: list[tuple[str, str, str, bool, str]] = [
    # --- extraction
    ("plain", COT + "Answer: 42", "42", True, "42"),
    ("case-insensitive", COT + "ANSWER: 42", "42", True, "42"),
    ("spaces-around-colon", COT + "Answer :   42", "42", True, "42"),
    ("answer-on-next-line", COT + "Answer:\n42", "42", True, "42"),
    ("last-answer-wins", "Answer: 41\nWait, I made an error.\nAnswer: 42", "42", True, "42"),
    ("last-answer-wins-2", "Answer: 41\nWait, I made an error.\nAnswer: 42", "41", False, "42"),
    ("line-only", COT + "Answer: 42\nI hope this is right.", "42", True, "42"),
    ("outside-tail", "Answer: 42\n" + "x" * TAIL_CHARS, "42", False, ""),
    ("inside-tail", "y" * 5000 + "\nAnswer: 42\n" + "x" * (TAIL_CHARS - 20), "42", True, "42"),
    ("no-answer", COT + "The result is 42.", "42", False, ""),
    ("wrong", COT + "Answer: 41", "42", False, "41"),
    ("prefix-is-not-equal", COT + "Answer: 42", "420", False, "42"),
    # --- Minerva normalisation (as in the reference)
    ("after-equals", COT + "Answer: x = 42", "42", True, "42"),
    ("inline-math", COT + "Answer: $42$", "42", True, "42"),
    ("boxed", COT + "Answer: \\boxed{42}", "42", True, "42"),
    ("boxed-in-math", COT + "Answer: $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", True, "\\frac{1}{2}"),
    (
        "minerva-sentence",
        COT + "Final Answer: The final answer is $\\boxed{73}$. I hope it is correct.",
        "73",
        True,
        "73",
    ),
    ("text-unit", COT + "Answer: 12\\text{ cm}", "12", True, "12"),
    ("mbox-unit", COT + "Answer: 12\\mbox{ cm}", "12", True, "12"),
    ("textbf", COT + "Answer: \\textbf{7}", "7", True, "7"),
    ("degrees-word", COT + "Answer: 30 degrees", "30", True, "30"),
    ("degrees-circ", COT + "Answer: 30^\\circ", "30", True, "30"),
    ("degrees-circ-braced", COT + "Answer: $30^{\\circ}$", "30", True, "30"),
    ("dollars", COT + "Answer: \\$12", "12", True, "12"),
    ("dollars-word", COT + "Answer: 12 dollars", "12", True, "12"),
    ("inches", COT + "Answer: 5 inches", "5", True, "5"),
    ("frac-shorthand", COT + "Answer: \\frac12", "\\frac{1}{2}", True, "\\frac{1}{2}"),
    ("sqrt-shorthand", COT + "Answer: 3\\sqrt2", "3\\sqrt{2}", True, "3\\sqrt{2}"),
    ("thousands-comma", COT + "Answer: 1,000", "1000", True, "1000"),
    ("thousands-braced-comma", COT + "Answer: 1{,}000", "1000", True, "1000"),
    ("thousands-thin-space", COT + "Answer: 1,\\!000", "1000", True, "1000"),
    ("text-and", COT + "Answer: 3 \\text{ and } 5", "3, 5", True, "3,5"),
    ("article-an", COT + "Answer: \\text{an even number}", "\\text{even number}", True, "evennumber"),
    ("ldots", COT + "Answer: 1, 2, 3, \\ldots", "1,2,3,", True, "1,2,3,"),
    ("dot-before-dollar", COT + "Answer: $42.$", "42", True, "42"),
    ("percent-kept", COT + "Answer: 10\\%", "10", False, "10\\%"),
    ("multiple-choice", COT + "Answer: \\text{(B)}", "(B)", True, "(B)"),
    ("real-aime-2024", COT + "so the maximum is $540$.\n\nAnswer: 540", "540", True, "540"),
    ("real-aime-fraction-sum", COT + "Thus $m+n=104$.\nAnswer: $m + n = 104$", "104", True, "104"),
    ("huge-integer", COT + "Answer: " + "9" * 250, "9" * 250, True, "9" * 250),
    # --- differs: numbers compare by value
    ("differs-leading-zero-pred", COT + "Answer: 025", "25", True, "25"),
    ("differs-leading-zero-gt", COT + "Answer: 25", "025", True, "25"),
    ("differs-negative-zero", COT + "Answer: -0", "0", True, "0"),
    ("differs-plus-sign", COT + "Answer: +7", "7", True, "7"),
    ("differs-trailing-decimal-zeros", COT + "Answer: 5.0", "5", True, "5"),
    ("differs-leading-dot", COT + "Answer: .5", "0.50", True, "0.5"),
    ("differs-negative-thousands", COT + "Answer: -1,000", "-1000", True, "-1000"),
    ("differs-huge-leading-zeros", COT + "Answer: 000" + "9" * 250, "9" * 250, True, "9" * 250),
    ("differs-bad-grouping-is-not-a-number", COT + "Answer: 1,2", "12", False, "1,2"),
    ("differs-bad-grouping-2", COT + "Answer: 12,34", "1234", False, "12,34"),
    ("superscript-is-not-a-digit", COT + "Answer: 2\u00b2", "22", False, "2\u00b2"),
    # --- differs: other normalisation fixes
    ("differs-trailing-period", COT + "Answer: 42.", "42", True, "42"),
    ("differs-boxed-then-period", COT + "Answer: \\boxed{42}.", "42", True, "42"),
    ("differs-dfrac", COT + "Answer: \\dfrac{1}{2}", "\\frac{1}{2}", True, "\\frac{1}{2}"),
    ("differs-tfrac", COT + "Answer: \\tfrac{3}{4}", "\\frac34", True, "\\frac{3}{4}"),
    (
        "differs-left-right",
        COT + "Answer: \\left( 3, \\frac{\\pi}{2} \\right)",
        "(3,\\frac{\\pi}{2})",
        True,
        "(3,\\frac{\\pi}{2})",
    ),
    ("differs-unicode-minus", COT + "Answer: \u22125", "-5", True, "-5"),
    ("differs-article-whole-word", COT + "Answer: \\text{Tina }", "\\text{Tin}", False, "Tina"),
    # --- differs: missing and empty answers are never correct
    ("differs-no-answer-vs-invalid", COT + "no final line", "[INVALID]", False, ""),
    ("differs-empty-pred", COT + "Answer: $ $", "", False, ""),
]


@pytest.mark.parametrize(("response", "ground_truth", "acc", "pred"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hand_written_pairs(response: str, ground_truth: str, acc: bool, pred: str) -> None:
    assert compute_score(response, ground_truth) == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def test_enough_hand_written_cases() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


# ------------------------------------------------------------------------------------ strict-box mode
@pytest.mark.parametrize(
    ("response", "ground_truth", "acc", "pred"),
    [
        (COT + "so the answer is \\boxed{42}", "42", True, "42"),
        (COT + "\\boxed{41} no wait, \\boxed{42}", "42", True, "42"),
        (COT + "\\boxed{\\frac{1}{2}}", "\\frac12", True, "\\frac{1}{2}"),  # nested braces kept whole
        (COT + "\\boxed{ 025 }", "25", True, "25"),  # differs: normalised like the default mode
        (COT + "\\boxed{\\dfrac12}", "\\frac{1}{2}", True, "\\frac{1}{2}"),  # differs, idem
        (COT + "Answer: 42", "42", False, ""),  # an Answer: line does not count here
        (COT + "\\boxed{42", "42", False, ""),  # unclosed
        ("\\boxed{42}" + " filler" * 20, "42", False, ""),  # box more than 100 characters before the end
    ],
)
def test_strict_box(response: str, ground_truth: str, acc: bool, pred: str) -> None:
    assert compute_score(response, ground_truth, strict_box_verify=True) == {
        "score": 1.0 if acc else -1.0,
        "acc": acc,
        "pred": pred,
    }


def test_strict_box_pause_tokens_index_the_full_response() -> None:
    # differs: the reference sliced the 300-character tail with this index and found nothing.
    head = "x" * 1000 + "\\boxed{42}"
    response = head + "<pause>" + "y" * 500
    pause = len(head)
    assert compute_score(response, "42", strict_box_verify=True, pause_tokens_index=[0, 1, 2, pause])["acc"]
    # A box more than 100 characters before the last pause token does not count.
    assert not compute_score(response, "42", strict_box_verify=True, pause_tokens_index=[0, 1, 2, pause + 200])["acc"]
    # differs: a small index no longer wraps around to the end of the string.
    assert compute_score("\\boxed{7}" + "z" * 400, "7", strict_box_verify=True, pause_tokens_index=[0, 0, 0, 5])["acc"]


@pytest.mark.parametrize("bad", [[1, 2, 3], [1, 2, 3, -4], "1234", [1.0, 2, 3, 4], [True, 1, 2, 3]])
def test_malformed_pause_tokens_index_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match="pause_tokens_index must be a list of 4 non-negative ints"):
        compute_score("\\boxed{1}", "1", strict_box_verify=True, pause_tokens_index=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- types
def test_integer_ground_truth_is_accepted() -> None:
    assert compute_score("Answer: 540", 540)["acc"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("solution", "truth", "what"),
    [
        (None, "1", "solution_str"),
        (b"Answer: 1", "1", "solution_str"),
        ("Answer: 1", None, "ground_truth"),
        ("Answer: 1", 1.0, "ground_truth"),
    ],
)
def test_wrong_types_are_caller_errors(solution: object, truth: object, what: str) -> None:
    with pytest.raises(TypeError, match=what):
        compute_score(solution, truth)  # type: ignore[arg-type]
