"""reward_model.compat=reference: the published DAPO scorer exactly. On every documented difference (the `differs-`
cases of test_reward_math_dapo.py, the rows of docs/reward.md) it gives the published answer, i.e. the opposite of
the improved scorer; on every other hand-written case the two agree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dapo.config import load_config
from dapo.reward.math_dapo import compute_score as improved
from dapo.reward.math_dapo_reference import compute_score as reference
from dapo.reward.math_dapo_reference import normalize_final_answer_reference
from dapo.reward.registry import builtin_registry, registry_for_compat

_spec = importlib.util.spec_from_file_location("_improved_cases", Path(__file__).with_name("test_reward_math_dapo.py"))
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
CASES, COT = _mod.CASES, _mod.COT


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reference_differs_exactly_on_the_documented_cases(case):
    name, response, truth, acc, _ = case
    ref = reference(response, truth)
    if name.startswith("differs-"):
        assert ref["acc"] is (not acc), name
    else:
        assert ref["acc"] is acc == improved(response, truth)["acc"], name  # pred may differ (e.g. "[INVALID]")


# The published scorer's own outputs on the rows of docs/reward.md (score, pred).
PUBLISHED = [
    (COT + "Answer: 025", "25", -1.0, "025"),
    (COT + "Answer: 1,2", "12", 1.0, "12"),
    (COT + "Answer: 42.", "42", -1.0, "42."),
    (COT + "Answer: \\dfrac{1}{2}", "\\frac{1}{2}", -1.0, "\\dfrac{1}{2}"),
    (COT + "Answer: \\text{Tina }", "\\text{Tin}", 1.0, "Tin"),
    (COT + "no final line", "[INVALID]", 1.0, "[INVALID]"),
    (COT + "Answer: $ $", "", 1.0, ""),
    (COT + "Answer: -1,000", "-1000", -1.0, "-1,000"),
]


@pytest.mark.parametrize(("response", "truth", "score", "pred"), PUBLISHED)
def test_published_outputs(response, truth, score, pred):
    assert reference(response, truth) == {"score": score, "acc": score > 0, "pred": pred}


def test_strict_box_is_raw_and_on_the_tail():
    assert reference(COT + "\\boxed{42}", "42", strict_box_verify=True)["acc"]
    assert not reference(COT + "\\boxed{ 025 }", "25", strict_box_verify=True)["acc"]  # raw comparison
    assert reference(COT + "no box", "x", strict_box_verify=True)["pred"] is None  # as published
    # The published code compares None with the ground truth: a literal "[INVALID]" is not matched by a missing box
    # (it was, +1, while the missing box was spelled "[INVALID]" here).
    missing = reference(COT + "no box", "[INVALID]", strict_box_verify=True)
    assert (missing["score"], missing["acc"], missing["pred"]) == (-1.0, False, None)
    long = "x" * 1000 + "\\boxed{7}" + "y" * 491  # box at 1000 of 1500: the index is applied to the 300-char tail
    assert not reference(long, "7", strict_box_verify=True, pause_tokens_index=[0, 0, 0, 1010])["acc"]


def test_normalisation_is_the_published_one():
    assert normalize_final_answer_reference("\\text{an even number}") == "evennumber"
    assert normalize_final_answer_reference("1{,}000") == "1000"
    assert normalize_final_answer_reference("\\frac12") == "\\frac{1}{2}"


def test_compat_switch_selects_the_scorer():
    assert load_config().reward_model.compat == "improved"
    assert load_config(None, ["reward_model.compat=reference"]).reward_model.compat == "reference"
    assert registry_for_compat("improved") is None
    ref = registry_for_compat("reference")
    for source in ("math_dapo", "aime-2024", "DAPO-17k"):
        assert ref.get(source)("Answer: 025", "25", None)["acc"] is False
        assert builtin_registry().get(source)("Answer: 025", "25", None)["acc"] is True
    assert ref.get("gsm8k") is builtin_registry().get("gsm8k")
    with pytest.raises(ValueError, match="compat"):
        builtin_registry(compat="paper")
