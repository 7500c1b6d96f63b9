"""dapo.infra.progress: plain lines when stdout is not a TTY, a live rich bar on a TTY, silence when disabled."""

from __future__ import annotations

import io
import re

import pytest

from dapo.infra.progress import TrainingProgress, format_duration

METRICS = {
    "critic/score/mean": 0.25,
    "acc/mean": 0.625,
    "actor/entropy": 0.41234,
    "response_length/mean": 512.34,
    "other/metric": 9.0,
}
LINE = re.compile(
    r"^step (\d+)/10 \| reward 0\.250 \| acc 0\.625 \| entropy 0\.412 \| resp_len 512\.3 "
    r"\| (\d+\.\d\d) s/step \| ETA (\d+):(\d\d):(\d\d)$"
)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_non_tty_prints_one_plain_line_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    with TrainingProgress(10) as progress:  # pytest's captured stdout is not a TTY
        progress.update(1, METRICS)
        progress.update(2, METRICS)
        progress.update(3, {"acc/mean": float("nan")})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for step, line in zip((1, 2), lines[:2], strict=True):
        match = LINE.match(line)
        assert match, line
        assert int(match.group(1)) == step
        seconds_per_step = float(match.group(2))
        eta = int(match.group(3)) * 3600 + int(match.group(4)) * 60 + int(match.group(5))
        assert abs(eta - seconds_per_step * (10 - step)) <= 1  # time left = mean s/step x steps left
    assert re.match(r"^step 3/10 \| acc nan \| \d+\.\d\d s/step \| ETA \d+:\d\d:\d\d$", lines[2]), lines[2]
    assert "\x1b" not in "".join(lines)  # no terminal control codes in CI logs


def test_resumed_run_counts_from_initial_step() -> None:
    out = io.StringIO()
    with TrainingProgress(10, initial_step=9, file=out) as progress:
        progress.update(9, {})  # nothing timed yet: no s/step, no ETA
        progress.update(10, {})
    first, second = out.getvalue().splitlines()
    assert first == "step 9/10"
    assert re.match(r"^step 10/10 \| \d+\.\d\d s/step \| ETA 0:00:00$", second), second


def test_disabled_is_silent(capsys: pytest.CaptureFixture[str]) -> None:
    terminal = _Terminal()
    with TrainingProgress(5, enabled=False, file=terminal) as progress:
        progress.update(1, METRICS)
    with TrainingProgress(5, enabled=False) as progress:
        progress.update(1, METRICS)
    assert terminal.getvalue() == "" and capsys.readouterr().out == ""


def test_tty_shows_a_live_bar_with_the_metrics() -> None:
    terminal = _Terminal()
    with TrainingProgress(4, file=terminal) as progress:
        progress.update(1, METRICS)
        progress.update(2, METRICS)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())  # drop cursor/colour codes
    assert "step 2/4" in text
    for shown in ("reward 0.250", "acc 0.625", "entropy 0.412", "resp_len 512.3", "s/step"):
        assert shown in text  # an 80-column terminal folds the metrics onto a second line
    assert re.search(r"ETA \d+:\d\d:\d\d", text)


def test_bad_arguments_and_misuse() -> None:
    with pytest.raises(ValueError, match="total_steps must be an int >= 1"):
        TrainingProgress(0)
    with pytest.raises(ValueError, match=r"initial_step must be in \[0, 3\]"):
        TrainingProgress(3, initial_step=4)
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        TrainingProgress(3).update(1, {})


def test_format_duration() -> None:
    assert format_duration(0) == "0:00:00"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(3 * 3600 + 25 * 60 + 7) == "3:25:07"
    assert format_duration(-5) == "0:00:00"


def test_time_before_the_first_step_is_not_in_the_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("dapo.infra.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    with TrainingProgress(10, file=out) as progress:
        progress.phase("step 0: validating on 64 prompts before training")
        clock[0] += 40.0  # the step-0 validation
        progress.start_steps()
        clock[0] += 10.0  # step 1
        progress.update(1, {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 0: validating on 64 prompts before training"
    assert lines[1] == "step 1/10 | 10.00 s/step | ETA 0:01:30"  # was 50.00 s/step and ETA 0:07:30
