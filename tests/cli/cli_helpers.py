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



def run_dapo_in_process(args: list[str], run_root: Path) -> subprocess.CompletedProcess:
    """The same command as :func:`run_dapo`, run by the CLI's click group inside this pytest process, where torch and
    transformers are already imported: no ~10 s interpreter start-up. For runs that end at start-up or train a step or
    two; what needs a real process (a kill, rlimits, capabilities, bit-identical references) stays on ``run_dapo``.

    The answer reads like a subprocess's: ``returncode`` is the CLI's exit code, ``stderr`` holds what the command
    wrote there plus its log records (as the CLI's ``logging.basicConfig`` would print them) and whatever reached file
    descriptor 2 meanwhile (its worker processes), and an exception the CLI did not turn into a clean message is
    appended as a ``Traceback`` -- the text a real process would have shown.
    """
    import logging
    import tempfile
    import traceback

    from click.testing import CliRunner

    from dapo.cli.main import cli

    cmd = list(args)
    if args and args[0] == "train":
        cmd += [f"trainer.default_local_dir={run_root}"]

    class _ToCurrentStderr(logging.Handler):  # CliRunner swaps sys.stderr during invoke: write where it points then
        def emit(self, record: logging.LogRecord) -> None:
            sys.stderr.write(self.format(record) + "\n")

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    handler = _ToCurrentStderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    env_before = dict(os.environ)
    # What bypasses sys.stderr -- a spawned reward worker's output, C-level warnings -- goes to file descriptor 2, as
    # it would in the user's terminal: it is read from there too.
    fd2 = tempfile.TemporaryFile()
    sys.stderr.flush()
    saved_fd2 = os.dup(2)
    os.dup2(fd2.fileno(), 2)
    try:
        result = CliRunner().invoke(cli, cmd, env={"TOKENIZERS_PARALLELISM": "false"})
    finally:
        os.dup2(saved_fd2, 2)
        os.close(saved_fd2)
        root.handlers[:] = handlers  # also drops what the command's logging.basicConfig may have added
        root.setLevel(level)
        os.environ.clear()
        os.environ.update(env_before)
    with fd2:
        fd2.seek(0)
        stderr = result.stderr + fd2.read().decode(errors="replace")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["dapo", *cmd], result.exit_code, result.stdout, stderr)
