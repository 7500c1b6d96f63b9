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


def save_embedded_checkpoint(ckpt_root: Path, *, lora: bool = False, seed: int = 0) -> Path:
    """A checkpoint of the embedded tiny model as training writes it (``global_step_1`` with ``hf/`` and its
    manifest); ``lora``: a LoRA actor's, whose ``hf/`` holds the adapter and ``hf/merged/`` the merged model."""
    import torch

    from dapo.config import load_config
    from dapo.infra.checkpoint import save_checkpoint
    from dapo.model.loading import load_policy
    from dapo.model.lora import AdapterAndMergedExport, with_lora

    cfg = load_config(None, ["actor_rollout_ref.model.lora_rank=8"] if lora else [])
    torch.manual_seed(seed)
    policy = with_lora(load_policy(cfg.model), cfg.model)
    model = AdapterAndMergedExport(policy.model, policy.tokenizer) if lora else policy.model
    optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=0.1)
    return save_checkpoint(ckpt_root, 1, model=model, tokenizer=policy.tokenizer, optimizer=optimizer,
                           scheduler=None, trainer_state={"step": 1})


def flip_middle_byte(path: Path) -> None:
    """Damage ``path`` without changing its size (what only a checksum notices)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
