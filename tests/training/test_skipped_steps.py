"""A run whose optimizer steps keep being skipped stops with a clear error (dapo.training.skipped_steps)."""

from __future__ import annotations

import pytest

from dapo.config import ConfigError, load_config
from dapo.training.errors import TrainingError
from dapo.training.skipped_steps import SkippedStepGuard


def _step(taken: int, skipped: int) -> dict[str, float]:
    return {"actor/num_optimizer_steps": float(taken), "actor/num_skipped_steps": float(skipped)}


def test_consecutive_skips_across_steps_stop_the_run_and_a_taken_step_resets_the_count() -> None:
    guard = SkippedStepGuard(limit=3)
    guard.observe(1, _step(0, 2))  # 2 consecutive
    guard.observe(2, _step(1, 1))  # a step was taken: reset
    assert guard.consecutive == 0
    guard.observe(3, _step(0, 2))  # 2
    guard.observe(4, {})  # no update at all (no informative group): neither adds nor resets
    assert guard.consecutive == 2
    with pytest.raises(
        TrainingError,
        match=r"step 5: 3 consecutive optimizer steps were skipped .*"
        r"trainer.max_consecutive_skipped_steps=3",
    ):
        guard.observe(5, _step(0, 1))  # 3 = the limit


def test_a_limit_of_zero_never_stops() -> None:
    guard = SkippedStepGuard(limit=0)
    for step in range(1, 20):
        guard.observe(step, _step(0, 4))
    assert guard.consecutive == 76


def test_the_limit_is_validated_and_defaults_to_3() -> None:
    assert load_config(None, []).trainer.max_consecutive_skipped_steps == 3
    with pytest.raises(ConfigError, match="max_consecutive_skipped_steps"):
        load_config(None, ["trainer.max_consecutive_skipped_steps=-1"])
