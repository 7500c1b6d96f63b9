"""One cgroup per tool call: a memory bound on everything the call's processes hold together (memfd and tmpfs pages
included, which RLIMIT_AS does not count), a bound on its processes, a CPU quota, and a kill that reaches every
process the call started, wherever it moved (another session, a double fork).

Where the machine allows it: a cgroup v2 hierarchy whose cgroup of this process may have children with the
``memory``, ``pids`` and ``cpu`` controllers (the cgroup is delegated and its ``cgroup.subtree_control`` holds them,
or they can be enabled there), else the cgroup v1 hierarchies of those controllers where this process may create
children (a root container with the hybrid layout). Nothing is needed beyond writable cgroup files. Where neither
works, :meth:`CgroupHost.problem` says why in one line and calls run without a cgroup (the sandbox logs that line
once; docs/tools.md says what is then unbounded).

A call's cgroup is ``dapo-tool-<pid>-<n>`` under this process's own cgroup; the call's first process writes itself
into it before it execs the sandbox (so nothing of the call ever runs outside), and after the call every process
still in it is killed and the cgroup removed.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    pids: int
    cpu_cores: float


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, super options) of every cgroup file system, from /proc/self/mountinfo."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[4].replace("\\040", " "), tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path (/proc/self/cgroup)."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


class CallCgroup:
    """The cgroup(s) of one call: one directory in v2, one per controller in v1."""

    def __init__(self, dirs: list[Path], version: int) -> None:
        self.dirs = dirs
        self.version = version

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _memory_dir(self) -> Path:
        return next(
            d for d in self.dirs if (d / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")).exists()
        )

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the call for the cgroup's memory bound (a record the code cannot
        write: v2 ``memory.events``, v1 ``memory.oom_control`` / ``memory.failcnt``)."""
        try:
            memory = self._memory_dir()
            name = "memory.events" if self.version == 2 else "memory.oom_control"
            for line in (memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, StopIteration, ValueError):
            pass
        return False

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(found)

    def kill_and_remove(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process still in the call's cgroup, wait until it is empty, remove it."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if pids:
                kill = self.dirs[0] / "cgroup.kill"
                if self.version == 2 and kill.exists():
                    try:
                        kill.write_text("1")
                    except OSError:
                        pass
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            removed = True
            for d in self.dirs:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    removed = False
            if removed or time.monotonic() > deadline:
                return
            time.sleep(0.01)


class CgroupHost:
    """Where this process can make per-call cgroups, found once (:meth:`detect`); thread-safe."""

    def __init__(self, version: int | None, parents: list[Path], problem: str | None) -> None:
        self.version = version
        self.parents = parents
        self.problem = problem
        self._counter = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def detect(cls) -> "CgroupHost":
        mounts, own = _mounts(), _own_paths()
        reasons = []
        for mount, fstype, _ in mounts:
            if fstype == "cgroup2" and "" in own:
                parent = Path(mount + own[""].rstrip("/"))
                reason = _v2_usable(parent)
                if reason is None:
                    _remove_stale([parent])
                    return cls(2, [parent], None)
                reasons.append(f"cgroup v2 at {parent}: {reason}")
        v1 = {}
        for controller in CONTROLLERS:
            mount = next((m for m, fstype, opts in mounts if fstype == "cgroup" and controller in opts), None)
            if mount is not None and controller in own:
                v1[controller] = Path(mount + own[controller].rstrip("/"))
        if len(v1) == len(CONTROLLERS):
            reason = _v1_usable(list(v1.values()))
            if reason is None:
                _remove_stale(list(v1.values()))
                return cls(1, list(dict.fromkeys(v1.values())), None)
            reasons.append(f"cgroup v1: {reason}")
        elif v1:
            reasons.append(f"cgroup v1 has only {sorted(v1)} of {list(CONTROLLERS)}")
        return cls(None, [], "; ".join(reasons) or "no cgroup file system is mounted")

    def create(self, limits: CgroupLimits) -> CallCgroup:
        """A new cgroup with ``limits``; raises OSError when it cannot be made (the call then does not run)."""
        with self._lock:
            name = f"dapo-tool-{os.getpid()}-{next(self._counter)}"
        dirs = [parent / name for parent in self.parents]
        group = CallCgroup(dirs, self.version or 0)
        try:
            for d in dirs:
                d.mkdir()
            quota = max(1000, int(limits.cpu_cores * CPU_PERIOD_US))
            if self.version == 2:
                d = dirs[0]
                (d / "memory.max").write_text(str(limits.memory_bytes))
                _try_write(d / "memory.swap.max", "0")
                (d / "pids.max").write_text(str(limits.pids))
                (d / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                for d in dirs:
                    if (d / "memory.limit_in_bytes").exists():
                        (d / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                        _try_write(d / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))  # no swap beyond
                    if (d / "pids.max").exists():
                        (d / "pids.max").write_text(str(limits.pids))
                    if (d / "cpu.cfs_quota_us").exists():
                        (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                        (d / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError:
            group.kill_and_remove(timeout_s=0.5)
            raise
        return group


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parents: list[Path]) -> None:
    """The call cgroups of a process that died before it could remove them (a SIGKILLed trainer): their processes
    are killed and they are removed (``dapo-tool-<pid>-<n>``, with <pid> gone)."""
    for parent in dict.fromkeys(parents):
        try:
            children = list(parent.glob("dapo-tool-*-*"))
        except OSError:
            continue
        for child in children:
            owner = child.name.split("-")[2]
            if owner.isdigit() and not pid_alive(int(owner)) and child.is_dir():
                CallCgroup([child], 2 if (child / "cgroup.kill").exists() else 1).kill_and_remove(timeout_s=1.0)


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass  # optional knob (swap accounting may be off)


def _v2_usable(parent: Path) -> str | None:
    try:
        available = set((parent / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return f"cannot read cgroup.controllers ({exc.strerror})"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"controllers {missing} are not delegated to it (it has {sorted(available) or 'none'})"
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        wanted = [c for c in CONTROLLERS if c not in enabled]
        if wanted:
            (parent / "cgroup.subtree_control").write_text(" ".join("+" + c for c in wanted))
    except OSError as exc:  # EBUSY: this process lives in it (no internal processes), EACCES: not delegated
        return f"cannot enable {CONTROLLERS} for its children ({exc.strerror})"
    return _probe_child(parent)


def _v1_usable(parents: list[Path]) -> str | None:
    for parent in dict.fromkeys(parents):
        reason = _probe_child(parent)
        if reason is not None:
            return f"{parent}: {reason}"
    return None


def _probe_child(parent: Path) -> str | None:
    probe = parent / f"dapo-tool-{os.getpid()}-probe"
    try:
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        return f"cannot create a child cgroup ({exc.strerror})"
    return None
