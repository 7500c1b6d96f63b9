"""Helpers to run the real `dapo` CLI in a subprocess, the way a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# A few-step DAPO run on the embedded tiny model: every stage of Algorithm 1 runs, in seconds.
FAST = [
    "trainer.total_training_steps=2",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=2",
    "rollout.n=4",
    "data.synth.num_train=64",
    "data.synth.num_val=8",
    "rollout.val_kwargs.n=2",
    "trainer.test_freq=2",
    "trainer.num_threads=1",
    "algorithm.filter_groups.on_exhausted=train_on_partial",
]


def run_dapo(args: list[str], run_root: Path, *, timeout: float = 300, extra_env: dict | None = None,
             preexec_fn=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "dapo.cli.main", *args]
    if args and args[0] == "train":
        cmd += [f"trainer.default_local_dir={run_root}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=preexec_fn)

