"""The published DAPO scorer's behaviour, exactly (``reward_model.compat=reference``).

This reproduces, rule for rule, the scorer that the DAPO release and verl use for DAPO-Math-17k and AIME
(verl ``verl/utils/reward_score/math_dapo.py``), so that AIME numbers can be compared with the paper's and verl's.
``dapo.reward.math_dapo`` (``compat=improved``, the default) is the same rule with the fixes listed in
docs/reward.md; every row of that table is a case where this module gives the reference's answer (tested in
tests/reward/test_reward_math_dapo_reference.py).

The published rule:

1. Keep the last 300 characters of the response.
2. Default mode: the prediction is what follows the last ``Answer:`` (case-insensitive, up to the end of its line)
   or the string ``[INVALID]`` when there is none; both sides go through Minerva's normalisation as published
   (substring articles ``an ``/``a ``, no ``\\dfrac``/``\\left``/U+2212 handling, commas removed only when the rest
   ``str.isdigit()``, regex unwrapping of ``$...$``, ``\\text{}``, ``\\textbf{}``, ``\\overline{}``, ``\\boxed{}``);
   the strings are compared, so ``[INVALID]`` equals a ground truth that normalises to ``[INVALID]``, and an empty
   prediction equals an empty ground truth.
3. Strict-box mode: within the last 100 characters of the 300-character tail (or from 100 characters before
   ``pause_tokens_index[-1]`` of that tail, Python slicing, so a small index wraps around), the last
   ``\\boxed{...}`` is taken raw and compared, unnormalised, with the raw ground truth; the prediction is None when
   there is none (so it matches no ground truth, not even a literal ``[INVALID]``; the registry reports it as "").

Kept apart from the published code on purpose, for safety only (no effect on any score): a non-``str`` response or
ground truth raises ``TypeError`` as in ``compute_score`` (the published code crashes on ``.split``), and any other
exception scores -1 instead of crashing the trainer. The quadratic regular expressions are kept (they define the
behaviour); the response side is bounded by the 300-character tail, and ``reward_model.timeout_s`` bounds the rest.
"""

from __future__ import annotations

import re
from typing import Any

from dapo.reward.math_dapo import TAIL_CHARS

__all__ = ["compute_score", "math_dapo_reference_scorer", "normalize_final_answer_reference"]

INVALID = "[INVALID]"

# The published replacement table, in its order (the article rule is a plain substring replacement).
_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# The published list of unit and filler words, deleted wherever they occur (kept here, not shared, so that a change
# to the improved scorer's list can never move the reference).
REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
)
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_STEPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)


def normalize_final_answer_reference(answer: str) -> str:
    """Minerva's normalisation exactly as the published scorer applies it."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    for pattern, replacement in _STEPS:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _last_boxed_raw(text: str) -> str | None:
    """Content of the last ``\\boxed{`` whose braces close (scanning to the end of ``text``), else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


def _strict(tail: str, ground_truth: str, pause_tokens_index: list[int] | None) -> tuple[bool, str | None]:
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 positions, got {pause_tokens_index!r}")
        window = tail[pause_tokens_index[-1] - 100 :]
    else:
        window = tail[-100:]
    boxed = _last_boxed_raw(window)  # None without a box, as published: None never equals a ground truth, so a
    return boxed == ground_truth, boxed  # ground truth of literally "[INVALID]" is not matched by a missing box


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """The published ``compute_score``: ``{"score": +1.0 or -1.0, "acc": bool, "pred": str, or None in strict-box
    mode without a box}``."""
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be str (the decoded response), got {type(solution_str).__name__}")
    if not isinstance(ground_truth, str):
        raise TypeError(f"ground_truth must be str, got {type(ground_truth).__name__}: {ground_truth!r:.80}")
    tail = solution_str[-TAIL_CHARS:]
    try:
        if strict_box_verify:
            correct, pred = _strict(tail, ground_truth, pause_tokens_index)
        else:
            matches = _ANSWER.findall(tail)
            pred = normalize_final_answer_reference(matches[-1] if matches else INVALID)
            correct = pred == normalize_final_answer_reference(ground_truth)
    except ValueError:
        raise
    except Exception:  # a reward must never crash training
        return {"score": -1.0, "acc": False, "pred": ""}
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def math_dapo_reference_scorer(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict[str, Any]:
    """``compute_score`` with the registry's uniform scorer signature (``extra_info`` is unused)."""
    return compute_score(solution_str, ground_truth)
