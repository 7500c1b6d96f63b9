"""The math-verify backend: symbolic equivalence in a child process, with a hard per-sample time limit."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator

import pytest

from dapo.reward.math_dapo import math_dapo_scorer
from dapo.reward.math_verify_scorer import SymbolicMathScorer, answer_candidate
from dapo.reward.registry import builtin_registry
from dapo.reward.symbolic import SymbolicVerifier, as_inline_math, math_verify_available

needs_math_verify = pytest.mark.skipif(not math_verify_available(), reason="the optional math-verify package is absent")

# e^(e^(e^(e^e))): SymPy does not finish comparing this with e; math-verify's own alarm is >= 1 s.
PATHOLOGICAL = "e^{e^{e^{e^{e}}}}"


@pytest.fixture(scope="module")
def verifier() -> Iterator[SymbolicVerifier]:
    with SymbolicVerifier(timeout_s=20.0) as v:  # generous: the machine running the tests may be loaded
        yield v


@needs_math_verify
@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("\\frac{\\sqrt2}{2}", "\\frac{1}{\\sqrt{2}}"),  # radicals
        ("0.5", "\\frac12"),  # decimal vs fraction
        ("\\frac{6}{8}", "\\frac{3}{4}"),  # unreduced fraction
        ("[2, 5)", "[2,5)"),  # interval
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),  # MATH-500 polar coordinates
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("$x^2+2x+1$", "(x+1)^2"),  # stray $ in the prediction
    ],
)
def test_equivalent_answers(verifier: SymbolicVerifier, prediction: str, truth: str) -> None:
    assert verifier.equivalent(prediction, truth)


@needs_math_verify
@pytest.mark.parametrize(
    ("prediction", "truth"),
    [("[2, 5]", "[2,5)"), ("\\frac{1}{3}", "0.33"), ("3", "4"), ("", "1"), ("}{", "1"), ("\\sqrt{2}", "1.414")],
)
def test_different_answers(verifier: SymbolicVerifier, prediction: str, truth: str) -> None:
    assert not verifier.equivalent(prediction, truth)


@needs_math_verify
@pytest.mark.timeout(180)
def test_a_hanging_comparison_is_killed_at_the_limit_and_the_verifier_recovers() -> None:
    with SymbolicVerifier(timeout_s=0.5) as v:
        v.start()  # start-up is not part of a sample's time
        assert v.running and v.restarts == 0
        # The child cannot answer within 0.5 s (math-verify's own alarm is a whole second), so only the
        # parent's kill can end this call.
        assert v.equivalent(PATHOLOGICAL, "e") is False
        assert v.restarts == 1 and not v.running
        assert v.equivalent("0.5", "\\frac12")  # a fresh child answers the next sample
        assert v.restarts == 1


@needs_math_verify
def test_pickling_keeps_settings_not_the_process(verifier: SymbolicVerifier) -> None:
    verifier.start()
    clone = pickle.loads(pickle.dumps(verifier))
    assert clone.timeout_s == verifier.timeout_s and not clone.running and clone.restarts == 0


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        SymbolicVerifier(0)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        SymbolicVerifier(float("nan"))


def test_inner_timeout_is_whole_seconds_and_a_third_of_the_limit() -> None:
    assert SymbolicVerifier(0.5).inner_timeout_s == 1
    assert SymbolicVerifier(9.0).inner_timeout_s == 3


def test_as_inline_math() -> None:
    assert as_inline_math(" $\\frac12$ ") == "$\\frac12$"


# ------------------------------------------------------------------------------------------ scorer
def test_answer_candidate_prefers_the_answer_line_then_the_last_box() -> None:
    assert answer_candidate("\\boxed{1}\nAnswer: $\\frac{1}{2}$ ") == "$\\frac{1}{2}$"
    assert answer_candidate("so \\boxed{1} or \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert answer_candidate("nothing here") == ""


@needs_math_verify
def test_scorer_exact_matches_never_start_the_child() -> None:
    scorer = SymbolicMathScorer(timeout_s=20.0)
    assert scorer("Answer: 540", "540") == {"score": 1.0, "acc": True, "pred": "540"}
    assert scorer("The answer is \\boxed{\\dfrac{1}{2}}", "\\frac12")["acc"]  # boxed, normalised match
    assert scorer("no answer", "3") == {"score": -1.0, "acc": False, "pred": ""}
    assert not scorer.verifier.running
    scorer.close()


@needs_math_verify
def test_scorer_falls_back_to_symbolic_equivalence() -> None:
    scorer = SymbolicMathScorer(timeout_s=20.0)
    try:
        assert scorer("We rationalise.\nAnswer: $\\frac{\\sqrt{2}}{2}$", "\\frac{1}{\\sqrt2}") == {
            "score": 1.0,
            "acc": True,
            "pred": "\\frac{\\sqrt{2}}{2}",
        }
        assert scorer("so $x \\in \\boxed{[2, 5)}$", "[2,5)")["acc"]
        assert scorer("Answer: 0.75", "\\frac34")["acc"]
        assert scorer("Answer: 0.7", "\\frac34") == {"score": -1.0, "acc": False, "pred": "0.7"}
        assert scorer.verifier.running
    finally:
        scorer.close()


def test_without_math_verify_the_registry_falls_back_and_the_scorer_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes the package unimportable
    assert not math_verify_available()
    with pytest.raises(ImportError, match=r"pip install 'dapo\[verify\]'"):
        SymbolicMathScorer()
    registry = builtin_registry()
    assert registry.get("math500") is math_dapo_scorer
    assert registry.get("HuggingFaceH4/MATH-500") is math_dapo_scorer
