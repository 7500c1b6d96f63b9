"""A sandboxed Python interpreter: each call runs the code in a fresh process behind an isolation boundary.

Two isolation modes (docs/tools.md lists exactly what each stops):

* ``bwrap`` (strong): bubblewrap puts the process in new PID, network, IPC, UTS and mount namespaces whose file
  system holds only the interpreter and the system libraries, read-only, plus an empty size-limited tmpfs as its
  working directory; there is no network device but a private loopback. As root the code then runs as an unprivileged
  uid of its own with no capabilities; as another user bubblewrap adds a user namespace.
* ``process`` (weaker, for hosts without bubblewrap or user namespaces): a child process in its own session with a
  private temporary directory, and a Python audit hook that refuses files outside it, sockets, signals, new processes
  and ctypes. It stops accidents and the obvious hostile calls, not a determined escape; it runs only when asked for
  by name (``mode="process"``); ``mode="auto"`` refuses, naming what to install, when bubblewrap cannot run.

Both apply the same resource limits (rlimits set by the launcher before the code runs: CPU time, address space, file
size, open files, processes) and the same wall-clock limit and output cap enforced from outside: on either, the whole
process group (and in ``bwrap`` mode the PID namespace) is killed. Whatever the code does, :meth:`PythonSandbox.run`
returns a :class:`ToolResult` whose ``category`` says how it ended; it never raises because of the code.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dapo.tools import launcher

IsolationMode = Literal["auto", "bwrap", "process"]
ISOLATION_MODES: tuple[str, ...] = ("auto", "bwrap", "process")

# How a call ended; "ok" is the only success. A `tool/errors/<category>` metric counts each of the others.
TOOL_CATEGORIES: tuple[str, ...] = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox")

LAUNCHER_SOURCE = Path(launcher.__file__).read_text(encoding="utf-8")
_SANDBOX_WORKDIR = "/work"  # the code's working directory inside the bwrap file system


class SandboxUnavailableError(RuntimeError):
    """The requested isolation cannot run on this host; the message says what to install or change."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. Every limit is checked on construction.

    wall_time_s: wall-clock limit; the process group (namespace) is killed when it passes.
    cpu_time_s: CPU-time limit (RLIMIT_CPU, whole seconds, rounded up); SIGXCPU then SIGKILL.
    memory_bytes: address-space limit (RLIMIT_AS); an allocation beyond it raises MemoryError in the code.
    max_output_bytes: stdout + stderr kept; a call that writes more is killed and reported as "output_limit".
    max_processes: processes (and threads) the code's user may run (RLIMIT_NPROC); applied where it binds: a root
        launcher's own uid (both modes) or a user namespace (bwrap as non-root). Elsewhere ``process`` mode refuses
        to create processes at all.
    disk_bytes: the bwrap working directory's tmpfs size, and the largest file any mode may write (RLIMIT_FSIZE).
    open_files: RLIMIT_NOFILE.
    """

    wall_time_s: float = 5.0
    cpu_time_s: float = 5.0
    memory_bytes: int = 512 * 2**20
    max_output_bytes: int = 64 * 1024
    max_processes: int = 16
    disk_bytes: int = 16 * 2**20
    open_files: int = 64

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"SandboxLimits.{name} must be a number of seconds in (0, 3600], got {value!r}")
        for name, low in (("memory_bytes", 64 * 2**20), ("max_output_bytes", 1), ("max_processes", 1),
                          ("disk_bytes", 4096), ("open_files", 16)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SandboxLimits.{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class ToolResult:
    """How one call ended.

    output: stdout and stderr as the code wrote them (interleaved), decoded as UTF-8 (bad bytes replaced), at most
        ``max_output_bytes``; for a failure it ends with the reason (a traceback, or what the sandbox stopped).
    category: one of :data:`TOOL_CATEGORIES`.
    exit_code: the process's status (negative: the signal that ended it), None when it never started.
    wall_s: seconds from start to end (including the sandbox's start-up).
    """

    output: str
    category: str
    exit_code: int | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.category == "ok"


class PythonSandbox:
    """Runs Python source in a fresh sandboxed interpreter per call; thread-safe, calls may run in parallel.

    Args:
        limits: what each call may use.
        mode: ``bwrap``, ``process``, or ``auto`` (bwrap, else :class:`SandboxUnavailableError` naming the fix).
        python: the interpreter to run (default: this one); its installation is visible read-only to the code.
    """

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, mode: IsolationMode = "auto",
                 python: str | None = None) -> None:
        if mode not in ISOLATION_MODES:
            raise ValueError(f"sandbox mode must be one of {ISOLATION_MODES}, got {mode!r}")
        self.limits = limits
        self.python = python or sys.executable
        self._is_root = os.geteuid() == 0
        self._uid_lock = threading.Lock()
        self._next_uid = 0
        if mode == "process":
            self.mode = "process"
            return
        problem = bwrap_problem(self.python)
        if problem is not None:
            raise SandboxUnavailableError(
                f"tool sandbox: bubblewrap cannot isolate code here ({problem}). Install it (Debian/Ubuntu: "
                "apt-get install bubblewrap) on a host that allows user namespaces, or accept the weaker "
                "process-only isolation explicitly with mode=process (docs/tools.md says what it does not stop)")
        self.mode = "bwrap"

    # --- running -------------------------------------------------------------------------------------------------

    def run(self, code: str) -> ToolResult:
        """Run ``code`` (Python source) to the end or to a limit; never raises because of what the code does."""
        start = time.monotonic()
        workdir = None
        try:
            uid = self._sandbox_uid()
            if self.mode == "bwrap":
                argv, cwd = self._bwrap_argv(), None
                header_workdir = _SANDBOX_WORKDIR
            else:
                workdir = tempfile.mkdtemp(prefix="dapo-tool-")
                if uid is not None:
                    os.chown(workdir, uid, uid)
                argv, cwd, header_workdir = [self.python, "-I", "-c", LAUNCHER_SOURCE], workdir, workdir
            header = {
                "cpu_time_s": max(1, int(-(-self.limits.cpu_time_s // 1))),
                "memory_bytes": self.limits.memory_bytes,
                "file_size_bytes": self.limits.disk_bytes,
                "open_files": self.limits.open_files,
                "nproc": self.limits.max_processes if uid is not None or self.mode == "bwrap" else None,
                "uid": uid,
                "audit": self.mode == "process",
                "workdir": header_workdir,
                "read_roots": sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(self.python))}),
            }
            # Two pipes the code's exit status and output cannot stand in for: the launcher's outcome record, and
            # (bwrap) bubblewrap's own --json-status-fd, which it closes before the code starts and which holds an
            # "exit-code" record only when its set-up finished and the code ran.
            status_r, status_w = os.pipe()
            pipes = [status_r, status_w]
            header["status_fd"] = status_w
            pass_fds = [status_w]
            bwrap_r = None
            if self.mode == "bwrap":
                bwrap_r, bwrap_w = os.pipe()
                pipes += [bwrap_r, bwrap_w]
                pass_fds.append(bwrap_w)
                argv = argv[:1] + ["--json-status-fd", str(bwrap_w)] + argv[1:]
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, cwd=cwd, env=_clean_env(header_workdir),
                                        start_new_session=True, close_fds=True, pass_fds=pass_fds)
            except OSError as exc:
                return ToolResult(f"sandbox: could not start the interpreter: {exc}", "sandbox", None,
                                  time.monotonic() - start)
            finally:
                for fd in pass_fds:  # the parent keeps only the read ends: EOF once the child side has gone
                    os.close(fd)
                    pipes.remove(fd)
            return self._supervise(proc, json.dumps(header).encode() + b"\n" + code.encode("utf-8", "replace"),
                                   start, status_r, bwrap_r)
        finally:
            for fd in pipes if "pipes" in locals() else ():
                os.close(fd)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def run_many(self, codes: Sequence[str], max_workers: int = 4) -> list[ToolResult]:
        """Run several codes in parallel (at most ``max_workers`` processes at once); results in input order."""
        if not codes:
            return []
        if len(codes) == 1 or max_workers <= 1:
            return [self.run(code) for code in codes]
        with ThreadPoolExecutor(max_workers=min(max_workers, len(codes)), thread_name_prefix="dapo-tool") as pool:
            return list(pool.map(self.run, codes))

    def _supervise(self, proc: subprocess.Popen, stdin_bytes: bytes, start: float, status_fd: int,
                   bwrap_fd: int | None) -> ToolResult:
        """Feed the code, collect output up to the cap, and kill the group at the wall limit or the cap."""
        limits = self.limits
        deadline = start + limits.wall_time_s
        try:
            proc.stdin.write(stdin_bytes)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the child is already gone; its status says why
        chunks: list[bytes] = []
        size, reason = 0, None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    reason = "timeout"
                    break
                if not selector.select(timeout=remaining):
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    break  # every writer closed the pipe: the code has ended (or closed its output)
                chunks.append(data)
                size += len(data)
                if size > limits.max_output_bytes:
                    reason = "output_limit"
                    break
        if reason is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                reason = "timeout"
        if reason is not None:
            _kill_group(proc)
        proc.stdout.close()
        wall = time.monotonic() - start
        output = b"".join(chunks)[: limits.max_output_bytes].decode("utf-8", errors="replace")
        status = proc.returncode
        if reason == "timeout":
            return ToolResult(output + f"\nTimeoutError: the code ran past the {limits.wall_time_s:g} s wall-clock "
                              "limit and was killed", "timeout", status, wall)
        if reason == "output_limit":
            return ToolResult(output + f"\n[output cut at {limits.max_output_bytes} bytes; the code was killed]",
                              "output_limit", status, wall)
        outcomes = [r.get("outcome") for r in _json_records(status_fd)]
        code_ran = bwrap_fd is None or any("exit-code" in r for r in _json_records(bwrap_fd))
        return ToolResult(*self._classify(output, status, outcomes, code_ran), status, wall)

    def _classify(self, output: str, status: int, outcomes: list, code_ran: bool) -> tuple[str, str]:
        """The category from what the code cannot forge: bubblewrap's own record of whether the code started, and
        the launcher's outcome record; the exit status only tells the code's own exit or a signal."""
        if not code_ran:  # bubblewrap's set-up failed (its message, "bwrap: ...", is the output)
            return output, "sandbox"
        if "memory" in outcomes:
            return output, "memory"
        if "exception" in outcomes:
            return output, "error"
        if status == 0:
            return output, "ok"
        signum = -status if status < 0 else status - 128 if self.mode == "bwrap" and status > 128 else None
        if signum == signal.SIGXCPU:
            return output + f"\nTimeoutError: the code used its {self.limits.cpu_time_s:g} s of CPU time", "timeout"
        if signum is not None and 0 < signum < signal.NSIG:
            return output + f"\nthe code's process was killed by signal {signal.Signals(signum).name}", "killed"
        return output + f"\nSystemExit: the code exited with status {status}", "error"

    # --- isolation -----------------------------------------------------------------------------------------------

    def _sandbox_uid(self) -> int | None:
        """A root parent runs each call as an unprivileged uid of its own (RLIMIT_NPROC binds it, root is exempt);
        a non-root parent keeps its uid (bwrap maps it into a user namespace)."""
        if not self._is_root or self.mode != "bwrap":
            return None
        with self._uid_lock:
            self._next_uid = (self._next_uid + 1) % 50_000
            return 200_000 + (os.getpid() % 20) * 50_000 + self._next_uid

    def _bwrap_argv(self) -> list[str]:
        return bwrap_argv(self.python, self.limits.disk_bytes, as_root=self._is_root) + [
            self.python, "-I", "-c", LAUNCHER_SOURCE]


def bwrap_argv(python: str, disk_bytes: int, *, as_root: bool) -> list[str]:
    """bubblewrap's arguments: new namespaces, a read-only view of the interpreter and system libraries, a private
    tmpfs working directory, and nothing else (no /etc, /home, /root, /tmp, /sys, host /dev nor host network)."""
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox"]
    if as_root:  # no user namespace (its uid 0 would be exempt from RLIMIT_NPROC): the launcher drops to a plain uid
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for prefix in sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(os.path.realpath(python)))}):
        if not prefix.startswith("/usr/"):
            # Its parents are made 0755: bubblewrap would copy a 0700 /root, which the code's uid cannot traverse.
            parents = [str(p) for p in reversed(Path(prefix).parents) if str(p) != "/"]
            for parent in parents:
                argv += ["--perms", "0755", "--dir", parent]
            argv += ["--ro-bind", prefix, prefix]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(disk_bytes), "--perms", "1777", "--tmpfs", _SANDBOX_WORKDIR,
             "--remount-ro", "/", "--chdir", _SANDBOX_WORKDIR]
    return argv


def bwrap_problem(python: str) -> str | None:
    """Why bubblewrap cannot run ``python`` here (None when it can): a real sandboxed start, not a guess."""
    if shutil.which("bwrap") is None:
        return "no bwrap on PATH"
    argv = bwrap_argv(python, 4096 * 16, as_root=os.geteuid() == 0) + [python, "-I", "-c", "pass"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, env=_clean_env(_SANDBOX_WORKDIR))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not start: {exc}"
    if done.returncode != 0:
        return f"bwrap exited with {done.returncode}: {done.stderr.decode(errors='replace').strip()[:300]}"
    return None


def _json_records(fd: int, limit: int = 65536) -> list[dict]:
    """The JSON object lines already written on a pipe whose writers have gone (lines that do not parse are skipped)."""
    os.set_blocking(fd, False)
    data = b""
    while len(data) < limit:
        try:
            chunk = os.read(fd, limit - len(data))
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    records = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _clean_env(workdir: str) -> dict[str, str]:
    """No variable of the trainer's (tokens, paths, proxies) reaches the code."""
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the call's whole process group (in bwrap mode that ends its PID namespace, and every process in it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()
