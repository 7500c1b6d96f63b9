"""dapo.infra.plot and `dapo plot`: a real PNG overlaying two runs written from synthetic metrics.jsonl files."""

from __future__ import annotations

import json
import resource
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from dapo.cli.plot_cmd import plot_command
from dapo.infra.plot import PANEL_NAMES, PANELS, make_figure, plot_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir: Path, *, scale: float, with_val: bool, with_mean_prob: bool = False) -> Path:
    run_dir.mkdir(parents=True)
    lines = []
    for step in range(1, 11):
        record: dict[str, float | int | None] = {
            "step": step,
            "response_length/mean": 100.0 * scale + 10 * step,
            "critic/score/mean": -1.0 + 0.1 * step * scale,
            "actor/entropy": 1.0 / (step * scale),
            "acc/mean": 0.05 * step * scale,
        }
        record["rollout/acc/mean"] = 0.02 * step * scale
        if with_mean_prob:
            record["actor/mean_prob"] = 0.5 + 0.01 * step
        if step == 4:
            record["acc/mean"] = None  # a non-finite value logged as null: skipped, not plotted as 0
        if with_val and step % 5 == 0:
            record["val/acc/mean@8"] = 0.1 * step * scale
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    return [
        _write_run(tmp_path / "baseline", scale=1.0, with_val=True),
        _write_run(tmp_path / "no_clip_higher", scale=2.0, with_val=False),
    ]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_figure_overlays_both_runs_and_marks_missing_panels(two_runs: list[Path]) -> None:
    fig = make_figure(two_runs, labels=["DAPO", "w/o clip-higher"])
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(axes) == {p.title for p in PANELS if not p.when_logged}  # no run called a tool: no tool panels
    for title in (
        "response length (kept groups)",
        "reward score (kept groups)",
        "generation entropy (kept groups)",
        "training accuracy (kept groups)",
        "rollout accuracy (all groups, before filtering)",
    ):
        lines = axes[title].get_lines()
        assert [line.get_label() for line in lines] == ["DAPO", "w/o clip-higher"]
        assert lines[0].get_color() != lines[1].get_color()
    acc_steps = axes["training accuracy (kept groups)"].get_lines()[0].get_xdata()
    assert list(acc_steps) == [1, 2, 3, 5, 6, 7, 8, 9, 10]  # the null at step 4 is skipped, not drawn as 0
    entropy = axes["generation entropy (kept groups)"].get_lines()[1].get_ydata()
    np.testing.assert_allclose(entropy, [1.0 / (2 * s) for s in range(1, 11)])

    val_lines = axes["validation accuracy"].get_lines()
    assert [line.get_label() for line in val_lines] == ["DAPO"]  # only the first run validated
    assert list(val_lines[0].get_xdata()) == [5, 10]
    assert axes["validation accuracy"].get_ylabel() == "val/acc/mean@8"

    assert axes["response length (kept groups)"].get_ylabel() == "tokens"
    assert axes["generation entropy (kept groups)"].get_ylabel() == "nats per token"
    for title in (
        "validation accuracy",
        "training accuracy (kept groups)",
        "rollout accuracy (all groups, before filtering)",
    ):
        assert axes[title].get_ylim() == (0.0, 1.0), title
    mean_prob = axes["mean probability (kept groups)"]
    assert mean_prob.get_lines() == [] and [t.get_text() for t in mean_prob.texts] == ["no data"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["DAPO", "w/o clip-higher"]


def test_tool_panels_appear_when_a_run_logged_tool_use(two_runs: list[Path]) -> None:
    records = [json.loads(line) for line in (two_runs[0] / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        r["tool/samples_with_call"] = 0.05 * r["step"]
        if "val/acc/mean@8" in r:
            r["val/tool/samples_with_call"] = 0.08 * r["step"]
    (two_runs[0] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    axes = {ax.get_title(): ax for ax in make_figure(two_runs).axes if ax.get_title()}
    rollout = axes["samples that called the tool (rollout)"].get_lines()
    assert len(rollout) == 1 and list(rollout[0].get_ydata()) == pytest.approx([0.05 * s for s in range(1, 11)])
    held_out = axes["samples that called the tool (validation)"].get_lines()
    assert list(held_out[0].get_xdata()) == [5, 10] and list(held_out[0].get_ydata()) == pytest.approx([0.4, 0.8])
    assert axes["samples that called the tool (rollout)"].get_ylim() == (0.0, 1.0)
    assert "tool calls per sample (rollout)" not in axes  # logged by no run: not a default panel
    chosen = make_figure(two_runs, metrics=["tool_calls"]).axes[0]  # chosen by name, it is drawn, empty
    assert chosen.get_title() == "tool calls per sample (rollout)"
    assert [t.get_text() for t in chosen.texts] == ["no data"]


def test_plot_runs_writes_a_png_with_both_runs_colours(two_runs: list[Path], tmp_path: Path) -> None:
    out = plot_runs(two_runs, tmp_path / "plots" / "runs.png")
    assert out == tmp_path / "plots" / "runs.png"
    assert _png_size(out) == (1500, 1275)  # 7 panels, 3 a row: figsize (15, 12.75) at 100 dpi
    assert out.stat().st_size > 20_000
    pixels = imread(out)[..., :3]
    for colour in ("C0", "C1"):  # each run's line colour is really drawn
        distance = np.abs(pixels - np.array(to_rgb(colour))).max(axis=-1)
        assert (distance < 0.02).sum() > 200, colour
    assert sorted(p.name for p in out.parent.iterdir()) == ["runs.png"]  # no temp file left


def test_plot_runs_rejects_bad_input(two_runs: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 run directories"):
        plot_runs(two_runs, tmp_path / "x.png", labels=["only one"])
    with pytest.raises(ValueError, match=r"must be a \.png file"):
        plot_runs(two_runs, tmp_path / "x.pdf")
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        plot_runs([tmp_path], tmp_path / "x.png")


def test_cli_plot_command(two_runs: list[Path], tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli.png"
    args = [str(d) for d in two_runs] + ["--out", str(out), "--label", "a", "--label", "b"]
    result = runner.invoke(plot_command, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"wrote {out}"
    assert _png_size(out) == (1500, 1275)

    empty = tmp_path / "empty_run"
    empty.mkdir()
    result = runner.invoke(plot_command, [str(two_runs[0]), str(empty), "--out", str(tmp_path / "e.png")])
    assert result.exit_code == 2
    assert f"{empty} has no metrics.jsonl" in result.output
    result = runner.invoke(plot_command, [*map(str, two_runs), "--out", str(tmp_path / "l.png"), "--label", "a"])
    assert result.exit_code == 2 and "got 1 --label for 2 RUN_DIR" in result.output
    assert not (tmp_path / "e.png").exists() and not (tmp_path / "l.png").exists()


def test_runs_with_different_k_get_separate_validation_panels(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "k8", scale=1.0, with_val=True)
    b = tmp_path / "k32"
    _write_run(b, scale=1.0, with_val=False)
    with (b / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 10, "val/acc/mean@32": 0.4}) + "\n")
    fig = make_figure([a, b], metrics=["val_acc"])
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["validation accuracy (mean@8)", "validation accuracy (mean@32)"]
    by_title = {ax.get_title(): ax for ax in fig.axes}
    assert [line.get_label() for line in by_title["validation accuracy (mean@8)"].get_lines()] == ["k8"]
    assert [line.get_label() for line in by_title["validation accuracy (mean@32)"].get_lines()] == ["k32"]


def test_metrics_choose_panels_and_smoothing_adds_a_smoothed_line(two_runs: list[Path]) -> None:
    fig = make_figure(two_runs, metrics=["entropy", "critic/advantages/mean"], smooth=0.6)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["generation entropy (kept groups)", "critic/advantages/mean"]
    entropy_lines = fig.axes[0].get_lines()
    assert len(entropy_lines) == 4  # raw (faint) + smoothed, per run
    raw, smoothed = entropy_lines[0].get_ydata(), entropy_lines[1].get_ydata()
    assert smoothed[0] == pytest.approx(raw[0]) and smoothed[-1] > raw[-1]  # debiased EMA lags a falling curve
    with pytest.raises(ValueError, match="unknown panel 'bogus'"):
        make_figure(two_runs, metrics=["bogus"])
    assert set(PANEL_NAMES) >= {"rollout_acc", "val_acc", "train_acc"}


def test_cli_metrics_and_smooth(two_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "m.png"
    result = CliRunner().invoke(
        plot_command, [*map(str, two_runs), "--out", str(out), "--metrics", "val_acc,rollout_acc", "--smooth", "0.5"]
    )
    assert result.exit_code == 0, result.output
    assert _png_size(out) == (1000, 425)
    result = CliRunner().invoke(plot_command, [*map(str, two_runs), "--out", str(out), "--metrics", "nope"])
    assert result.exit_code == 2 and "unknown panel 'nope'" in result.output


def test_unwritable_plot_output_is_one_message_and_leaves_the_old_png(two_runs: list[Path], tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"  # a file where the output folder should be: fails for root too
    blocker.write_text("x")
    result = CliRunner().invoke(plot_command, [*map(str, two_runs), "--out", str(blocker / "p.png")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.strip() == (
        f"Error: writing the plot {blocker / 'p.png'} failed: a file of that name is in the way"
    )

    # A full disk mid-write (a real EFBIG in a child process): the old PNG stays, no temporary is left.
    out_dir = tmp_path / "plots"
    out_dir.mkdir()
    (out_dir / "p.png").write_bytes(b"old png")

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the PNG is ~100 KB

    proc = subprocess.run(
        [sys.executable, "-m", "dapo.cli.main", "plot", *map(str, two_runs), "--out", str(out_dir / "p.png")],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"writing the plot {out_dir / 'p.png'} failed: file size limit exceeded" in proc.stderr
    assert [p.name for p in out_dir.iterdir()] == ["p.png"] and (out_dir / "p.png").read_bytes() == b"old png"
