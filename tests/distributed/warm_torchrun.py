"""A 2-rank `dapo train` under torch's own elastic agent, without torchrun's ~3 x 8 s of interpreter start-up.

``torchrun`` is ``python -m torch.distributed.run``: it parses its flags into a ``LaunchConfig`` and runs
``elastic_launch(config, entrypoint)``, whose ``LocalElasticAgent`` holds the rendezvous, starts one worker per local
rank with RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT / TORCHELASTIC_* set, watches
them, and stops the others when one fails. :func:`torchrun_warm` runs exactly that: the config comes from torchrun's own
``parse_args`` + ``config_from_args`` (the same flags :func:`torchrun_command` passes, plus ``--start-method=fork``),
and the agent runs in a child forked from :mod:`tests.cli.warm_dapo`'s server (dapo and torch already imported, nothing
ever computed there). The agent forks its ranks -- separate processes, a real gloo group over a real TCPStore -- and
each runs the click command ``python -m dapo.cli.main train ...`` runs. What is not exercised is torchrun's own process
boundary (its CLI, its exec of the interpreter per rank): tests about that keep :func:`torchrun`.

    proc = torchrun_warm(args, run_root)   # as torchrun(args, run_root): CompletedProcess(returncode, stdout, stderr)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli.warm_dapo import WarmDapo, adopt_stdio_and_env, run_cli


def _rank(*args: str) -> None:
    """One worker, forked by the elastic agent: dapo's CLI as ``python -m dapo.cli.main ARGS`` runs it; a non-zero
    exit code leaves the process with that code (the agent sees the failure), a clean end returns to the agent."""
    code = run_cli(list(args))
    if code != 0:
        sys.exit(code)


def _agent(launcher_flags: list[str], cli_args: list[str], out: int, err: int, env: dict) -> None:
    """In the warm child: stdio and environment as ``subprocess`` would set them, then torchrun's ``main`` body with
    :func:`_rank` as the entrypoint. Exits 1 with torchrun's error report when a rank fails."""
    import traceback

    adopt_stdio_and_env(out, err, env)
    import torch.multiprocessing
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    torch.multiprocessing._set_thread_name("pt_elastic")  # as torch.distributed.run.run

    @record  # as torch.distributed.run.main: a failed rank's error is reported, then raised
    def main() -> None:
        config, _, _ = config_from_args(parse_args([*launcher_flags, "dapo"]))
        elastic_launch(config=config, entrypoint=_rank)(*cli_args)

    code = 0
    try:
        main()
    except Exception:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


class _Agent(WarmDapo):
    """A running warm agent: WarmDapo's pipes, wait and communicate, with :func:`_agent` as the child."""

    def __init__(self, launcher_flags: list[str], cli_args: list[str], env: dict) -> None:
        self.args = ["torchrun", *launcher_flags, "-m", "dapo.cli.main", *cli_args]
        self._start(_agent, "torchrun", (launcher_flags, cli_args), (env,))

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:  # the agent and its ranks, all killed (ranks would outlive the agent)
            for pid in [*_descendants(self.pid), self.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.process.join()
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.process.exitcode


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            children = []
        found += children
        todo += children
    return found


def start_torchrun_warm(args: list[str], run_root: Path, *, nproc: int = 2,
                        rdzv: list[str] | None = None) -> _Agent:
    """Start the warm agent of :func:`torchrun_warm` and return its handle (several at once: the nodes of a c10d
    rendezvous)."""
    from tests.distributed.test_train_torchrun import TORCHRUN_ENV, torchrun_command

    cmd = torchrun_command(args, run_root, nproc=nproc, rdzv=rdzv)
    split = cmd.index("-m", 3)  # [python, -m, torch.distributed.run, FLAGS..., -m, dapo.cli.main, train, ...]
    flags, cli_args = cmd[3:split], cmd[split + 2:]
    return _Agent([*flags, "--start-method=fork"], cli_args, dict(TORCHRUN_ENV))


def torchrun_warm(args: list[str], run_root: Path, *, nproc: int = 2, rdzv: list[str] | None = None,
                  timeout: float = 240) -> subprocess.CompletedProcess:
    """:func:`tests.distributed.test_train_torchrun.torchrun` with the agent and its ranks forked warm: the same
    launcher flags, environment (``TORCHRUN_ENV``), command, exit code, stdout and stderr."""
    agent = start_torchrun_warm(args, run_root, nproc=nproc, rdzv=rdzv)
    out, err = agent.communicate(timeout)
    return subprocess.CompletedProcess(agent.args, agent.process.exitcode, out, err)
