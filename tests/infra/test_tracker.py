"""dapo.infra.tracking: JSONL round trip, crash-truncated lines, resume truncation, TensorBoard, console, wandb error."""

from __future__ import annotations

import io
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo.infra.tracking import METRICS_FILE_NAME, Tracker, read_metrics, truncate_metrics_after, val_acc_keys

SRC = Path(__file__).resolve().parents[2] / "src"


def _tracker(run_dir: Path, *backends: str, **kwargs) -> Tracker:
    return Tracker(run_dir, backends=backends or ("jsonl",), project="p", experiment="e", config={"lr": 1e-6}, **kwargs)


def test_jsonl_round_trip_with_nonfinite_as_null(tmp_path: Path) -> None:
    with _tracker(tmp_path) as tracker:
        tracker.log({"critic/score/mean": 0.25, "acc/mean": 0.5, "count": 7}, step=1)
        tracker.log({"actor/entropy": torch.tensor(1.5), "bad": math.nan, "huge": -math.inf}, step=2)
    lines = (tmp_path / METRICS_FILE_NAME).read_text().splitlines()
    assert lines[1] == '{"step": 2, "actor/entropy": 1.5, "bad": null, "huge": null}'
    assert read_metrics(tmp_path) == [
        {"step": 1, "critic/score/mean": 0.25, "acc/mean": 0.5, "count": 7},
        {"step": 2, "actor/entropy": 1.5, "bad": None, "huge": None},
    ]
    assert isinstance(read_metrics(tmp_path)[0]["count"], int)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(
        st.dictionaries(
            st.text(min_size=1, max_size=12).filter(lambda k: k != "step"),
            st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**40), 2**40),
            max_size=4,
        ),
        max_size=6,
    )
)
def test_jsonl_round_trip_property(tmp_path_factory: pytest.TempPathFactory, records: list[dict]) -> None:
    run_dir = tmp_path_factory.mktemp("prop")
    with _tracker(run_dir) as tracker:
        for step, metrics in enumerate(records):
            tracker.log(metrics, step=step)
    expected = [
        {"step": step, **{k: (v if isinstance(v, int) or math.isfinite(v) else None) for k, v in m.items()}}
        for step, m in enumerate(records)
    ]
    assert read_metrics(run_dir) == expected


def test_truncated_last_line_is_skipped_then_trimmed_on_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _tracker(tmp_path) as tracker:
        tracker.log({"a": 1.0}, step=1)
        tracker.log({"a": 2.0}, step=2)
    path = tmp_path / METRICS_FILE_NAME
    with open(path, "a") as f:
        f.write('{"step": 3, "a": 3.')  # what a crash mid-write leaves
    with caplog.at_level(logging.WARNING, logger="dapo.infra.tracking"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert "truncated last line 3" in caplog.text

    with _tracker(tmp_path) as tracker:
        tracker.log({"a": 3.5}, step=3)
    assert path.read_text().splitlines()[-1] == '{"step": 3, "a": 3.5}'
    assert [r["a"] for r in read_metrics(tmp_path)] == [1.0, 2.0, 3.5]


def test_corrupt_middle_line_is_skipped_with_a_warning_and_quarantined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / METRICS_FILE_NAME
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n\x00\x00garbage\n{"step": 3}\n')
    with caplog.at_level(logging.WARNING, logger="dapo.infra.tracking"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert "skipping line 2, not a metrics record" in caplog.text and "line 4" in caplog.text
    assert truncate_metrics_after(tmp_path, 2) == 1
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert (tmp_path / "metrics.jsonl.bad").read_text() == "not json\n\x00\x00garbage\n"
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        read_metrics(tmp_path / "elsewhere")


def test_truncate_after_resume_drops_later_steps_and_keeps_bytes(tmp_path: Path) -> None:
    with _tracker(tmp_path) as tracker:
        for step in range(1, 6):
            tracker.log({"x": step / 3}, step=step)
    before = (tmp_path / METRICS_FILE_NAME).read_text().splitlines()
    assert truncate_metrics_after(tmp_path, 3) == 2
    assert (tmp_path / METRICS_FILE_NAME).read_text().splitlines() == before[:3]
    with _tracker(tmp_path) as tracker:  # the resumed run re-logs steps 4, 5
        tracker.log({"x": 40.0}, step=4)
        tracker.log({"x": 50.0}, step=5)
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [1, 2, 3, 4, 5]
    assert read_metrics(tmp_path)[3]["x"] == 40.0
    assert truncate_metrics_after(tmp_path / "fresh", 3) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.integers(0, 20), max_size=12), cut=st.integers(-1, 21))
def test_truncate_keeps_exactly_the_records_up_to_the_step(steps: list[int], cut: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        with _tracker(run_dir) as tracker:
            for index, step in enumerate(steps):
                tracker.log({"i": index}, step=step)
        dropped = truncate_metrics_after(run_dir, cut)
        kept = [(step, index) for index, step in enumerate(steps) if step <= cut]
        assert [(r["step"], r["i"]) for r in read_metrics(run_dir)] == kept
        assert dropped == len(steps) - len(kept)


def test_tensorboard_backend_writes_readable_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with _tracker(tmp_path, "jsonl", "tensorboard") as tracker:
        tracker.log({"critic/score/mean": 0.5}, step=1)
        tracker.log({"critic/score/mean": 0.75}, step=2)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("critic/score/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.5), (2, 0.75)]


def test_console_backend_prints_one_line_per_step(tmp_path: Path) -> None:
    out = io.StringIO()
    with _tracker(tmp_path, "console", console_file=out) as tracker:
        tracker.log({"acc/mean": 0.123456, "n": 3, "bad": math.nan}, step=4)
    assert out.getvalue() == "step 4 | acc/mean=0.1235 | n=3 | bad=nan\n"
    assert not (tmp_path / METRICS_FILE_NAME).exists()


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown backend\(s\) \['mlflow'\]"):
        _tracker(tmp_path, "jsonl", "mlflow")
    with pytest.raises(TypeError, match="sequence of names"):
        Tracker(tmp_path, backends="jsonl", project="p", experiment="e", config={})
    tracker = _tracker(tmp_path)
    with pytest.raises(TypeError, match="metric 'acc': expected a number, got str"):
        tracker.log({"acc": "high"}, step=1)
    with pytest.raises(ValueError, match="'step' is reserved"):
        tracker.log({"step": 1.0}, step=1)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        tracker.log({"a": 1.0}, step=-1)
    tracker.close()
    tracker.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        tracker.log({"a": 1.0}, step=1)


def test_wandb_missing_gives_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The dev install includes wandb, so its absence is simulated: a None entry in sys.modules makes `import wandb`
    # raise ImportError exactly as a missing package does (a skip on "wandb installed" could never run in CI).
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"needs the wandb package.*pip install 'dapo\[wandb\]'"):
        _tracker(tmp_path, "jsonl", "wandb")


_WANDB_SCRIPT = """
import sys
from pathlib import Path
from dapo.infra.tracking import Tracker
run_dir, mode, step = Path(sys.argv[1]), sys.argv[2] or None, int(sys.argv[3])
with Tracker(run_dir, backends=["wandb"], project="p", experiment="e", config={"lr": 1e-6}, wandb_mode=mode) as t:
    t.log({"critic/score/mean": 0.5}, step=step)
"""


@pytest.mark.parametrize("how", ["argument", "WANDB_MODE"])
def test_wandb_offline_run_records_config(tmp_path: Path, how: str) -> None:
    """In a real process (wandb's service flushes its run file when the process ends), without network or key."""
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"WANDB_SILENT": "true", "PYTHONPATH": os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])}
    if how == "WANDB_MODE":
        env["WANDB_MODE"] = "offline"
    mode = "offline" if how == "argument" else ""
    for step in (1, 2):  # the second process is a resumed run: same W&B run id
        subprocess.run(
            [sys.executable, "-c", _WANDB_SCRIPT, str(tmp_path), mode, str(step)], env=env, check=True, timeout=120
        )
    run_id = (tmp_path / "wandb_run_id.txt").read_text().strip()
    records = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert 1 <= len(records) <= 2  # two runs in the same second share one folder name
    data = records[0].read_bytes()  # protobuf records: config items and metric names appear verbatim
    assert b"lr" in data and b"1e-6" in data and b"critic/score/mean" in data


def test_val_acc_keys_are_the_mean_at_k_keys_ordered_by_k_as_numbers():
    records = [
        {"step": 5, "val/acc/mean@16": 0.5, "val/acc/mean@16/ci95": 0.1, "val/acc/pass@16": 0.9},
        {"step": 10, "val/acc/mean@4": 0.25, "val/acc/mean@32x": 1.0, "train/val/acc/mean@2": 0.0},
    ]
    assert val_acc_keys(records) == ["val/acc/mean@4", "val/acc/mean@16"]  # 4 < 16, though "16" < "4" as text
    assert val_acc_keys([{"step": 1, "critic/score/mean": 0.0}]) == []
