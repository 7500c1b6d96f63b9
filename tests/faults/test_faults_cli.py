"""Fault injection through the real CLI: hostile reward functions, corrupted checkpoints and metrics, a full disk at
start-up. Each fault ends in a clean message (no traceback) or a run that carries on, and nothing completed is lost.

One base run (2 steps, a checkpoint after each) is trained once per module and copied for each scenario.

The base run, the resume that must end bit-identical to it, and every scenario that needs the process itself (an
rlimit or a dropped capability on the child) run in real processes forked from a warm server (``run_dapo_warm``: its
own pid, limits and pipes, the same click command, without the ~8 s of imports each; a fresh interpreter's `dapo train`
is tests/cli/test_train_cli.py's, and test_resume.py's reference); the other commands run in this process (``run_dapo_in_process``: the same click command, exit code,
stderr and log lines, an escaped exception shows as a Traceback), sparing an interpreter start-up each.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.cli.cli_helpers import FAST
from tests.harness.runners import run_dapo_in_process, run_dapo_warm

pytestmark = pytest.mark.slow

BASE = [*FAST, "trainer.save_freq=1", "trainer.test_freq=0", "trainer.val_before_train=false", "trainer.progress=false"]


def _clean_failure(proc, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in:\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("base")
    proc = run_dapo_warm(["train", *BASE, "trainer.experiment_name=base"], root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "base"


def _copy(base_run: Path, root: Path) -> Path:
    shutil.copytree(base_run, root / "run")
    return root / "run"


def _same_length_garbage(path: Path) -> None:
    path.write_bytes(b"#" * path.stat().st_size)


def _overwrite_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"\xff" * 8)


# ------------------------------------------------------------------------------------------- checkpoints
def test_corrupted_latest_checkpoint_and_metrics_line_fall_back_and_end_bit_identical(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    _same_length_garbage(run / "checkpoints" / "global_step_2" / "trainer_state.json")
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text(lines[0] + "\x00garbage{\n" + "".join(lines[1:]))

    proc = run_dapo_warm(["train", *BASE, "trainer.experiment_name=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipping checkpoint" in proc.stderr and "global_step_2" in proc.stderr
    assert "trainer_state.json does not match its checksum" in proc.stderr
    assert "resumed from" in proc.stdout and "global_step_1" in proc.stdout
    assert "skipping line 2, not a metrics record" in proc.stderr
    a = load_file(base_run / "checkpoints" / "global_step_2" / "hf" / "model.safetensors")
    b = load_file(run / "checkpoints" / "global_step_2" / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_every_checkpoint_unusable_refuses_to_start_over_and_keeps_the_record(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    for step in (1, 2):
        _overwrite_header(run / "checkpoints" / f"global_step_{step}" / "hf" / "model.safetensors")
    config_before = (run / "config.yaml").read_bytes()
    metrics_before = (run / "metrics.jsonl").read_bytes()
    proc = run_dapo_in_process(["train", *BASE, "trainer.experiment_name=run", "actor.optim.lr=0.5"], tmp_path)
    _clean_failure(proc, "every checkpoint under", "global_step_1", "global_step_2", "trainer.resume_mode=disable")
    assert (run / "config.yaml").read_bytes() == config_before  # the lr 0.5 of a failed start is not recorded
    assert (run / "metrics.jsonl").read_bytes() == metrics_before


def test_explicit_resume_path_that_fails_verification_names_the_file(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    ckpt = run / "checkpoints" / "global_step_1"
    _overwrite_header(ckpt / "hf" / "model.safetensors")
    proc = run_dapo_in_process(["train", *BASE, "trainer.experiment_name=run", f"trainer.resume_mode={ckpt}"], tmp_path)
    _clean_failure(proc, "cannot resume", "global_step_1", "hf/model.safetensors does not match its checksum")


def test_rerun_of_a_finished_run_says_nothing_to_do(base_run, tmp_path) -> None:
    _copy(base_run, tmp_path)
    proc = run_dapo_in_process(["train", *BASE, "trainer.experiment_name=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing to do" in proc.stdout and "done:" not in proc.stdout


def test_failed_start_up_does_not_overwrite_the_run_config(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    before = (run / "config.yaml").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"data_source": "x"}\n')
    proc = run_dapo_in_process(
        ["train", *BASE, "trainer.experiment_name=run", "actor.optim.lr=0.5", f"data.train_files=[{bad}]"], tmp_path
    )
    _clean_failure(proc, "bad.jsonl")
    assert (run / "config.yaml").read_bytes() == before


def test_a_resume_with_changes_that_fails_in_its_first_step_leaves_the_run_config_alone(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    before = (run / "config.yaml").read_bytes()
    lr = yaml.safe_load(before)["actor"]["optim"]["lr"]
    broken = tmp_path / "broken.py"
    broken.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise RuntimeError('broken reward')\n"
    )
    changed = ["trainer.resume_with_changes=true", "actor.optim.lr=0.5", "trainer.total_training_steps=3"]
    proc = run_dapo_in_process(
        [
            "train",
            *BASE,
            "trainer.experiment_name=run",
            *changed,
            f"custom_reward_function.path={broken}",
            "reward_model.timeout_s=5",
        ],
        tmp_path,
    )
    _clean_failure(proc, "broken reward")
    assert (run / "config.yaml").read_bytes() == before  # was rewritten with lr 0.5 before step 3 had run
    # Every checkpoint says what made it, so the next start compares with the checkpoint it resumes.
    made_2 = yaml.safe_load((run / "checkpoints" / "global_step_2" / "config.yaml").read_text())
    assert made_2["actor"]["optim"]["lr"] == lr

    proc = run_dapo_in_process(["train", *BASE, "trainer.experiment_name=run", *changed], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert yaml.safe_load((run / "config.yaml").read_text())["actor"]["optim"]["lr"] == 0.5
    made_3 = yaml.safe_load((run / "checkpoints" / "global_step_3" / "config.yaml").read_text())
    assert made_3["actor"]["optim"]["lr"] == 0.5
    # Resuming step 3 without the changes is now refused: the checkpoint was made with lr 0.5.
    proc = run_dapo_in_process(
        ["train", *BASE, "trainer.experiment_name=run", "trainer.total_training_steps=4"], tmp_path
    )
    _clean_failure(proc, "the checkpoint to resume", "actor.optim.lr: 0.5 -> ")


def test_full_disk_at_start_up_is_one_message_naming_the_path(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    before = (run / "config.yaml").read_bytes()
    # every write beyond 1 KiB fails with EFBIG in the child, as on a full disk
    proc = run_dapo_warm(
        ["train", *BASE, "trainer.experiment_name=run", "trainer.total_training_steps=3"], tmp_path, fsize_limit=1024
    )
    # config.yaml is written only after the first step; the first write of the run record is its metrics line
    _clean_failure(proc, f"writing the run record {run / 'metrics.jsonl'} failed: file size limit exceeded")
    assert (run / "config.yaml").read_bytes() == before
    assert not [p for p in run.iterdir() if ".tmp-" in p.name]


def test_metrics_write_failure_mid_run_is_one_message_and_leaves_whole_records(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    before = (run / "metrics.jsonl").read_bytes()  # two records of ~2.5 KB; config.yaml is ~2.6 KB
    limit = len(before) + 1000  # the step-3 record gets its first 1000 bytes written, then EFBIG

    # save_freq=2: no checkpoint at step 3, so the metrics append is the first write to hit the limit
    proc = run_dapo_warm(
        [
            "train",
            *BASE,
            "trainer.experiment_name=run",
            "trainer.total_training_steps=4",
            "trainer.save_freq=2",
            "trainer.logger=[jsonl]",
        ],
        tmp_path,
        fsize_limit=limit,
    )
    _clean_failure(proc, f"appending the metrics of step 3 to {run / 'metrics.jsonl'} failed: file size limit")
    assert (run / "metrics.jsonl").read_bytes() == before  # the half-written record is cut off again
    proc = run_dapo_in_process(
        ["train", *BASE, "trainer.experiment_name=run", "trainer.total_training_steps=3"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def _no_dac_override() -> None:
    """In the child: lose root's right to write where the mode bits say no (CAP_DAC_OVERRIDE), so a read-only
    folder is read-only for root too. A non-root user needs nothing."""
    if os.geteuid() == 0 and ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE) failed")


def test_read_only_run_directory_is_one_message_naming_the_path(base_run, tmp_path) -> None:
    run = _copy(base_run, tmp_path)
    config_before = (run / "config.yaml").read_bytes()
    _set_folder_modes(run, 0o555)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"open({str(run / 'probe')!r}, 'w')"],
            capture_output=True,
            preexec_fn=_no_dac_override,
        )
        if probe.returncode == 0:
            pytest.skip("cannot make a folder read-only for this user here (no way to drop CAP_DAC_OVERRIDE)")
        proc = run_dapo_warm(
            ["train", *BASE, "trainer.experiment_name=run", "trainer.total_training_steps=3"],
            tmp_path,
            drop_dac_override=True,
        )
    finally:
        _set_folder_modes(run, 0o755)
    # config.yaml is written only after the first step; the first write of the run record is its metrics
    _clean_failure(proc, f"writing the run record {run / 'metrics.jsonl'} failed: permission denied")
    assert (run / "config.yaml").read_bytes() == config_before
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in base_run.iterdir())


def _set_folder_modes(root: Path, mode: int) -> None:
    for folder, _dirs, _files in os.walk(root):
        os.chmod(folder, mode)


# ---------------------------------------------------------------------------------------------- rewards
ONCE_EACH = """
import os, time
from pathlib import Path

MARKS = Path(__file__).with_name("marks")


def _first_time(name):
    MARKS.mkdir(exist_ok=True)
    try:
        os.mkdir(MARKS / name)  # atomic: exactly one call ever sees it missing
        return True
    except FileExistsError:
        return False


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if _first_time("hang"):
        time.sleep(600)
    if _first_time("exit"):
        os._exit(9)
    if _first_time("raise"):
        raise RuntimeError("a flaky scorer")
    return 1.0 if solution_str.strip().endswith(str(ground_truth)) else -1.0
"""


def test_a_hang_an_exit_and_a_raise_are_bounded_counted_and_survived(tmp_path) -> None:
    fn = tmp_path / "once_each.py"
    fn.write_text(textwrap.dedent(ONCE_EACH))
    proc = run_dapo_in_process(
        [
            "train",
            *BASE,
            "trainer.save_freq=-1",
            f"custom_reward_function.path={fn}",
            "reward_model.num_workers=0",
            "reward_model.timeout_s=2",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "tiny-synth" / "metrics.jsonl").read_text().splitlines()]
    totals = {
        k: sum(r.get(k, 0) for r in records) for k in ("reward/timeouts", "reward/worker_crashes", "reward/errors")
    }
    assert totals == {"reward/timeouts": 1, "reward/worker_crashes": 1, "reward/errors": 1}
    assert "reward timeout for sample" in proc.stderr and "data_source='synth_arith'" in proc.stderr
    assert "exit code 9" in proc.stderr and "a flaky scorer" in proc.stderr


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ('return {"score": -1, "acc": "False"}', ("liar.py:compute_score", "'acc' = str 'False'")),
        ("return 1e39", ("liar.py:compute_score", "beyond float32 range")),
        ("import os; os._exit(3)", ("every call to the custom reward function", "worker_crash", "not the data")),
    ],
)
def test_a_reward_function_that_lies_or_always_dies_stops_the_run_with_its_name(tmp_path, body, needles) -> None:
    fn = tmp_path / "liar.py"
    fn.write_text(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    {body}\n")
    small = ["data.train_batch_size=2", "rollout.n=2"]  # 4 calls: an always-crashing function restarts 4 workers
    proc = run_dapo_in_process(
        ["train", *BASE, *small, f"custom_reward_function.path={fn}", "reward_model.timeout_s=5"], tmp_path
    )
    _clean_failure(proc, *needles)
    assert "all-correct" not in proc.stderr and "all-wrong" not in proc.stderr
