"""`dapo data prepare|synth|validate` through click's runner: real files in, real files out."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from data_helpers import good_row, write_jsonl_rows

from dapo.cli.data_cmd import data_group
from dapo.data import apply_dapo_template, load_records
from dapo.data.synth import SynthConfig, generate_synth_problems


def _run(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(data_group, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_prepare_prints_the_summary_and_writes_the_splits(tmp_path: Path) -> None:
    rows = [{"question": f"Q{i}", "answer": f"work\n#### {i},000"} for i in range(1, 9)]
    rows.append({"question": "Q1", "answer": "#### 1,000"})
    src = write_jsonl_rows(tmp_path / "gsm.jsonl", rows)
    code, out = _run(
        "prepare",
        src,
        "--out",
        tmp_path / "out",
        "--problem-key",
        "question",
        "--format",
        "gsm8k",
        "--val-size",
        "2",
        "--seed",
        "3",
        "--data-source",
        "gsm8k",
    )
    assert code == 0, out
    for words in ("rows read", "9", "duplicates removed", "1 (0 with a different answer)", "train", "6", "val"):
        assert words in out
    train, val = load_records(tmp_path / "out" / "train.parquet"), load_records(tmp_path / "out" / "val.parquet")
    assert (len(train), len(val)) == (6, 2)
    assert {r.data_source for r in train + val} == {"gsm8k"}
    assert sorted(int(r.ground_truth) for r in train + val) == [1000 * i for i in range(1, 9)]


def test_prepare_finds_gsm8k_question_column_without_a_flag(tmp_path: Path) -> None:
    rows = [{"question": f"Q{i}", "answer": f"work\n#### {i}"} for i in range(1, 5)]
    src = write_jsonl_rows(tmp_path / "gsm8k.jsonl", rows)
    code, out = _run("prepare", src, "--out", tmp_path / "out")  # as `dapo eval --test-file gsm8k.jsonl` does
    assert code == 0, out
    records = load_records(tmp_path / "out" / "train.parquet")
    assert sorted(r.ground_truth for r in records) == ["1", "2", "3", "4"]


def test_prepare_flags_reach_the_pipeline(tmp_path: Path) -> None:
    rows = [{"problem": "P", "answer": "3/4"}, {"problem": "P", "answer": "3/4"}]
    src = write_jsonl_rows(tmp_path / "d.jsonl", rows)
    code, out = _run("prepare", src, "--out", tmp_path / "out", "--no-template", "--no-dedup", "--allow-non-integer")
    assert code == 0, out
    records = load_records(tmp_path / "out" / "train.parquet")
    assert [(r.prompt[0].content, r.ground_truth) for r in records] == [("P", "3/4"), ("P", "3/4")]


def test_prepare_errors_exit_1_with_the_message_and_no_traceback(tmp_path: Path) -> None:
    src = write_jsonl_rows(tmp_path / "gsm.jsonl", [{"text": "Q", "answer": "#### 1"}])
    code, out = _run("prepare", src, "--out", tmp_path / "out")
    assert code == 1
    assert "Error:" in out and "no problem column 'problem'" in out and "--problem-key" in out
    assert "Traceback" not in out
    code, out = _run("prepare", src, "--out", tmp_path / "out", "--problem-key", "text", "--val-size", "1")
    assert code == 1 and "leaves no training rows" in out


def test_synth_writes_a_data_set_the_validator_accepts(tmp_path: Path) -> None:
    out_path = tmp_path / "synth.parquet"
    code, out = _run(
        "synth",
        "--out",
        out_path,
        "--num",
        "12",
        "--seed",
        "5",
        "--max-value",
        "9",
        "--operations",
        "+,*",
        "--no-word-problems",
        "--min-operands",
        "3",
        "--max-operands",
        "3",
    )
    assert code == 0, out
    records = load_records(out_path)
    expected = generate_synth_problems(
        12, 5, SynthConfig(min_operands=3, max_operands=3, max_value=9, operations=("+", "*"), word_problems=False)
    )
    assert [r.ground_truth for r in records] == [str(p.answer) for p in expected]
    assert [r.prompt[0].content for r in records] == [apply_dapo_template(p.problem) for p in expected]
    assert all(
        r.extra_info["raw_problem"].startswith("Compute") and "-" not in r.extra_info["raw_problem"] for r in records
    )
    code, out = _run("validate", out_path)
    assert code == 0 and f"OK {out_path}: 12 records (synth_arith: 12)" in out
    assert "not in the DAPO template" not in out


def test_synth_validation_set_is_disjoint_and_leaves_the_training_set_unchanged(tmp_path: Path) -> None:
    knobs = ["--seed", "1", "--max-value", "4", "--max-operands", "2", "--no-word-problems"]  # < 30 distinct problems
    code, out = _run("synth", "--out", tmp_path / "alone.jsonl", "--num", "30", *knobs)
    assert code == 0, out
    code, out = _run("synth", "--out", tmp_path / "s.jsonl", "--num", "30", *knobs, "--val-size", "30")
    assert code == 0, out
    train, val = load_records(tmp_path / "s.jsonl"), load_records(tmp_path / "s.val.jsonl")
    assert train == load_records(tmp_path / "alone.jsonl")
    assert 0 < len(val) < 30 and f"{30 - len(val)} dropped" in out
    assert not {r.extra_info["raw_problem"] for r in train} & {r.extra_info["raw_problem"] for r in val}
    assert {r.extra_info["split"] for r in val} == {"val"}


def test_synth_bad_knobs_exit_1_with_the_config_error(tmp_path: Path) -> None:
    code, out = _run("synth", "--out", tmp_path / "s.parquet", "--num", "3", "--operations", "+,/")
    assert code == 1 and "unsupported" in out and "Traceback" not in out
    assert not (tmp_path / "s.parquet").exists()


def test_validate_lists_every_problem_and_exits_1(tmp_path: Path) -> None:
    good = write_jsonl_rows(tmp_path / "good.jsonl", [good_row(0)])
    bad_row = {**good_row(1), "reward_model": {"ground_truth": "", "style": "rule"}}
    bad = write_jsonl_rows(tmp_path / "bad.jsonl", [good_row(0), bad_row])
    code, out = _run("validate", good, bad, tmp_path / "missing.parquet")
    assert code == 1
    assert f"OK {good}: 1 records (unit: 1)" in out
    assert "note: 1 prompts are not in the DAPO template" in out
    assert f"{bad}, row 1 (line 2), field 'reward_model.ground_truth': empty" in out
    assert "missing.parquet: no such file" in out


# ------------------------------------------------------------------------------------ unwritable outputs
def test_unwritable_outputs_are_one_message_naming_the_path(tmp_path: Path) -> None:
    # A file where the output folder should be: a real filesystem error for any user (chmod does not stop root).
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    src = write_jsonl_rows(tmp_path / "raw.jsonl", [{"problem": f"P{i}", "answer": str(i)} for i in range(4)])
    code, out = _run("prepare", src, "--out", blocker / "out")
    assert code == 1 and "Traceback" not in out
    assert f"writing {blocker / 'out' / 'train.parquet'} failed: a component of the path is a file" in out
    code, out = _run("synth", "--out", blocker / "s.jsonl", "--num", "4")
    assert code == 1 and f"writing {blocker / 's.jsonl'} failed: a file of that name is in the way" in out
    assert blocker.read_text() == "not a folder"


def _file_size_limit(limit: int):
    def apply() -> None:  # a real EFBIG in the child once a file grows past `limit`, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_at_the_second_split_leaves_both_old_splits_and_no_temporary(tmp_path: Path) -> None:
    rows = [{"problem": f"What is {i} times {i}? " * 3, "answer": str(i * i)} for i in range(60)]
    src = write_jsonl_rows(tmp_path / "raw.jsonl", rows)
    args = ["prepare", str(src), "--val-size", "50"]  # val.parquet (50 rows) is larger than train.parquet (10)
    code, out = _run(*args, "--out", tmp_path / "sizes")
    assert code == 0, out
    train_size = (tmp_path / "sizes" / "train.parquet").stat().st_size
    val_size = (tmp_path / "sizes" / "val.parquet").stat().st_size
    assert train_size < val_size
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "train.parquet").write_bytes(b"old train")
    (out_dir / "val.parquet").write_bytes(b"old val")
    proc = subprocess.run(
        [sys.executable, "-m", "dapo.cli.main", "data", *args, "--out", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_file_size_limit((train_size + val_size) // 2),
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"writing {out_dir / 'val.parquet'} failed: file size limit exceeded" in proc.stderr
    # the train split was written in full, but is not renamed onto the old one without its val split
    assert (out_dir / "train.parquet").read_bytes() == b"old train"
    assert (out_dir / "val.parquet").read_bytes() == b"old val"
    assert sorted(p.name for p in out_dir.iterdir()) == ["train.parquet", "val.parquet"]
