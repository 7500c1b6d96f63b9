"""A sandboxed Python interpreter: each call runs the code in a fresh process behind an isolation boundary.

Two modes (docs/tools.md lists exactly what each stops, and the test that checks it):

* ``bwrap``, the isolation: bubblewrap puts the process in new PID, network, IPC, UTS and mount namespaces whose file
  system holds only the interpreter and the system libraries, read-only, plus an empty tmpfs of bounded size (and, as
  root, bounded inodes) as its working directory; there is no network device but a private loopback; a seccomp
  filter (:mod:`dapo.tools.seccomp`) refuses mounts, new namespaces, keyrings, eBPF, userfaultfd, io_uring and calls
  aimed at other processes. As root the code then runs as an unprivileged uid of its own with no capabilities; as
  another user bubblewrap adds a user namespace, and nested user namespaces are disabled.
* ``unsafe-no-isolation``: **not a boundary**. A child process with the trainer's uid, in its own session, with a
  private temporary directory and a Python audit hook that turns away accidents (files outside the directory,
  sockets, signals, new processes, ctypes); one line of the standard library gets past the hook (docs/tools.md lists
  nine). It runs only when asked for by that name; the old name ``process`` is refused, saying why, and
  ``mode="auto"`` refuses, naming what to install, when bubblewrap cannot run.

Both apply the same resource limits (rlimits set by the launcher before the code runs: CPU time, address space, file
size, open files, processes), one cgroup per call where the machine allows it (:mod:`dapo.tools.cgroups`: memory of
all the call's processes together, memfd and tmpfs pages included, processes, CPU quota), and the same wall-clock
limit and output cap enforced from outside: the whole process group, the cgroup (and in ``bwrap`` mode the PID
namespace) is killed. Whatever the code does, :meth:`PythonSandbox.run`
returns a :class:`ToolResult` whose ``category`` says how it ended; it never raises because of the code.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dapo.tools import launcher
from dapo.tools.cgroups import CallCgroup, CgroupHost, CgroupLimits, pid_alive
from dapo.tools.result import ToolResult
from dapo.tools.seccomp import seccomp_filter, seccomp_problem

UNSAFE_MODE = "unsafe-no-isolation"
IsolationMode = Literal["auto", "bwrap", "unsafe-no-isolation"]
ISOLATION_MODES: tuple[str, ...] = ("auto", "bwrap", UNSAFE_MODE)
# The unsafe mode's old name; refused with this message, so that no config keeps it under a safe-sounding name.
RENAMED_MODE_MESSAGE = (
    "sandbox mode 'process' is refused: it is not an isolation boundary (the code runs with the trainer's uid and "
    "one line of the standard library gets past its audit hook: docs/tools.md). Use bwrap (apt-get install "
    f"bubblewrap), or name the mode for what it is, {UNSAFE_MODE}, to run the code without isolation"
)
_log = logging.getLogger(__name__)


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
    max_files: inodes of the bwrap working directory's tmpfs (files and directories; as root, where ``unshare`` and
        ``mount`` are installed: bubblewrap's own tmpfs takes no inode bound).
    open_files: RLIMIT_NOFILE.
    cpu_cores: the call's CPU quota (cgroup ``cpu.max``), where the machine gives it a cgroup.

    ``memory_bytes`` and ``max_processes`` also bound the call's cgroup (``memory.max``, ``pids.max``), where there is
    one: all of its processes together, memfd and tmpfs pages included.
    """

    wall_time_s: float = 5.0
    cpu_time_s: float = 5.0
    memory_bytes: int = 512 * 2**20
    max_output_bytes: int = 64 * 1024
    max_processes: int = 16
    disk_bytes: int = 16 * 2**20
    open_files: int = 64
    max_files: int = 4096
    cpu_cores: float = 1.0

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"SandboxLimits.{name} must be a number of seconds in (0, 3600], got {value!r}")
        for name, low in (
            ("memory_bytes", 64 * 2**20),
            ("max_output_bytes", 1),
            ("max_processes", 1),
            ("disk_bytes", 4096),
            ("open_files", 16),
            ("max_files", 16),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SandboxLimits.{name} must be an integer >= {low}, got {value!r}")
        cores = self.cpu_cores
        if isinstance(cores, bool) or not isinstance(cores, (int, float)) or not 0.01 <= cores <= 1024:
            raise ValueError(f"SandboxLimits.cpu_cores must be a number in [0.01, 1024], got {cores!r}")


class PythonSandbox:
    """Runs Python source in a fresh sandboxed interpreter per call; thread-safe, calls may run in parallel.

    Args:
        limits: what each call may use.
        mode: ``bwrap``; ``auto`` (bwrap, else :class:`SandboxUnavailableError` naming the fix); or
            ``unsafe-no-isolation``, which isolates nothing (module docstring) and runs only when named so.
        python: the interpreter to run (default: this one); its installation is visible read-only to the code.

    What this machine leaves out is said once in the log and kept in :attr:`gaps` (e.g. no cgroup: the reason).
    """

    def __init__(
        self, limits: SandboxLimits = SandboxLimits(), *, mode: IsolationMode = "auto", python: str | None = None
    ) -> None:
        if mode == "process":
            raise ValueError(RENAMED_MODE_MESSAGE)
        if mode not in ISOLATION_MODES:
            raise ValueError(f"sandbox mode must be one of {ISOLATION_MODES}, got {mode!r}")
        self.limits = limits
        self.python = python or sys.executable
        self._is_root = os.geteuid() == 0
        self._uid_lock = threading.Lock()
        self._next_uid = 0
        self.cgroups = CgroupHost.detect()
        self.gaps: dict[str, str] = {}  # what runs without a bound here, and why (one line each)
        if self.cgroups.problem is not None:
            self.gaps["cgroup"] = (
                f"no per-call cgroup ({self.cgroups.problem}): memory is bounded per process "
                "(RLIMIT_AS, memfd pages uncounted), processes per uid, CPU per process"
            )
        self._tmpfs_mount = self._unshare = self._mount = None
        self._seccomp = None
        if mode == UNSAFE_MODE:
            self.mode = UNSAFE_MODE
            self._log_gaps()
            return
        problem = bwrap_problem(self.python)
        if problem is not None:
            raise SandboxUnavailableError(
                f"tool sandbox: bubblewrap cannot isolate code here ({problem}). Install it (Debian/Ubuntu: "
                "apt-get install bubblewrap) on a host that allows user namespaces, or run the code without any "
                f"isolation by naming mode={UNSAFE_MODE} (docs/tools.md says what that lets through)"
            )
        self.mode = "bwrap"
        self._seccomp = seccomp_filter()
        if self._seccomp is None:
            self.gaps["seccomp"] = seccomp_problem() or "no seccomp filter"
        # As root the working directory is a tmpfs this class mounts itself (size and inodes bounded) in a private
        # mount namespace of the call (``unshare``): bubblewrap's --tmpfs takes a size but no inode bound.
        self._unshare = shutil.which("unshare", path="/usr/bin:/bin")
        self._mount = shutil.which("mount", path="/usr/bin:/bin")
        if self._is_root and self._unshare and self._mount:
            _remove_stale_mount_points()
            # an empty mount point, never written (the tmpfs is mounted on it only inside each call's namespace)
            self._tmpfs_mount = tempfile.mkdtemp(prefix=f"dapo-tool-mnt-{os.getpid()}-")
            weakref.finalize(self, _remove_dir, self._tmpfs_mount)
        else:
            self.gaps["inodes"] = (
                "the working directory's inodes are unbounded (bubblewrap's tmpfs takes a size "
                "only; the inode bound needs root with unshare and mount)"
            )
        self._log_gaps()

    def _log_gaps(self) -> None:
        for name, gap in self.gaps.items():
            _log.warning("tool sandbox (%s): %s", self.mode, gap)

    # --- running -------------------------------------------------------------------------------------------------

    def run(self, code: str) -> ToolResult:
        """Run ``code`` (Python source) to the end or to a limit; never raises because of what the code does."""
        start = time.monotonic()
        workdir = None
        pipes: list[int] = []
        group: CallCgroup | None = None
        try:
            uid = self._sandbox_uid()
            if self.mode == "bwrap":
                header_workdir, cwd = _SANDBOX_WORKDIR, None
            else:
                workdir = tempfile.mkdtemp(prefix="dapo-tool-")
                cwd = header_workdir = workdir
            header = {
                "cpu_time_s": max(1, int(-(-self.limits.cpu_time_s // 1))),
                "memory_bytes": self.limits.memory_bytes,
                "file_size_bytes": self.limits.disk_bytes,
                "open_files": self.limits.open_files,
                "nproc": self.limits.max_processes if uid is not None or self.mode == "bwrap" else None,
                "uid": uid,
                "audit": self.mode == UNSAFE_MODE,
                "workdir": header_workdir,
                "read_roots": sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(self.python))}),
            }
            # Two pipes the code's exit status and output cannot stand in for: the launcher's records (it started;
            # how the code ended), and (bwrap) bubblewrap's own --json-status-fd, which it closes before the code
            # starts and which holds an "exit-code" record only when its set-up finished and the code ran.
            status_r, status_w = os.pipe()
            pipes += [status_r, status_w]
            header["status_fd"] = status_w
            pass_fds = [status_w]
            bwrap_r = None
            argv = [self.python, "-I", "-c", LAUNCHER_SOURCE]
            if self.mode == "bwrap":
                bwrap_r, bwrap_w = os.pipe()
                pipes += [bwrap_r, bwrap_w]
                pass_fds.append(bwrap_w)
                seccomp_fd = None
                if self._seccomp is not None:
                    seccomp_fd = _data_fd(self._seccomp)
                    pipes.append(seccomp_fd)
                    pass_fds.append(seccomp_fd)
                argv = (
                    bwrap_argv(
                        self.python,
                        self.limits.disk_bytes,
                        as_root=self._is_root,
                        json_status_fd=bwrap_w,
                        seccomp_fd=seccomp_fd,
                        workdir_source=self._tmpfs_mount,
                    )
                    + argv
                )
                argv = self._customise_bwrap(argv)
            try:
                group = self._call_cgroup()
            except OSError as exc:
                return ToolResult(
                    f"sandbox: could not create the call's cgroup: {exc}", "sandbox", None, time.monotonic() - start
                )
            argv = self._wrapped(argv, group)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=_clean_env(header_workdir),
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=pass_fds,
                )
            except OSError as exc:
                return ToolResult(
                    f"sandbox: could not start the interpreter: {exc}", "sandbox", None, time.monotonic() - start
                )
            finally:
                for fd in pass_fds:  # the parent keeps only the read ends: EOF once the child side has gone
                    os.close(fd)
                    pipes.remove(fd)
            return self._supervise(
                proc,
                json.dumps(header).encode() + b"\n" + code.encode("utf-8", "replace"),
                start,
                status_r,
                bwrap_r,
                group,
            )
        finally:
            for fd in pipes:
                os.close(fd)
            if group is not None:  # whatever the call left (a daemon in its own session) ends with it
                group.kill_and_remove()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _customise_bwrap(self, argv: list[str]) -> list[str]:
        """The bubblewrap command line as run (tests replace it to provoke a real set-up failure)."""
        return argv

    def _call_cgroup(self) -> CallCgroup | None:
        if self.cgroups.version is None:
            return None
        return self.cgroups.create(
            CgroupLimits(self.limits.memory_bytes, self.limits.max_processes, self.limits.cpu_cores)
        )

    def _wrapped(self, argv: list[str], group: CallCgroup | None) -> list[str]:
        """``argv`` behind a shell that first writes itself into the call's cgroup (so the call's every process is
        in it from the start) and, as root in bwrap mode, mounts the bounded tmpfs in a private mount namespace."""
        mount = self.mode == "bwrap" and self._tmpfs_mount is not None
        if group is None and not mount:
            return argv
        options = (
            f"size={self.limits.disk_bytes},nr_inodes={self.limits.max_files},mode=1777,nosuid,nodev" if mount else ""
        )
        wrapper = [
            "/bin/sh",
            "-c",
            _WRAPPER_SCRIPT,
            "sh",
            *(group.procs_files if group else []),
            "--",
            options,
            self._tmpfs_mount or "",
            self._mount or "",
            *argv,
        ]
        if mount:
            wrapper = [self._unshare, "--mount", "--propagation", "private", "--", *wrapper]
        return wrapper

    def run_many(self, codes: Sequence[str], max_workers: int = 4) -> list[ToolResult]:
        """Run several codes in parallel (at most ``max_workers`` processes at once); results in input order."""
        if not codes:
            return []
        if len(codes) == 1 or max_workers <= 1:
            return [self.run(code) for code in codes]
        with ThreadPoolExecutor(max_workers=min(max_workers, len(codes)), thread_name_prefix="dapo-tool") as pool:
            return list(pool.map(self.run, codes))

    def _supervise(
        self,
        proc: subprocess.Popen,
        stdin_bytes: bytes,
        start: float,
        status_fd: int,
        bwrap_fd: int | None,
        group: CallCgroup | None,
    ) -> ToolResult:
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
        # The call's main process ending also ends the reading: a process it left behind (a daemon of the unsafe
        # mode, which only the cgroup then ends) may hold the pipe open, and must not hold the call to its wall limit.
        try:
            exit_fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            exit_fd = None
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_READ)
                if exit_fd is not None:
                    selector.register(exit_fd, selectors.EVENT_READ)
                main_ended = False
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        reason = "timeout"
                        break
                    events = selector.select(timeout=remaining if exit_fd is not None else min(remaining, 0.05))
                    if not main_ended and (
                        any(key.fd == exit_fd for key, _ in events) or (exit_fd is None and proc.poll() is not None)
                    ):
                        main_ended = True  # read what is already in the pipe, then stop
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        if main_ended:
                            break
                        continue
                    if not data:
                        break  # every writer closed the pipe: the code has ended (or closed its output)
                    chunks.append(data)
                    size += len(data)
                    if size > limits.max_output_bytes:
                        reason = "output_limit"
                        break
        finally:
            if exit_fd is not None:
                os.close(exit_fd)
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
            return ToolResult(
                output + f"\nTimeoutError: the code ran past the {limits.wall_time_s:g} s wall-clock "
                "limit and was killed",
                "timeout",
                status,
                wall,
            )
        if reason == "output_limit":
            return ToolResult(
                output + f"\n[output cut at {limits.max_output_bytes} bytes; the code was killed]",
                "output_limit",
                status,
                wall,
            )
        records = _json_records(status_fd)
        started = any(r.get("started") is True for r in records)
        outcomes = [r.get("outcome") for r in records]
        code_ran = started and (bwrap_fd is None or any("exit-code" in r for r in _json_records(bwrap_fd)))
        oom = group is not None and group.oom_killed()
        return ToolResult(*self._classify(output, status, outcomes, code_ran, oom), status, wall)

    def _classify(
        self, output: str, status: int, outcomes: list, code_ran: bool, oom_killed: bool = False
    ) -> tuple[str, str]:
        """The category from what the code cannot forge: bubblewrap's own record of whether the code started, the
        launcher's records, and the cgroup's count of memory kills; the exit status only tells the code's own exit
        or a signal."""
        if not code_ran:  # the sandbox's set-up failed (bubblewrap's message, "bwrap: ...", is the output)
            return output, "sandbox"
        if "memory" in outcomes:
            return output, "memory"
        if oom_killed:
            return (
                output + f"\nMemoryError: the call's processes together used more than its "
                f"{self.limits.memory_bytes} bytes and one was killed",
                "memory",
            )
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


# The call's first process: "$@" is  cgroup.procs files... -- tmpfs-options mount-point mount-binary command...
# It writes itself into the call's cgroup(s) before anything of the call runs, mounts the bounded tmpfs when given
# options (only ever inside the private mount namespace ``unshare`` made), then becomes the command. Exit 125: the
# set-up failed and the code never ran (reported as "sandbox": no launcher record says it started).
_WRAPPER_SCRIPT = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
    'if [ -n "$1" ]; then "$3" -t tmpfs -o "$1" dapo-tool "$2" || exit 125; fi; shift 3; exec "$@"'
)


def bwrap_argv(
    python: str,
    disk_bytes: int,
    *,
    as_root: bool,
    json_status_fd: int | None = None,
    seccomp_fd: int | None = None,
    workdir_source: str | None = None,
) -> list[str]:
    """bubblewrap's arguments: new namespaces, a read-only view of the interpreter and system libraries, a private
    working directory (a tmpfs of ``disk_bytes``, or ``workdir_source``, an already mounted bounded tmpfs, bound
    there), the seccomp filter read from ``seccomp_fd``, and nothing else (no /etc, /home, /root, /tmp, /sys, host
    /dev nor host network)."""
    argv = [shutil.which("bwrap") or "bwrap"]
    if json_status_fd is not None:
        argv += ["--json-status-fd", str(json_status_fd)]
    argv += [
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if as_root:  # no user namespace (its uid 0 would be exempt from RLIMIT_NPROC): the launcher drops to a plain uid
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:  # a user namespace of the call's own, in which no further one may be made
        argv += ["--unshare-user", "--disable-userns"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
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
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev"]
    if workdir_source is not None:
        argv += ["--bind", workdir_source, _SANDBOX_WORKDIR]
    else:
        argv += ["--size", str(disk_bytes), "--perms", "1777", "--tmpfs", _SANDBOX_WORKDIR]
    argv += ["--remount-ro", "/", "--chdir", _SANDBOX_WORKDIR]
    return argv


def bwrap_problem(python: str) -> str | None:
    """Why bubblewrap cannot run ``python`` here (None when it can): a real sandboxed start with the seccomp filter,
    not a guess."""
    if shutil.which("bwrap") is None:
        return "no bwrap on PATH"
    program = seccomp_filter()
    fd = _data_fd(program) if program is not None else None
    argv = bwrap_argv(python, 4096 * 16, as_root=os.geteuid() == 0, seccomp_fd=fd) + [python, "-I", "-c", "pass"]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=30,
            env=_clean_env(_SANDBOX_WORKDIR),
            pass_fds=() if fd is None else (fd,),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not start: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        return f"bwrap exited with {done.returncode}: {done.stderr.decode(errors='replace').strip()[:300]}"
    return None


def _data_fd(data: bytes) -> int:
    """A descriptor to read ``data`` from (a pipe already holding it, its write end closed)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)  # a few hundred bytes: within the pipe's buffer, never blocks
    finally:
        os.close(write_end)
    return read_end


def _remove_stale_mount_points() -> None:
    """Mount points left by a sandbox whose process died before its finalizer ran (empty directories)."""
    for path in Path(tempfile.gettempdir()).glob("dapo-tool-mnt-*-*"):
        owner = path.name.split("-")[3]
        if owner.isdigit() and not pid_alive(int(owner)):
            _remove_dir(str(path))


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


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
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
    }


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
