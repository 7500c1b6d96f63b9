"""scripts/run_record.py writes the records scripts/render_docs.py renders from: what it writes can be read back as
written, and a run directory without metrics is refused before anything is written."""

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_record", ROOT / "scripts" / "run_record.py")
run_record = importlib.util.module_from_spec(_spec)
sys.modules["run_record"] = run_record
_spec.loader.exec_module(run_record)

CONSOLE = (
    "step 2/2 | reward 0.1 | 1.00 s/step\n"
    "done: 2 steps in 1,234 s, peak memory 2,048 MB\n"
    "validation val/acc/mean@8: first 0.382 (step 0) -> last 0.500 (step 2), +11.8 points\n"
)


def fake_run(folder: Path, gen_batch_size: int = 4) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 0, "val/acc/mean@8": 0.382}\n{"step": 1, "x": 2.5}\n')
    (folder / "config.yaml").write_text(f"data:\n  train_batch_size: 2\n  gen_batch_size: {gen_batch_size}\n")
    return folder


def test_a_run_record_reads_back_as_written(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    out = run_record.record_run(run, tmp_path / "rec", what="w", command="dapo train", load="alone", console=CONSOLE)
    with gzip.open(out / "metrics.jsonl.gz", "rt") as f:
        assert f.read() == (run / "metrics.jsonl").read_text()
    assert (out / "config.yaml").read_text() == (run / "config.yaml").read_text()
    meta = json.loads((out / "run.json").read_text())
    assert (meta["wall_s"], meta["peak_rss_mb"]) == (1234, 2048)  # thousands separators read
    assert meta["printed"] == CONSOLE.splitlines()[1:]  # the closing lines, not the step lines
    assert (meta["what"], meta["command"], meta["load"]) == ("w", "dapo train", "alone")
    assert meta["commit"] and meta["host_cpu"]
    again = run_record.record_run(run, tmp_path / "rec2", what="w", command="c", load="l", at_commit="abc1234")
    assert json.loads((again / "run.json").read_text())["commit"] == "abc1234"  # where the run started, not now


def test_a_run_without_metrics_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no metrics.jsonl"):
        run_record.record_run(tmp_path / "empty", tmp_path / "rec", what="w", command="c", load="l")
    assert not (tmp_path / "rec").exists()


def test_a_seeded_set_keeps_every_run_and_its_console_figures(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path / "runs" / f"cfg-s{seed}") for seed in (1, 2)]
    (tmp_path / "runs" / "log-cfg-s1.txt").write_text(CONSOLE)  # s2 has no log: its figures are None
    out = run_record.record_seeded_runs(
        [*runs, tmp_path / "runs" / "log-cfg-s1.txt"], tmp_path / "rec", what="w", command="c", load="l"
    )
    assert sorted(p.name for p in out.glob("*.gz")) == ["cfg-s1.metrics.jsonl.gz", "cfg-s2.metrics.jsonl.gz"]
    meta = json.loads((out / "runs.json").read_text())
    assert meta["wall_s"] == {"cfg-s1": 1234, "cfg-s2": None}
    assert meta["groups_per_round"] == 4  # gen_batch_size, not train_batch_size


def test_runs_of_different_batch_shapes_are_not_one_set(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path / "a-s1", 4), fake_run(tmp_path / "a-s2", 8)]
    with pytest.raises(ValueError, match=r"different numbers of groups per round \(\[4, 8\]\)"):
        run_record.record_seeded_runs(runs, tmp_path / "rec", what="w", command="c", load="l")
    assert not (tmp_path / "rec" / "runs.json").exists()
