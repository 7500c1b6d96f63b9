"""The DAPO rule-based math reward: +1 if the final answer matches the ground truth, else -1.

Same signature and semantics as the DAPO reference scorer (verl ``verl/utils/reward_score/math_dapo.py``,
used for DAPO-Math-17k and AIME, Sec. 2.3 of arXiv 2503.14476, "rule-based reward"):

* Only the last ``TAIL_CHARS`` (300) characters of the response are read; the longest MATH-500 answer
  has 159 characters, and the DAPO prompt asks for the answer on the last line.
* The prediction is what follows the last ``Answer:`` (case-insensitive) in that tail, up to the end of
  its line. Both sides are normalised with Minerva's rules (``dapo.reward.normalize``) and compared as
  strings: score ``+1.0`` if equal, else ``-1.0``.
* ``strict_box_verify=True``: only the last ``\\boxed{...}`` within the last 100 characters counts (or,
  with ``pause_tokens_index``, within 100 characters before the last pause token and after).

Differences from the reference, each deliberate (tests in tests/reward/test_reward_math_dapo.py, list in
docs/reward.md):

* The normalisation improvements listed in ``dapo.reward.normalize`` (numbers by value, trailing full
  stop, ``\\dfrac``, ``\\left``/``\\right``, well-formed thousands commas only, ...).
* A response without an ``Answer:`` line gives ``pred=""`` (the reference gives ``"[INVALID]"`` and
  scores it +1 against a ground truth that normalises to ``"[INVALID]"``); an empty normalised
  prediction is never correct, even against an empty ground truth.
* Strict-box mode normalises both sides like the default mode (the reference compared raw strings, so
  ``\\boxed{ 25 }`` or ``\\boxed{\\dfrac12}`` failed), and ``pause_tokens_index`` indexes the full
  response (the reference applied it to the 300-character tail, so any index past 400 found nothing and
  an index below 100 wrapped around to the end).
* Hostile output never raises and is bounded in time: the tail is fixed-size and every normalisation
  step is linear. Caller mistakes still raise: a non-``str`` response or ground truth is a
  ``TypeError`` (an ``int`` ground truth is accepted), a malformed ``pause_tokens_index`` a
  ``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dapo.reward.normalize import normalize_final_answer

TAIL_CHARS = 300
"""Only this many trailing characters of a response are read (as in the reference)."""

STRICT_BOX_WINDOW = 100
"""Strict-box mode reads the last \\boxed{} within this many characters (as in the reference)."""

MAX_BOXED_CHARS = 2_000
"""A \\boxed{ whose closing brace is further than this is treated as unclosed (bounds the scan)."""

ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
"""The DAPO prompt's answer line: "Answer: $Answer"."""

_BOXED = "\\boxed{"
_BRACE = re.compile(r"[{}]")


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """Score one response: ``{"score": +1.0 or -1.0, "acc": bool, "pred": normalised prediction}``."""
    solution_str, ground_truth = _check_types(solution_str, ground_truth)
    start = _strict_window_start(solution_str, pause_tokens_index) if strict_box_verify else 0
    try:
        if strict_box_verify:
            content = last_boxed_content(solution_str, start)
            raw_pred = content if content is not None else ""
        else:
            raw_pred = last_answer_line(solution_str[-TAIL_CHARS:]) or ""
        pred = normalize_final_answer(raw_pred) if raw_pred else ""
        correct = bool(pred) and pred == normalize_final_answer(ground_truth)
    except Exception:  # a safety net: no known input gets here, but a reward must never crash training
        return {"score": -1.0, "acc": False, "pred": ""}
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def math_dapo_scorer(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict[str, Any]:
    """``compute_score`` with the registry's uniform scorer signature (``extra_info`` is unused)."""
    return compute_score(solution_str, ground_truth)


def last_answer_line(text: str, pattern: re.Pattern[str] = ANSWER_PATTERN) -> str | None:
    """What follows the last match of ``pattern`` (group 1), or None when there is none."""
    last = None
    for last in pattern.finditer(text):
        pass
    return last.group(1) if last is not None else None


def last_boxed_content(text: str, start: int = 0) -> str | None:
    """Content of the last ``\\boxed{...}`` beginning at or after ``start``, braces balanced; else None.

    Gives up (None) when the matching ``}`` is more than ``MAX_BOXED_CHARS`` away, so the scan is
    bounded on any input.
    """
    i = text.rfind(_BOXED, start)
    if i < 0:
        return None
    open_at = i + len(_BOXED) - 1
    depth = 0
    for m in _BRACE.finditer(text, open_at, open_at + MAX_BOXED_CHARS + 1):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[open_at + 1 : m.start()]
    return None


def _strict_window_start(solution_str: str, pause_tokens_index: Sequence[int] | None) -> int:
    if pause_tokens_index is None:
        return max(0, len(solution_str) - STRICT_BOX_WINDOW)
    if (
        isinstance(pause_tokens_index, (str, bytes))
        or not isinstance(pause_tokens_index, Sequence)
        or len(pause_tokens_index) != 4
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pause_tokens_index)
    ):
        raise ValueError(
            f"pause_tokens_index must be a list of 4 non-negative ints (character positions of the pause "
            f"tokens), got {pause_tokens_index!r}"
        )
    return max(0, pause_tokens_index[-1] - STRICT_BOX_WINDOW)


def _check_types(solution_str: Any, ground_truth: Any) -> tuple[str, str]:
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be str (the decoded response), got {type(solution_str).__name__}")
    if isinstance(ground_truth, int) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    if not isinstance(ground_truth, str):
        raise TypeError(f"ground_truth must be str, got {type(ground_truth).__name__}: {ground_truth!r:.80}")
    return solution_str, ground_truth
