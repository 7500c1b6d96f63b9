"""GSM8K scoring: ``#### N`` and ``Answer: N`` lines, ground truths with the full solution, no last-number
fallback unless asked for."""

from __future__ import annotations

import pytest

from dapo.reward.gsm8k import gsm8k_score

GSM8K_TRUTH = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer\u2019s market.\n#### 18"
)


@pytest.mark.parametrize(
    ("response", "truth", "acc", "pred"),
    [
        ("She makes 9 * 2 = 18 dollars.\n#### 18", GSM8K_TRUTH, True, "18"),
        ("She makes 9 * 2 = 18 dollars.\nAnswer: $18", GSM8K_TRUTH, True, "18"),
        ("Answer: 18", "18", True, "18"),
        ("####18", "18", True, "18"),
        ("#### 1,080", "#### 1080", True, "1080"),
        ("#### 18.00", "18", True, "18"),  # numbers by value
        ("#### 17\nNo wait.\nAnswer: 18", "18", True, "18"),  # the last marker wins
        ("Answer: 18\n#### 17", "18", False, "17"),
        ("She makes 9 * 2 = 18 dollars.", "18", False, ""),  # no last-number fallback by default
        ("#### -3", "-3", True, "-3"),
    ],
)
def test_gsm8k_pairs(response: str, truth: str, acc: bool, pred: str) -> None:
    assert gsm8k_score(response, truth) == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def test_flexible_mode_takes_the_last_number() -> None:
    assert gsm8k_score("She makes 9 * 2 = 18 dollars.", GSM8K_TRUTH, flexible=True) == {
        "score": 1.0,
        "acc": True,
        "pred": "18",
    }
    assert gsm8k_score("9 * 2 = 1,018", "1018", flexible=True)["acc"]
    assert not gsm8k_score("She makes 9 * 2 = 18 dollars, then 20 more.", "18", flexible=True)["acc"]
    assert gsm8k_score("no numbers", "18", flexible=True)["pred"] == ""
