"""Scorer for data sets with non-integer answers (MATH-500): exact match first, then symbolic equivalence.

1. The DAPO scorer (``compute_score``): a normalised ``Answer:`` line equal to the ground truth is +1
   at once, without touching SymPy (every integer answer ends here).
2. Otherwise the candidate answer is the ``Answer:`` line of the response's tail or, failing that,
   its last ``\\boxed{}`` (MATH-style prompts ask for a box); a normalised match is +1.
3. Otherwise math-verify decides (``SymbolicVerifier``: separate process, hard ``timeout_s``).
"""

from __future__ import annotations

from typing import Any

from dapo.reward.math_dapo import TAIL_CHARS, compute_score, last_answer_line, last_boxed_content
from dapo.reward.normalize import normalize_final_answer
from dapo.reward.symbolic import INSTALL_HINT, SymbolicVerifier, math_verify_available


def answer_candidate(solution_str: str) -> str:
    """The raw final answer of a response: its last ``Answer:`` line, else its last ``\\boxed{}`` ("" if none)."""
    tail = solution_str[-TAIL_CHARS:]
    line = last_answer_line(tail)
    if line is None:
        line = last_boxed_content(tail)
    return (line or "").strip()


class SymbolicMathScorer:
    """Callable scorer ``(solution_str, ground_truth, extra_info) -> {"score", "acc", "pred"}``.

    Holds one ``SymbolicVerifier`` (one child process, started on first need). Raises ``ImportError``
    at construction when math-verify is not installed.
    """

    def __init__(self, timeout_s: float = 5.0) -> None:
        if not math_verify_available():
            raise ImportError(f"SymbolicMathScorer needs the 'math-verify' package; {INSTALL_HINT}")
        self.verifier = SymbolicVerifier(timeout_s)

    def __call__(self, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict[str, Any]:
        result = compute_score(solution_str, ground_truth)
        if result["acc"]:
            return result
        candidate = answer_candidate(solution_str)
        if not candidate:
            return result
        pred = normalize_final_answer(candidate)
        same = bool(pred) and pred == normalize_final_answer(ground_truth)
        if not same:
            same = self.verifier.equivalent(candidate, ground_truth)
        return {"score": 1.0 if same else -1.0, "acc": same, "pred": pred}

    def warm_up(self) -> None:
        """Start the verifier's child process now (a pool worker does this before its chunk's clock starts)."""
        self.verifier.start()

    def close(self) -> None:
        """Stop the verifier's child process (it restarts on the next call that needs it)."""
        self.verifier.close()

    def __repr__(self) -> str:
        return f"SymbolicMathScorer(timeout_s={self.verifier.timeout_s})"
