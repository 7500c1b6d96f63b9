"""Rule-based reward for GSM8K: the DAPO scorer, also accepting GSM8K's own ``#### N`` answer line.

GSM8K ground truths end with ``#### N`` (the reference solution precedes it); a ground truth holding
``####`` is cut to what follows the last one. The prediction is what follows the LAST ``Answer:`` or
``####`` within the response's last ``TAIL_CHARS`` characters, normalised and compared exactly as in
``dapo.reward.math_dapo`` (so ``$1,080.00`` equals ``1080``).

No last-number fallback by default: a response that never states its answer in the requested format
scores -1, as in DAPO, where following the answer format is part of what the reward teaches; a
"last number in the text" rule also rewards a response that stops mid-calculation on the right number.
``flexible=True`` (not used by the registry) turns the fallback on, like verl's ``gsm8k`` "flexible"
method, for evaluating models that were never trained on the format.
"""

from __future__ import annotations

import re
from typing import Any

from dapo.reward.math_dapo import TAIL_CHARS, _check_types, last_answer_line
from dapo.reward.normalize import normalize_final_answer

GSM8K_ANSWER_PATTERN = re.compile(r"(?i)(?:Answer\s*:|####)\s*([^\n]+)")
_LAST_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def gsm8k_score(
    solution_str: str, ground_truth: str, extra_info: dict | None = None, *, flexible: bool = False
) -> dict[str, Any]:
    """Score one GSM8K response: ``{"score": +1.0 or -1.0, "acc": bool, "pred": normalised prediction}``."""
    solution_str, ground_truth = _check_types(solution_str, ground_truth)
    try:
        if "####" in ground_truth:
            ground_truth = ground_truth.rsplit("####", 1)[1]
        tail = solution_str[-TAIL_CHARS:]
        raw_pred = last_answer_line(tail, GSM8K_ANSWER_PATTERN)
        if raw_pred is None and flexible:
            numbers = _LAST_NUMBER.findall(tail)
            raw_pred = numbers[-1] if numbers else None
        pred = normalize_final_answer(raw_pred) if raw_pred else ""
        correct = bool(pred) and pred == normalize_final_answer(ground_truth)
    except Exception:  # safety net, as in compute_score
        return {"score": -1.0, "acc": False, "pred": ""}
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
