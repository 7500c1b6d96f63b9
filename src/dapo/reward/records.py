"""The records that flow through the reward: ``RewardInput`` in, ``RewardResult`` out.

Plain frozen dataclasses of builtins, so they pickle cheaply to and from worker processes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RewardInput:
    """One response to score, with what identifies its scorer (``data_source``) and its ground truth."""

    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict | None = None


FLOAT32_MAX = 3.4028234663852886e38
"""Largest finite float32: a score beyond it becomes inf in the float32 reward tensors and poisons the advantages."""

FAILURE_KINDS = ("timeout", "worker_crash", "error")
"""Why a reward call produced no result: it ran past ``timeout_s``, its worker process died, or it raised."""


class InvalidRewardError(TypeError, ValueError):
    """A scorer returned a value that is not a valid reward. Never scored as failed: the function has a bug, and
    training on its guess would be training on wrong rewards."""


@dataclass(frozen=True)
class RewardResult:
    """One response's rule reward: ``score`` (+1/-1 for the built-in scorers), ``acc``, the parsed ``pred``.

    ``failure`` is "" for a scored response, else one of ``FAILURE_KINDS`` (then ``error`` says what happened); both
    are left out of equality, so a failed call equals ``RewardResult.failed()``.
    """

    score: float
    acc: bool
    pred: str
    failure: str = field(default="", compare=False)
    error: str = field(default="", compare=False)

    @classmethod
    def failed(cls, pred: str = "", *, failure: str = "", error: str = "") -> RewardResult:
        """The result of a response that could not be scored (timeout, crashed worker, error): -1, wrong."""
        return cls(-1.0, False, pred, failure, error)


def as_reward_result(raw: Any, *, where: str) -> RewardResult:
    """Validate and normalise a scorer's return value: a number (``acc = score > 0``) or a dict with ``"score"``.

    ``score`` must be a real number (int, float, bool or a numpy scalar; not a string), finite and within float32
    range. A dict may carry ``"acc"``, a bool or the number 0 / 1 (default ``score > 0``; the string "False" is an
    error, not True), and ``"pred"`` (default ``""``); other keys are ignored. Anything else raises
    ``InvalidRewardError`` naming ``where`` (the scorer) and showing the bad value.
    """
    if isinstance(raw, dict):
        if "score" not in raw:
            raise InvalidRewardError(
                f"{where} returned a dict without a 'score' key: keys {sorted(map(str, raw))} (returned {_show(raw)})"
            )
        score = _finite_score(raw["score"], where, raw)
        acc = _acc(raw["acc"], where, raw) if "acc" in raw else score > 0
        pred = raw.get("pred", "")
        return RewardResult(score, acc, "" if pred is None else str(pred))
    return RewardResult((score := _finite_score(raw, where, raw)), score > 0, "")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _finite_score(value: Any, where: str, raw: Any) -> float:
    if not _is_real(value):
        raise InvalidRewardError(
            f"{where} must return a number or a dict with a numeric 'score', got {type(value).__name__} "
            f"{_show(value)} (returned {_show(raw)})"
        )
    try:
        score = float(value)
    except OverflowError:  # an int beyond float range
        raise InvalidRewardError(
            f"{where} returned the score {_show(value)}, beyond float32 range (|score| <= {FLOAT32_MAX:.4g}): it "
            f"would become inf in training (returned {_show(raw)})"
        ) from None
    if not math.isfinite(score):
        raise InvalidRewardError(f"{where} returned a non-finite score {score!r} (returned {_show(raw)})")
    if abs(score) > FLOAT32_MAX:
        raise InvalidRewardError(
            f"{where} returned the score {score!r}, beyond float32 range (|score| <= {FLOAT32_MAX:.4g}): it would "
            f"become inf in training (returned {_show(raw)})"
        )
    return score


def _acc(value: Any, where: str, raw: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if _is_real(value) and (value == 0 or value == 1):
        return bool(value == 1)
    raise InvalidRewardError(
        f"{where} returned 'acc' = {type(value).__name__} {_show(value)}; it must be a bool or the number 0 / 1 "
        f"(returned {_show(raw)})"
    )


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real)
