"""Choosing a scorer by data_source, loading custom reward functions from real files, and score_one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dapo.reward.custom_fn import load_custom_reward_fn
from dapo.reward.gsm8k import gsm8k_score
from dapo.reward.math_dapo import math_dapo_scorer
from dapo.reward.math_verify_scorer import SymbolicMathScorer
from dapo.reward.records import RewardResult
from dapo.reward.registry import (
    DEFAULT_REGISTRY,
    ScorerRegistry,
    UnknownDataSourceError,
    get_scorer,
    register_scorer,
    score_one,
)
from dapo.reward.symbolic import math_verify_available


@pytest.mark.parametrize(
    "data_source",
    [
        "math_dapo",
        "math_dapo_v2",
        "DAPO-17k",
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "aime-2024",
        "aime25",
        "AIME-2025",
        "Maxwell-Jia/aime_2024",
        "synth",
        "synth-arith",
    ],
)
def test_dapo_style_sources_use_the_dapo_rule(data_source: str) -> None:
    assert get_scorer(data_source) is math_dapo_scorer


@pytest.mark.parametrize("data_source", ["gsm8k", "gsm8k-train", "openai/gsm8k"])
def test_gsm8k_sources(data_source: str) -> None:
    assert get_scorer(data_source) is gsm8k_score


@pytest.mark.parametrize(
    "data_source", ["math500", "math500-test", "MATH-500", "HuggingFaceH4/MATH-500", "lighteval/MATH"]
)
def test_math_sources_use_math_verify_when_installed(data_source: str) -> None:
    expected = SymbolicMathScorer if math_verify_available() else type(math_dapo_scorer)
    assert isinstance(get_scorer(data_source), expected)


def test_unknown_data_source_lists_registered_patterns() -> None:
    message = r"no reward scorer for data_source 'olympiad'; registered patterns: \[.*'aime\*'.*'gsm8k\*'"
    with pytest.raises(UnknownDataSourceError, match=message):
        get_scorer("olympiad")
    with pytest.raises(UnknownDataSourceError):
        get_scorer("Math_DAPO")  # patterns are case-sensitive


def test_unknown_data_source_can_fall_back_to_a_default() -> None:
    assert get_scorer("olympiad", default=math_dapo_scorer) is math_dapo_scorer
    assert get_scorer("aime-2024", default=gsm8k_score) is math_dapo_scorer  # a match beats the default


def test_newest_registration_wins_and_unregister_restores() -> None:
    registry = ScorerRegistry()
    registry.register("aime*", math_dapo_scorer)
    registry.register("aime-2025", gsm8k_score)
    assert registry.get("aime-2025") is gsm8k_score and registry.get("aime-2024") is math_dapo_scorer
    assert registry.patterns == ["aime-2025", "aime*"]
    registry.register("aime*", gsm8k_score)  # re-registering a pattern replaces it and makes it newest
    assert registry.patterns == ["aime*", "aime-2025"] and registry.get("aime-2024") is gsm8k_score
    registry.unregister("aime*")
    assert registry.get("aime-2025") is gsm8k_score
    with pytest.raises(UnknownDataSourceError):
        registry.get("aime-2024")
    with pytest.raises(KeyError, match="not registered"):
        registry.unregister("aime*")


def test_register_scorer_overrides_a_builtin_in_the_default_registry() -> None:
    def always_right(solution_str: str, ground_truth: str, extra_info: dict | None) -> float:
        return 1.0

    register_scorer("aime-9999", always_right)
    try:
        assert get_scorer("aime-9999") is always_right
        assert get_scorer("aime-2024") is math_dapo_scorer
        assert score_one("aime-9999", "nonsense", "1") == RewardResult(1.0, True, "")
    finally:
        DEFAULT_REGISTRY.unregister("aime-9999")
    assert get_scorer("aime-9999") is math_dapo_scorer


def test_bad_registrations_are_clear_errors() -> None:
    registry = ScorerRegistry()
    with pytest.raises(ValueError, match="non-empty string"):
        registry.register("", math_dapo_scorer)
    with pytest.raises(TypeError, match="must be callable"):
        registry.register("x*", "math_dapo")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="data_source must be str"):
        registry.get(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------- score_one
def test_score_one_uses_the_registered_scorer() -> None:
    assert score_one("aime-2024", "...\nAnswer: 033", "33") == RewardResult(1.0, True, "33")
    assert score_one("gsm8k", "so\n#### 1,080", "... #### 1080") == RewardResult(1.0, True, "1080")
    assert score_one("math_dapo", "Answer: 7", "8", {"index": 3}) == RewardResult(-1.0, False, "7")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (1.0, RewardResult(1.0, True, "")),
        (-1, RewardResult(-1.0, False, "")),
        (0.0, RewardResult(0.0, False, "")),
        (True, RewardResult(1.0, True, "")),
        ({"score": 0.5}, RewardResult(0.5, True, "")),
        ({"score": -0.5, "pred": 12}, RewardResult(-0.5, False, "12")),
        ({"score": 1.0, "acc": False, "pred": None, "extra": 1}, RewardResult(1.0, False, "")),
    ],
)
def test_score_one_normalises_float_and_dict_returns(raw: object, expected: RewardResult) -> None:
    assert score_one("anything", "s", "t", scorer=lambda s, t, e: raw) == expected


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        ({"acc": True}, ValueError, "without a 'score' key"),
        (float("nan"), ValueError, "non-finite score"),
        ({"score": float("inf")}, ValueError, "non-finite score"),
        ("1.0x", TypeError, "must return a number or a dict"),
        (None, TypeError, "must return a number or a dict"),
    ],
)
def test_score_one_rejects_malformed_returns(raw: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        score_one("anything", "s", "t", scorer=lambda s, t, e: raw)


# ---------------------------------------------------------------------------------- custom functions
def write(tmp_path: Path, source: str, name: str = "my_reward.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_load_custom_reward_fn_from_a_real_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": 1.0 if solution_str.strip() == ground_truth else 0.0, "pred": solution_str.strip()}
        LIMIT = 3
        """,
    )
    fn = load_custom_reward_fn(f"{path}:compute_score")
    assert fn(data_source="x", solution_str=" 7 ", ground_truth="7", extra_info=None) == {"score": 1.0, "pred": "7"}


def test_two_files_with_the_same_name_do_not_shadow_each_other(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write(tmp_path / "a", "def f(**kw):\n    return 1.0\n", "r.py")
    b = write(tmp_path / "b", "def f(**kw):\n    return -1.0\n", "r.py")
    assert load_custom_reward_fn(f"{a}:f")() == 1.0
    assert load_custom_reward_fn(f"{b}:f")() == -1.0


def test_custom_fn_errors_name_what_is_wrong(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        THRESHOLD = 0.5
        def helper(x):
            return x
        def two_args(solution_str, ground_truth):
            return 1.0
        """,
    )
    with pytest.raises(FileNotFoundError, match="not found"):
        load_custom_reward_fn(f"{tmp_path / 'missing.py'}:compute_score")
    with pytest.raises(AttributeError, match=r"no function 'compute_score'.*\['helper', 'two_args'\]"):
        load_custom_reward_fn(f"{path}:compute_score")
    with pytest.raises(TypeError, match="is a float, not a function"):
        load_custom_reward_fn(f"{path}:THRESHOLD")
    with pytest.raises(TypeError, match="cannot be called as fn"):
        load_custom_reward_fn(f"{path}:two_args")
    with pytest.raises(ValueError, match="path/to/file.py:function_name"):
        load_custom_reward_fn(str(path))
    with pytest.raises(ValueError, match="Python identifier"):
        load_custom_reward_fn(f"{path}:not-a-name")


def test_custom_fn_file_that_fails_to_import(tmp_path: Path) -> None:
    path = write(tmp_path, "def compute_score(:\n", "broken.py")
    with pytest.raises(ImportError, match="SyntaxError"):
        load_custom_reward_fn(f"{path}:compute_score")
