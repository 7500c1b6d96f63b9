"""Every way the tests run `dapo`, in one place: which to use when, and why.

=====================  ==========================================  ==============  ===================================
runner                 what runs                                   start-up        use it when
=====================  ==========================================  ==============  ===================================
run_dapo               ``python -m dapo.cli.main ARGS``: a fresh   ~8-10 s of      the user's own entry point, or what
                       interpreter (``subprocess.run``)            imports         only a fresh interpreter shows
                                                                                   (environment read at start, as
                                                                                   OpenMP's; ``preexec_fn``; a
                                                                                   bit-identical reference run)
run_dapo_in_process    dapo's click group in this pytest process   none            the command ends at start-up (a
                       (``CliRunner``)                                             refusal, ``--print-config``) or
                                                                                   trains a step or two, and nothing
                                                                                   about the process is tested
run_dapo_warm,         a real child forked from a server that      the server's    a separate process is needed
WarmDapo               imported dapo once (a forkserver)           one start       (SIGKILL mid-write, an rlimit, a
                                                                   (prestart),     dropped capability, its own pid or
                                                                   then ~0         process group, pipes read while it
                                                                                   runs), not a fresh interpreter
kill_after_checkpoint  a WarmDapo in a session of its own,         as warm         kill-and-resume tests
                       SIGKILLed with its workers once a
                       checkpoint is complete
torchrun,              ``python -m torch.distributed.run ... -m    ~3 x 8 s        torchrun's own process boundary
torchrun_command       dapo.cli.main train ARGS``                                  (its CLI, one interpreter per rank,
                       (``TORCHRUN_ENV``)                                          a job ``Popen``-ed and killed)
torchrun_warm,         torch's elastic agent forked warm, forking  as warm         multi-rank behaviour of `dapo
start_torchrun_warm    its ranks (a real gloo group over a real                    train` (rendezvous, data
                       TCPStore)                                                   parallelism, a failing rank ending
                                                                                   the job)
=====================  ==========================================  ==============  ===================================

Every runner answers like ``subprocess.run(capture_output=True, text=True)``: a ``CompletedProcess`` with the
command's exit code (-9 after SIGKILL), stdout and stderr; a ``train`` command gets
``trainer.default_local_dir=RUN_ROOT`` appended. Prefer the cheapest row that still tests what the test is about.
A few tests hold a fresh interpreter's handle while it runs (``subprocess.Popen`` of ``torchrun_command`` with
``TORCHRUN_ENV``, or of ``python -m dapo.cli.main`` in tests/faults/test_async_faults.py and
tests/serve/test_serve_process.py), to signal it or read its output live: that is :func:`run_dapo` unrolled.

Warm children: a multiprocessing *forkserver* imports dapo's CLI and the training stack once (torch, transformers: the
import cost every `python -m dapo.cli.main` pays), computes nothing, and forks a fresh child for each command. The
child is a real, separate process -- its own pid, its own rlimits and capabilities, SIGKILL kills it mid-write, its
stdout and stderr are pipes the caller reads -- that runs the same click command `python -m dapo.cli.main ARGS` runs,
from a state no command has touched (the server never ran one). What a warm child does not repeat is the interpreter
start and the imports, so a test that needs a *fresh interpreter* (the user's `dapo` entry point itself) keeps
:func:`run_dapo`. The server never computes with torch before it forks, so no OpenMP or intra-op thread pool exists to
be inherited broken (GNU OpenMP is not fork-safe once it has started threads).

Warm torchrun: ``torchrun`` is ``python -m torch.distributed.run``: it parses its flags into a ``LaunchConfig`` and
runs ``elastic_launch(config, entrypoint)``, whose ``LocalElasticAgent`` holds the rendezvous, starts one worker per
local rank with RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT / TORCHELASTIC_* set,
watches them, and stops the others when one fails. :func:`torchrun_warm` runs exactly that: the config comes from
torchrun's own ``parse_args`` + ``config_from_args`` (the same flags :func:`torchrun_command` passes, plus
``--start-method=fork``), and the agent runs in a child forked from the warm server. The agent forks its ranks and
each runs the click command ``python -m dapo.cli.main train ...`` runs. What is not exercised is torchrun's own process
boundary (its CLI, its exec of the interpreter per rank): tests about that keep :func:`torchrun`.

    proc = run_dapo(["train", *FAST], run_root)                 # FAST: tests.cli.cli_helpers
    proc = run_dapo_warm(["train", *FAST], run_root)            # the same answer, no interpreter start
    child = WarmDapo(["train", ...], run_root); child.kill()    # a handle, for kills at a chosen moment
    child = WarmDapo(["train", ...], run_root, before=hook)    # hook() patches the run first: a fault at a point
    proc = torchrun_warm(args, run_root)                        # as torchrun(args, run_root)
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing import reduction
from pathlib import Path

from tests.harness.ports import free_port

# What every `dapo train` imports before it trains (its own lazy imports included): paid once, in the server. The
# embedded tiny model is a Qwen2: its modeling module alone (transformers' generation stack) is ~3 s of imports.
PRELOAD = [
    "dapo.cli.main",
    "dapo.training.loop",
    "dapo.infra.plot",
    "dapo.rollout.hf_engine",
    "safetensors.torch",
    "transformers.models.auto.modeling_auto",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen2.tokenization_qwen2",
    "tests.harness.runners",
]
# The environment run_dapo gives its processes; the server starts with it too, as OpenMP reads it when torch loads.
BASE_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def with_run_root(args: list[str], run_root: Path | None) -> list[str]:
    """``args``, with ``trainer.default_local_dir=RUN_ROOT`` appended to a ``train`` command (its runs go there)."""
    cmd = list(args)
    if run_root is not None and args and args[0] == "train":
        cmd += [f"trainer.default_local_dir={run_root}"]
    return cmd


def run_dapo(
    args: list[str], run_root: Path, *, timeout: float = 300, extra_env: dict | None = None, preexec_fn=None
) -> subprocess.CompletedProcess:
    """``python -m dapo.cli.main ARGS`` in a fresh interpreter, to its end."""
    env = {**os.environ, **BASE_ENV, **(extra_env or {})}
    cmd = [sys.executable, "-m", "dapo.cli.main", *with_run_root(args, run_root)]
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

    cmd = with_run_root(args, run_root)

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


TORCHRUN_ENV = {**os.environ, **BASE_ENV}


def torchrun_command(args: list[str], run_root: Path, *, nproc: int = 2, rdzv: list[str] | None = None) -> list[str]:
    """``torchrun ... -m dapo.cli.main train ARGS`` (on loopback unless ``rdzv`` says how to meet), to run with
    ``TORCHRUN_ENV``."""
    meet = rdzv or ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        *meet,
        "-m",
        "dapo.cli.main",
        "train",
        *args,
        f"trainer.default_local_dir={run_root}",
    ]


def torchrun(
    args: list[str], run_root: Path, *, nproc: int = 2, rdzv: list[str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Run :func:`torchrun_command` to its end."""
    return subprocess.run(
        torchrun_command(args, run_root, nproc=nproc, rdzv=rdzv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=TORCHRUN_ENV,
    )


# ------------------------------------------------------------------------------------------------ warm children

_ctx = None
_ctx_lock = threading.Lock()


def _context():
    """The forkserver context, its server started (once per process) with the command environment."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            saved = {k: os.environ.get(k) for k in BASE_ENV}
            os.environ.update(BASE_ENV)
            try:
                from multiprocessing import forkserver

                forkserver.ensure_running()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            _ctx = ctx
        return _ctx


def prestart() -> None:
    """Start the server now: it imports while the caller does other work (a cold reference run, say)."""
    _context()


class _Fd:
    """A file descriptor handed to the child: the forkserver passes it over its socket (SCM_RIGHTS)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _child(
    args: list[str],
    out: int,
    err: int,
    env: dict,
    fsize_limit: int | None,
    drop_dac_override: bool,
    new_session: bool = False,
    before: Callable[[], None] | None = None,
    cwd: Path | None = None,
) -> None:
    """In the forked child: stdio, environment, working directory and limits as ``subprocess`` would set them,
    ``before`` (the test's hook), then the CLI."""
    if cwd is not None:
        os.chdir(cwd)
    if new_session:  # as Popen(start_new_session=True): its own process group, for os.killpg of it and its workers
        os.setsid()
    adopt_stdio_and_env(out, err, env)
    if drop_dac_override and os.geteuid() == 0:  # root loses the right to write past the mode bits
        _drop_cap_dac_override()
    if fsize_limit is not None:  # every write past the limit fails with EFBIG, as on a full disk
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
    if before is not None:
        before()
    sys.exit(run_cli(args))


def adopt_stdio_and_env(out: int, err: int, env: dict) -> None:
    """In a forked child: ``out`` / ``err`` become file descriptors 1 and 2 and ``env`` the whole environment, as
    ``subprocess`` sets them for a new process."""
    for fd, target in ((out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)


def run_cli(args: list[str]) -> int:
    """dapo's click command as ``python -m dapo.cli.main ARGS`` runs it, to its end; returns its exit code."""
    from dapo.cli.main import cli

    sys.argv = [sys.executable, *args]
    code = 0
    try:
        cli.main(args=list(args), prog_name="dapo")
    except SystemExit as exc:  # click's standalone mode ends every command here, as `python -m` would
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
    finally:
        atexit._run_exitfuncs()  # what interpreter exit runs (logging flush, pools' finalizers)
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _drop_cap_dac_override() -> None:
    """CAP_DAC_OVERRIDE out of this process's effective and permitted sets (capset: no exec follows that would
    recompute them from the bounding set) and out of its bounding set (for what it executes)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    bit = 1 << 1  # CAP_DAC_OVERRIDE
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    data[0].effective &= ~bit
    data[0].permitted &= ~bit
    if libc.capset(ctypes.byref(header), data) != 0 or libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "dropping CAP_DAC_OVERRIDE failed")


class WarmDapo:
    """A running `dapo ARGS` forked from the warm server. ``stdout`` / ``stderr``: its pipes' read ends (text)."""

    def __init__(
        self,
        args: list[str],
        run_root: Path | None = None,
        *,
        extra_env: dict | None = None,
        fsize_limit: int | None = None,
        drop_dac_override: bool = False,
        stderr_to_devnull: bool = False,
        new_session: bool = False,
        before: Callable[[], None] | None = None,
        cwd: Path | None = None,
    ):
        """``cwd``: the child's working directory (relative paths in ``args`` are read from there). ``before``: a
        test's fault hook, a module-level function the child calls before the CLI (it may patch what the run calls,
        e.g. to kill the process at a chosen point); no environment variable or config key reaches the code under
        test."""
        cmd = with_run_root(args, run_root)
        self.args = cmd
        env = {**os.environ, **BASE_ENV, **(extra_env or {})}
        self._start(
            _child,
            "dapo",
            (cmd,),
            (env, fsize_limit, drop_dac_override, new_session, before, cwd),
            stderr_to_devnull=stderr_to_devnull,
        )

    def _start(self, target, name: str, head: tuple, tail: tuple, *, stderr_to_devnull: bool = False) -> None:
        """Fork ``target(*head, out_fd, err_fd, *tail)`` from the warm server, its stdout and stderr pipes to us."""
        out_r, out_w = os.pipe()
        if stderr_to_devnull:
            err_r, err_w = None, os.open(os.devnull, os.O_WRONLY)
        else:
            err_r, err_w = os.pipe()
        self.process = _context().Process(target=target, args=(*head, _Fd(out_w), _Fd(err_w), *tail), name=name)
        try:
            self.process.start()
        finally:
            os.close(out_w)
            os.close(err_w)
        self.pid = self.process.pid
        self.stdout = os.fdopen(out_r, "r", errors="replace")
        self.stderr = os.fdopen(err_r, "r", errors="replace") if err_r is not None else None

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode  # -N after signal N, as subprocess says it

    def poll(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        if self.process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read both pipes to their end (as subprocess.communicate: neither can fill and block the child)."""
        chunks: dict[str, str] = {}

        def read(name, stream):
            chunks[name] = stream.read() if stream is not None else ""

        readers = [
            threading.Thread(target=read, args=(name, stream), daemon=True)
            for name, stream in (("out", self.stdout), ("err", self.stderr))
        ]
        for t in readers:
            t.start()
        self.wait(timeout)
        for t in readers:
            t.join()
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return chunks["out"], chunks["err"]


def run_dapo_warm(
    args: list[str],
    run_root: Path,
    *,
    timeout: float = 300,
    extra_env: dict | None = None,
    fsize_limit: int | None = None,
    drop_dac_override: bool = False,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """:func:`run_dapo` in a warm child: the same command, exit code (-9 after SIGKILL), stdout
    and stderr."""
    child = WarmDapo(
        args, run_root, extra_env=extra_env, fsize_limit=fsize_limit, drop_dac_override=drop_dac_override, cwd=cwd
    )
    out, err = child.communicate(timeout)
    return subprocess.CompletedProcess(["dapo", *child.args], child.process.exitcode, out, err)


def kill_after_checkpoint(
    args: list[str], checkpoint: Path, run_root: Path | None = None, *, timeout: float = 600
) -> None:
    """Start ``dapo ARGS`` (a warm child in a session of its own) and SIGKILL its whole process group -- the trainer
    and whatever it started: rollout worker, reward workers -- as soon as ``checkpoint`` is complete, while later
    steps still run (the machine or the job dies). Both pipes are drained meanwhile (a full pipe would stall the run);
    a run that ends before it can be killed fails with its stderr."""
    import time

    from dapo.infra.checkpoint import find_latest_checkpoint, is_complete_checkpoint

    proc = WarmDapo(args, run_root, new_session=True)
    err: list[str] = []
    drains = [
        threading.Thread(target=proc.stdout.read, daemon=True),
        threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),
    ]
    for drain in drains:
        drain.start()
    deadline = time.monotonic() + timeout
    while not is_complete_checkpoint(checkpoint) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        drains[1].join()
        raise AssertionError(f"the run ended before it could be killed: {''.join(err)[-3000:]!r}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for drain in drains:
        drain.join()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.poll() == -signal.SIGKILL
    assert find_latest_checkpoint(checkpoint.parent).name == checkpoint.name


# ------------------------------------------------------------------------------------------------ warm torchrun


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


def start_torchrun_warm(args: list[str], run_root: Path, *, nproc: int = 2, rdzv: list[str] | None = None) -> _Agent:
    """Start the warm agent of :func:`torchrun_warm` and return its handle (several at once: the nodes of a c10d
    rendezvous)."""
    cmd = torchrun_command(args, run_root, nproc=nproc, rdzv=rdzv)
    split = cmd.index("-m", 3)  # [python, -m, torch.distributed.run, FLAGS..., -m, dapo.cli.main, train, ...]
    flags, cli_args = cmd[3:split], cmd[split + 2 :]
    return _Agent([*flags, "--start-method=fork"], cli_args, dict(TORCHRUN_ENV))


def torchrun_warm(
    args: list[str], run_root: Path, *, nproc: int = 2, rdzv: list[str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """:func:`torchrun` with the agent and its ranks forked warm: the same
    launcher flags, environment (``TORCHRUN_ENV``), command, exit code, stdout and stderr."""
    agent = start_torchrun_warm(args, run_root, nproc=nproc, rdzv=rdzv)
    out, err = agent.communicate(timeout)
    return subprocess.CompletedProcess(agent.args, agent.process.exitcode, out, err)
