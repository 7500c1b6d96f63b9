"""The records that flow through the reward: ``RewardInput`` in, ``RewardResult`` out.

Plain frozen dataclasses of builtins, so they pickle cheaply to and from worker processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardInput:
    """One response to score, with what identifies its scorer (``data_source``) and its ground truth."""

    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict | None = None


@dataclass(frozen=True)
class RewardResult:
    """One response's rule reward: ``score`` (+1/-1 for the built-in scorers), ``acc``, the parsed ``pred``."""

    score: float
    acc: bool
    pred: str

    @classmethod
    def failed(cls, pred: str = "") -> RewardResult:
        """The result of a response that could not be scored (timeout, crashed worker): -1, wrong."""
        return cls(-1.0, False, pred)


def as_reward_result(raw: Any, *, where: str) -> RewardResult:
    """Normalise a scorer's return value: a number (``acc = score > 0``) or a dict with ``"score"``.

    A dict may carry ``"acc"`` (default ``score > 0``) and ``"pred"`` (default ``""``); other keys are
    ignored. ``where`` names the scorer in the error raised for anything else, or for a score that is
    not a finite number (a NaN reward would silently poison the advantages).
    """
    if isinstance(raw, dict):
        if "score" not in raw:
            raise ValueError(f"{where} returned a dict without a 'score' key: keys {sorted(map(str, raw))}")
        score = _finite_score(raw["score"], where)
        acc = raw.get("acc", score > 0)
        pred = raw.get("pred", "")
        return RewardResult(score, bool(acc), "" if pred is None else str(pred))
    return RewardResult((score := _finite_score(raw, where)), score > 0, "")


def _finite_score(value: Any, where: str) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{where} must return a number or a dict with a numeric 'score', got {type(value).__name__}: {value!r:.80}"
        ) from None
    if not math.isfinite(score):
        raise ValueError(f"{where} returned a non-finite score {score!r}")
    return score
