"""The logger seam: the registry is the one list of metric sinks (the config accepts exactly its names), the Tracker
opens the chosen ones in the registry's order and feeds each the same cleaned values, and a sink added to the
registry is used with no other change (docs/extending.md, "Add a logger")."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import ClassVar

import pytest

from dapo.config.schema import TrainerConfig
from dapo.infra.loggers import registry
from dapo.infra.loggers.base import RunContext, Values
from dapo.infra.tracking import Tracker


def test_the_config_accepts_exactly_the_registered_names() -> None:
    (literal,) = typing.get_args(TrainerConfig.model_fields["logger"].annotation)
    assert set(typing.get_args(literal)) == set(registry.LOGGER_NAMES) == {"jsonl", "tensorboard", "wandb", "console"}
    assert all(cls.name == name for name, cls in registry.LOGGERS.items())


class _Recorder:
    """A sink that keeps what it was given (a test double for a new backend)."""

    name: ClassVar[str] = "recorder"
    opened: ClassVar[list[RunContext]] = []
    seen: ClassVar[list[tuple[int, dict]]] = []
    closed: ClassVar[int] = 0

    def __init__(self, context: RunContext) -> None:
        _Recorder.opened.append(context)

    def log(self, values: Values, step: int) -> None:
        _Recorder.seen.append((step, dict(values)))

    def close(self) -> None:
        _Recorder.closed += 1


class _Broken:
    name: ClassVar[str] = "broken"

    def __init__(self, context: RunContext) -> None:
        raise OSError("no such service")


def test_a_registered_sink_gets_the_cleaned_values_beside_jsonl_and_is_closed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "LOGGERS", {**registry.LOGGERS, "recorder": _Recorder})
    monkeypatch.setattr("dapo.infra.tracking.LOGGERS", registry.LOGGERS)
    _Recorder.opened, _Recorder.seen, _Recorder.closed = [], [], 0
    tracker = Tracker(tmp_path, backends=["recorder", "jsonl"], project="p", experiment="e", config={"a": 1})
    tracker.log({"loss": 0.5, "n": 3, "bad": float("nan")}, step=2)
    tracker.close()
    tracker.close()
    assert [c.experiment for c in _Recorder.opened] == ["e"] and _Recorder.opened[0].run_dir == tmp_path
    # Ints stay ints, non-finite values arrive as None: the same values the JSONL record holds.
    assert _Recorder.seen == [(2, {"loss": 0.5, "n": 3, "bad": None})]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 2, "loss": 0.5, "n": 3, "bad": None}
    assert _Recorder.closed == 1


def test_a_sink_that_fails_to_open_closes_the_ones_already_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Registry order: the recorder opens before the broken sink, so it must be closed when the broken one raises.
    monkeypatch.setattr("dapo.infra.tracking.LOGGERS", {"recorder": _Recorder, "broken": _Broken})
    _Recorder.opened, _Recorder.seen, _Recorder.closed = [], [], 0
    with pytest.raises(OSError, match="no such service"):
        Tracker(tmp_path, backends=["broken", "recorder"], project="p", experiment="e", config={})
    assert len(_Recorder.opened) == 1 and _Recorder.closed == 1


def test_an_unknown_sink_is_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown backend\(s\) \['carrier-pigeon'\]; choose from \['jsonl', "
        r"'tensorboard', 'wandb', 'console'\]",
    ):
        Tracker(tmp_path, backends=["carrier-pigeon"], project="p", experiment="e", config={})
