"""Checkpoint -> kill -> resume ends with exactly the parameters of an uninterrupted run (CPU, fixed threads).

All three runs are real processes forked from a warm server (tests/harness/runners.py: the same command as `python -m
dapo.cli.main`, SIGKILLed for real, without ~8 s of imports each); tests/faults/test_soak.py compares warm resumed runs
with a fresh interpreter's."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from tests.harness.runners import kill_after_checkpoint, run_dapo_warm

STEPS = [
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
]


def _final_weights(run_dir):
    return load_file(run_dir / "checkpoints" / "global_step_4" / "hf" / "model.safetensors")


def test_kill_then_resume_equals_uninterrupted(tmp_path, fast_args):
    args = ["train", *fast_args, *STEPS]
    straight = run_dapo_warm([*args, "trainer.experiment_name=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]

    # A real run, killed with SIGKILL once its step-2 checkpoint is complete (mid step 3).
    run_dir = tmp_path / "killed"
    kill_after_checkpoint(
        [*args, "trainer.experiment_name=killed"], run_dir / "checkpoints" / "global_step_2", tmp_path, timeout=300
    )

    resumed = run_dapo_warm([*args, "trainer.experiment_name=killed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert "done: 2 steps (resumed at step 2, now at step 4)" in resumed.stdout  # was "done: 4 steps"
    a, b = _final_weights(tmp_path / "straight"), _final_weights(run_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    steps = [
        int(line.split('"step": ')[1].split(",")[0].rstrip("}"))
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == sorted(set(steps)), "a resumed run must not duplicate metric steps"
