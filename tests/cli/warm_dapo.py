"""Real `dapo` processes without the ~8 s interpreter start-up each: forked from a warm server process.

A multiprocessing *forkserver* imports dapo's CLI and the training stack once (torch, transformers: the import cost
every `python -m dapo.cli.main` pays), computes nothing, and forks a fresh child for each command. The child is a real,
separate process -- its own pid, its own rlimits and capabilities, SIGKILL kills it mid-write, its stdout and stderr are
pipes the caller reads -- that runs the same click command `python -m dapo.cli.main ARGS` runs, from a state no
command has touched (the server never ran one). What a warm child does not repeat is the interpreter start and the
imports, so a test that needs a *fresh interpreter* (the user's `dapo` entry point itself) keeps ``run_dapo``.

The server never computes with torch before it forks, so no OpenMP or intra-op thread pool exists to be inherited
broken (GNU OpenMP is not fork-safe once it has started threads).

    proc = run_dapo_warm(["train", *FAST], run_root)            # like run_dapo: a CompletedProcess
    child = WarmDapo(["train", ...], run_root); child.kill()    # a handle, for kills at a chosen moment
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing import reduction
from pathlib import Path

# What every `dapo train` imports before it trains (its own lazy imports included): paid once, in the server. The
# embedded tiny model is a Qwen2: its modeling module alone (transformers' generation stack) is ~3 s of imports.
PRELOAD = ["dapo.cli.main", "dapo.training.loop", "dapo.infra.plot", "dapo.rollout.hf_engine", "safetensors.torch",
           "transformers.models.auto.modeling_auto", "transformers.models.qwen2.modeling_qwen2",
           "transformers.models.qwen2.tokenization_qwen2", "tests.cli.warm_dapo"]
# The environment run_dapo gives its processes; the server starts with it too, as OpenMP reads it when torch loads.
BASE_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

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


def _child(args: list[str], out: int, err: int, env: dict, fsize_limit: int | None, drop_dac_override: bool,
           new_session: bool = False) -> None:
    """In the forked child: stdio, environment and limits as ``subprocess`` would set them, then the CLI."""
    import signal

    if new_session:  # as Popen(start_new_session=True): its own process group, for os.killpg of it and its workers
        os.setsid()
    adopt_stdio_and_env(out, err, env)
    if drop_dac_override and os.geteuid() == 0:  # root loses the right to write past the mode bits
        _drop_cap_dac_override()
    if fsize_limit is not None:  # every write past the limit fails with EFBIG, as on a full disk
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
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

    def __init__(self, args: list[str], run_root: Path | None = None, *, extra_env: dict | None = None,
                 fsize_limit: int | None = None, drop_dac_override: bool = False, stderr_to_devnull: bool = False,
                 new_session: bool = False):
        cmd = list(args)
        if run_root is not None and args and args[0] == "train":
            cmd += [f"trainer.default_local_dir={run_root}"]
        self.args = cmd
        env = {**os.environ, **BASE_ENV, **(extra_env or {})}
        self._start(_child, "dapo", (cmd,), (env, fsize_limit, drop_dac_override, new_session),
                    stderr_to_devnull=stderr_to_devnull)

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

        readers = [threading.Thread(target=read, args=(name, stream), daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr))]
        for t in readers:
            t.start()
        self.wait(timeout)
        for t in readers:
            t.join()
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return chunks["out"], chunks["err"]


def run_dapo_warm(args: list[str], run_root: Path, *, timeout: float = 300, extra_env: dict | None = None,
                  fsize_limit: int | None = None, drop_dac_override: bool = False) -> subprocess.CompletedProcess:
    """:func:`tests.cli.cli_helpers.run_dapo` in a warm child: the same command, exit code (-9 after SIGKILL), stdout
    and stderr."""
    child = WarmDapo(args, run_root, extra_env=extra_env, fsize_limit=fsize_limit,
                     drop_dac_override=drop_dac_override)
    out, err = child.communicate(timeout)
    return subprocess.CompletedProcess(["dapo", *child.args], child.process.exitcode, out, err)


def kill_after_checkpoint(args: list[str], checkpoint: Path, run_root: Path | None = None, *,
                          timeout: float = 600) -> None:
    """Start ``dapo ARGS`` (a warm child in a session of its own) and SIGKILL its whole process group -- the trainer
    and whatever it started: rollout worker, reward workers -- as soon as ``checkpoint`` is complete, while later
    steps still run (the machine or the job dies). Both pipes are drained meanwhile (a full pipe would stall the run);
    a run that ends before it can be killed fails with its stderr."""
    import signal
    import time

    from dapo.infra.checkpoint import find_latest_checkpoint, is_complete_checkpoint

    proc = WarmDapo(args, run_root, new_session=True)
    err: list[str] = []
    drains = [threading.Thread(target=proc.stdout.read, daemon=True),
              threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)]
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
