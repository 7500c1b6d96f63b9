"""The training seam of tool use: tool/* metrics computed by hand, and the multi-turn rollout built (or refused) from
the config."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo.config import build_config
from dapo.data.prompts import PromptItem
from dapo.reward.scored_groups import ScoredGroup
from dapo.rollout.multi_turn import MultiTurnRollout
from dapo.training.errors import TrainingError
from dapo.training.tool_use import tool_metrics, with_tool_rollout
from tests.harness.engines import ScriptedEngine


def group(categories: list[list[str]], acc: list[bool]) -> ScoredGroup:
    n = len(acc)
    return ScoredGroup(
        PromptItem(0, (1, 2), "1", "synth"),
        [[5]] * n,
        [[0.0]] * n,
        [False] * n,
        [1.0] * n,
        acc,
        [0.0] * n,
        [""] * n,
        action_masks=[[1]] * n,
        tool_categories=categories,
    )


def test_tool_metrics_by_hand() -> None:
    groups = [group([["ok", "timeout"], [], ["ok"]], [True, False, True]), group([["memory"], []], [False, True])]
    m = tool_metrics(groups)
    assert m["tool/calls"] == 4 and m["tool/calls_per_sample"] == pytest.approx(4 / 5)
    assert m["tool/turns_per_sample"] == pytest.approx((3 + 1 + 2 + 2 + 1) / 5)
    assert m["tool/samples_with_call"] == pytest.approx(3 / 5)
    assert m["tool/errors"] == 2 and m["tool/timeouts"] == 1
    assert (m["tool/result/ok"], m["tool/result/memory"], m["tool/result/killed"]) == (2, 1, 0)
    assert m["tool/acc_with_call"] == pytest.approx(2 / 3) and m["tool/acc_without_call"] == pytest.approx(1 / 2)


def test_single_turn_groups_give_no_tool_metrics() -> None:
    single = ScoredGroup(PromptItem(0, (1,), "1", "synth"), [[5]], [[0.0]], [False], [1.0], [True], [0.0], [""])
    assert tool_metrics([single]) == {}


def closing_engine() -> ScriptedEngine:
    """Stands in for an engine whose release must not be skipped when the tool cannot be set up."""
    return ScriptedEngine(lambda prompts, params: [])


def test_off_by_default_and_built_when_enabled(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    import dapo

    tokenizer = AutoTokenizer.from_pretrained(Path(dapo.__file__).parent / "assets" / "tiny-qwen2")
    engine = closing_engine()
    assert with_tool_rollout(engine, build_config({}, []), tokenizer) is engine
    cfg = build_config(
        {},
        [
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.sandbox.mode=unsafe-no-isolation",
            "rollout.multi_turn.max_assistant_turns=2",
            "data.max_response_length=40",
        ],
    )
    built = with_tool_rollout(engine, cfg, tokenizer)
    assert isinstance(built, MultiTurnRollout) and built.engine is engine
    assert (built.params.max_assistant_turns, built.params.max_response_length) == (2, 40)
    built.close()
    assert engine.closed


def test_auto_mode_without_bubblewrap_stops_the_run_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    engine = closing_engine()
    with pytest.raises(TrainingError, match=r"rollout.multi_turn.sandbox.mode=auto: .*apt-get install bubblewrap"):
        with_tool_rollout(engine, build_config({}, ["rollout.multi_turn.enable=true"]), tokenizer=None)
    assert engine.closed
