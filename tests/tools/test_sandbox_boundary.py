"""What each sandbox mode guarantees (docs/tools.md's table names these tests), issue #39 items 6, 7 and 9.

* The one-line standard-library escapes that got past the old ``process`` mode's audit hook, each run in the bwrap
  mode against a real host target (a file, a checkpoint, a victim process of this test's uid) that must come out
  untouched; and the unsafe mode, which does not stop them, is refused under its old name and runs only when named.
* The kernel interfaces the seccomp filter removes (keyring, new user namespaces by ``unshare`` and by ``clone``,
  mounts, eBPF, userfaultfd), while threads, ``fork`` and ``subprocess`` keep working.
* The per-call cgroup: memory held in memfd pages (outside RLIMIT_AS) and by several processes together is bounded
  and reported as ``memory``; a daemon in its own session ends with the call, even in the unsafe mode.
* The tmpfs working directory's inode bound, the read-only root, a raw ``socket().connect()``, and a call whose
  trainer dies.
"""

from __future__ import annotations

import errno
import os
import resource
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dapo.config import build_config
from dapo.config.schema import ConfigError
from dapo.tools import seccomp
from dapo.tools.cgroups import CgroupHost, CgroupLimits
from dapo.tools.sandbox import UNSAFE_MODE, PythonSandbox, SandboxLimits, bwrap_problem

LIMITS = SandboxLimits(
    wall_time_s=20.0,
    cpu_time_s=10.0,
    memory_bytes=256 * 2**20,
    max_output_bytes=16384,
    max_processes=8,
    disk_bytes=1 << 20,
    max_files=64,
)
BWRAP_PROBLEM = bwrap_problem(sys.executable)
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bwrap: {BWRAP_PROBLEM}")
CGROUPS = CgroupHost.detect()
needs_cgroup = pytest.mark.skipif(CGROUPS.version is None, reason=f"no per-call cgroup: {CGROUPS.problem}")
needs_seccomp = pytest.mark.skipif(seccomp.seccomp_filter() is None, reason=str(seccomp.seccomp_problem()))


@pytest.fixture(scope="module")
def bwrap() -> PythonSandbox:
    if BWRAP_PROBLEM is not None:
        pytest.skip(f"bwrap: {BWRAP_PROBLEM}")
    return PythonSandbox(LIMITS, mode="bwrap")


@pytest.fixture()
def victim() -> Iterator[subprocess.Popen]:
    """A process of this test's uid (root here, as a trainer is), that the code must not touch."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


# ---- item 6: the unsafe mode is named for what it is ---------------------------------------------------------------


def test_the_old_process_mode_name_is_refused_saying_why_and_what_to_use() -> None:
    with pytest.raises(
        ValueError,
        match=r"'process' is refused: it is not an isolation boundary.*"
        r"bwrap.*unsafe-no-isolation",
    ):
        PythonSandbox(LIMITS, mode="process")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"sandbox.mode: 'process' is refused.*unsafe-no-isolation"):
        build_config({}, ["rollout.multi_turn.sandbox.mode=process"])
    assert (
        build_config({}, [f"rollout.multi_turn.sandbox.mode={UNSAFE_MODE}"]).rollout.multi_turn.sandbox.mode
        == UNSAFE_MODE
    )


def test_auto_never_falls_back_to_the_unsafe_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo.tools.sandbox import SandboxUnavailableError

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap
    with pytest.raises(SandboxUnavailableError, match="unsafe-no-isolation"):
        PythonSandbox(LIMITS, mode="auto")


# ---- item 6: the nine one-liners, against the bwrap mode -----------------------------------------------------------


def test_clearing_the_audit_hooks_sets_through_gc_reaches_no_host_file(bwrap: PythonSandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("dapo-secret-1234")
    os.chmod(tmp_path, 0o755)
    result = bwrap.run(
        "import gc\n[o.clear() for o in gc.get_objects() if isinstance(o, set) and 'os.kill' in o]\n"
        f"print(open({str(secret)!r}).read())"
    )
    assert result.category == "error" and "dapo-secret-1234" not in result.output, result


def test_a_shell_command_runs_unprivileged_and_cannot_write_the_host(bwrap: PythonSandbox, tmp_path: Path) -> None:
    # subprocess is _posixsubprocess.fork_exec underneath: here it may run, as a plain uid inside the namespaces.
    target = tmp_path / "pwned"
    os.chmod(tmp_path, 0o777)
    result = bwrap.run(
        "import subprocess\nprint(subprocess.run(['/bin/sh', '-c', "
        f"'id -u; touch {target} || echo refused'], capture_output=True, text=True).stdout)"
    )
    assert result.category == "ok", result
    uid, verdict = result.output.split()[:2]
    assert int(uid) >= 200_000 if os.geteuid() == 0 else int(uid) == os.geteuid()
    assert verdict == "refused" and not target.exists()


def test_readline_history_reads_no_host_file(bwrap: PythonSandbox, tmp_path: Path) -> None:
    secret = tmp_path / "history"
    secret.write_text("dapo-secret-5678\n")
    os.chmod(tmp_path, 0o755)
    result = bwrap.run(
        f"import readline\nreadline.read_history_file({str(secret)!r})\nprint(readline.get_history_item(1))"
    )
    assert result.category == "error" and "dapo-secret-5678" not in result.output, result


def test_sqlite_creates_no_host_file(bwrap: PythonSandbox, tmp_path: Path) -> None:
    target = tmp_path / "x.db"
    os.chmod(tmp_path, 0o777)
    result = bwrap.run(f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t(x)')")
    assert result.category == "error" and not target.exists(), result


def test_os_replace_cannot_overwrite_a_checkpoint(bwrap: PythonSandbox, tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"weights")
    os.chmod(tmp_path, 0o777)
    result = bwrap.run(f"import os\nopen('x', 'w').write('evil')\nos.replace('x', {str(checkpoint)!r})")
    assert result.category == "error" and checkpoint.read_bytes() == b"weights", result


def test_utime_and_setxattr_leave_host_files_alone(bwrap: PythonSandbox, tmp_path: Path) -> None:
    target = tmp_path / "data.jsonl"
    target.write_text("{}")
    os.chmod(target, 0o666)
    before = target.stat().st_mtime_ns
    for code in (
        f"import os\nos.utime({str(target)!r}, (0, 0))",
        f"import os\nos.setxattr({str(target)!r}, 'user.dapo', b'x')",
    ):
        assert bwrap.run(code).category == "error"
    assert target.stat().st_mtime_ns == before
    try:
        assert "user.dapo" not in os.listxattr(target)
    except OSError:  # this file system keeps no extended attributes
        pass


def test_pidfd_send_signal_cannot_kill_the_trainer_or_another_process(
    bwrap: PythonSandbox, victim: subprocess.Popen
) -> None:
    for pid in (str(victim.pid), "os.getppid()", "1"):
        result = bwrap.run(f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({pid}), signal.SIGKILL)")
        assert result.category in ("error", "killed"), (pid, result)
    assert victim.poll() is None
    assert bwrap.run("print(1)").output == "1\n"


def test_prlimit_cannot_change_another_processes_limits(bwrap: PythonSandbox, victim: subprocess.Popen) -> None:
    before = resource.prlimit(victim.pid, resource.RLIMIT_NOFILE)
    for pid in (str(victim.pid), "os.getppid()", "1"):
        result = bwrap.run(f"import os, resource\nresource.prlimit({pid}, resource.RLIMIT_NOFILE, (3, 3))")
        assert result.category == "error", (pid, result)
    assert resource.prlimit(victim.pid, resource.RLIMIT_NOFILE) == before
    # the code's own limits (pid 0) are still its own business
    assert bwrap.run("import resource\nresource.prlimit(0, resource.RLIMIT_NOFILE, (20, 20))\nprint('ok')").ok


def test_setpriority_and_affinity_cannot_reach_another_process(bwrap: PythonSandbox, victim: subprocess.Popen) -> None:
    nice, cpus = os.getpriority(os.PRIO_PROCESS, victim.pid), os.sched_getaffinity(victim.pid)
    for pid in (str(victim.pid), "os.getppid()", "1"):
        for call in (f"os.setpriority(os.PRIO_PROCESS, {pid}, 19)", f"os.sched_setaffinity({pid}, {{0}})"):
            result = bwrap.run(f"import os\n{call}")
            assert result.category == "error", (call, result)
    assert os.getpriority(os.PRIO_PROCESS, victim.pid) == nice and os.sched_getaffinity(victim.pid) == cpus


# ---- item 7: seccomp and nested user namespaces --------------------------------------------------------------------

SYSCALL = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def call(nr, *args):
        result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        if result == 0 and nr == 56:  # a clone that went through: this is the child
            os._exit(0)
        return result, ctypes.get_errno()
""")
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
REFUSED = {  # name -> (syscall number, arguments): each succeeds for a plain uid without the filter
    "keyctl": (250, (0, -3, 1)),  # KEYCTL_GET_KEYRING_ID of the session keyring, create
    "unshare(CLONE_NEWUSER)": (272, (CLONE_NEWUSER,)),
    "clone(CLONE_NEWUSER)": (56, (CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)),
    "add_key": (248, (0, 0, 0, 0, 0)),
    "mount": (165, (0, 0, 0, 0, 0)),
    "bpf": (321, (0, 0, 0)),
    "userfaultfd": (323, (0,)),
    "io_uring_setup": (425, (1, 0)),
}


@needs_seccomp
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_seccomp_filter_refuses(bwrap: PythonSandbox, name: str) -> None:
    nr, args = REFUSED[name]
    result = bwrap.run(SYSCALL + f"print(call({nr}, *{args!r}))")
    assert result.category == "ok", result
    assert result.output.strip() == f"(-1, {errno.EPERM})", (name, result.output)


@needs_seccomp
def test_threads_fork_and_subprocess_still_work_under_the_filter(bwrap: PythonSandbox) -> None:
    code = textwrap.dedent("""
        import os, subprocess, threading
        box = []
        t = threading.Thread(target=box.append, args=('thread',))
        t.start(); t.join()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        print(box[0], os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), subprocess.run(['echo', 'sub'],
              capture_output=True, text=True).stdout.strip())
    """)
    result = bwrap.run(code)
    assert result.category == "ok" and result.output == "thread 7 sub\n", result


def test_the_syscall_table_matches_this_hosts_header() -> None:
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if not header.exists():
        pytest.skip("no asm/unistd_64.h here")
    numbers = {}
    for line in header.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("__NR_"):
            numbers[parts[1][5:]] = int(parts[2])
    assert {name: numbers.get(name) for name in seccomp.X86_64} == seccomp.X86_64


# ---- item 7: the per-call cgroup -----------------------------------------------------------------------------------

MEMFD = textwrap.dedent("""
    import os
    held = []
    chunk = b'x' * (8 << 20)   # under RLIMIT_FSIZE; memfd pages are not in the address space (RLIMIT_AS)
    for i in range(64):        # 512 MiB against a 128 MiB call
        fd = os.memfd_create(f'm{i}')
        os.write(fd, chunk)
        held.append(fd)
    print('held', len(held) * 8, 'MiB')
""")
TOGETHER = textwrap.dedent("""
    import os, time
    for _ in range(4):         # 4 x 60 MiB, each under RLIMIT_AS, 240 MiB together against a 128 MiB call
        if os.fork() == 0:
            block = bytearray(60 << 20)
            time.sleep(5)
            os._exit(0)
    for _ in range(4):
        print(os.waitstatus_to_exitcode(os.wait()[1]))
""")


@needs_cgroup
@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), UNSAFE_MODE])
@pytest.mark.parametrize("code", [MEMFD, TOGETHER], ids=["memfd", "processes_together"])
def test_the_calls_memory_is_bounded_as_a_whole(mode: str, code: str) -> None:
    box = PythonSandbox(SandboxLimits(wall_time_s=30.0, memory_bytes=128 * 2**20, max_processes=8), mode=mode)
    if mode == UNSAFE_MODE and code is TOGETHER:
        pytest.skip("the unsafe mode's audit hook refuses os.fork")
    result = box.run(code)
    assert result.category == "memory", result
    assert "held 512 MiB" not in result.output


@needs_cgroup
def test_the_calls_cgroup_gets_the_limits() -> None:
    group = CGROUPS.create(CgroupLimits(memory_bytes=96 * 2**20, pids=5, cpu_cores=0.5))
    try:
        values = {}
        for d in group.dirs:
            for name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cpu.max", "cpu.cfs_quota_us"):
                if (d / name).exists():
                    values[name] = (d / name).read_text().split()
        assert values.get("memory.max", values.get("memory.limit_in_bytes")) == [str(96 * 2**20)]
        assert values["pids.max"] == ["5"]
        assert values.get("cpu.max", values.get("cpu.cfs_quota_us"))[0] == "50000"
    finally:
        group.kill_and_remove()
    assert not any(d.exists() for d in group.dirs)


@needs_cgroup
def test_a_setsid_daemon_started_past_the_unsafe_hook_is_killed_after_the_call() -> None:
    # The unsafe mode stops nothing determined: the gc one-liner empties its hook's refusals, and a daemon in a
    # session of its own outlives the launcher. The call's cgroup still holds it, and it is killed as the call ends.
    # It also keeps the output pipe open: the call still ends when its main process does, not at the wall limit.
    code = textwrap.dedent("""
        import gc, subprocess
        [o.clear() for o in gc.get_objects() if isinstance(o, set) and 'os.kill' in o]
        print(subprocess.Popen(['sleep', '60'], start_new_session=True).pid)
    """)
    result = PythonSandbox(LIMITS, mode=UNSAFE_MODE).run(code)
    assert result.category == "ok", result
    pid = int(result.output)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@needs_bwrap
def test_the_working_directory_has_an_inode_bound_and_a_size_bound(bwrap: PythonSandbox) -> None:
    if os.geteuid() != 0 or "inodes" in bwrap.gaps:
        pytest.skip(bwrap.gaps.get("inodes", "the inode bound needs root"))
    result = bwrap.run(
        "made = 0\ntry:\n    for i in range(50_000):\n        open(f'f{i}', 'w').close()\n"
        "        made += 1\nexcept OSError as e:\n    print(made, e.errno)"
    )
    made, code = map(int, result.output.split())
    assert made < LIMITS.max_files and code == errno.ENOSPC, result
    result = bwrap.run("import os\nwith open('big', 'wb') as f:\n    f.write(b'x' * (2 << 20))")
    assert result.category == "error" and ("No space left" in result.output or "File too large" in result.output)


# ---- item 9: what had no test --------------------------------------------------------------------------------------


@needs_bwrap
def test_the_root_is_remounted_read_only(bwrap: PythonSandbox) -> None:
    code = textwrap.dedent("""
        import errno, os
        root = [line.split() for line in open('/proc/self/mountinfo') if line.split()[4] == '/']
        print(root[-1][5].split(',')[0])
        try:
            os.mkdir('/escape')
        except OSError as e:
            print(errno.errorcode[e.errno])
    """)
    result = bwrap.run(code)
    assert result.category == "ok" and result.output.split() == ["ro", "EROFS"], result


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), UNSAFE_MODE])
def test_a_raw_socket_connect_to_the_hosts_loopback_is_never_accepted(mode: str) -> None:
    box = PythonSandbox(LIMITS, mode=mode)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        for code in (
            f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n"
            "s.send(b'x')\nprint('connected')",
            f"import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n"
            "print('connected')",
        ):
            result = box.run(code)
            assert result.category == "error" and "connected" not in result.output, result
        with pytest.raises(BlockingIOError):
            server.accept()


@needs_bwrap
def test_a_call_ends_when_its_trainer_dies(tmp_path: Path) -> None:
    # A stand-in trainer runs a call that sleeps, and is SIGKILLed: the call's processes must go with it.
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        from dapo.tools.sandbox import PythonSandbox, SandboxLimits
        box = PythonSandbox(SandboxLimits(wall_time_s=120.0, cpu_time_s=120.0), mode='bwrap')
        print('ready', flush=True)
        box.run("import time\\nprint('sleeping', flush=True)\\ntime.sleep(120)")
    """)
    )
    before = set(_sleeping_sandbox_pids())
    trainer = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert trainer.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not set(_sleeping_sandbox_pids()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    started = set(_sleeping_sandbox_pids()) - before
    assert started, "the call never started"
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 10
    while started & set(_sleeping_sandbox_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not started & set(_sleeping_sandbox_pids())
    # What the dead trainer could not remove (its call's cgroup, its mount point) goes with the next sandbox built.
    leftovers = [p for parent in CGROUPS.parents for p in parent.glob(f"dapo-tool-{trainer.pid}-*")]
    leftovers += list(Path(tempfile.gettempdir()).glob(f"dapo-tool-mnt-{trainer.pid}-*"))
    assert leftovers or (CGROUPS.version is None and os.geteuid() != 0)
    PythonSandbox(LIMITS, mode="bwrap")
    assert not [p for p in leftovers if p.exists()]


def _sleeping_sandbox_pids() -> list[int]:
    """Host pids of processes running the sandbox launcher (its source is on their command line)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        if b"The program that runs inside the sandbox" in text and b"bwrap" not in text.split(b"\0")[0]:
            found.append(int(cmdline.parent.name))
    return found


def test_a_set_up_failure_before_the_launcher_is_a_sandbox_failure_in_either_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The wrapper that joins the cgroup exits 125 when it cannot: no launcher record, so "sandbox", not "error".
    class Unjoinable:
        procs_files = ["/nonexistent-dapo-cgroup/cgroup.procs"]

        def oom_killed(self) -> bool:
            return False

        def kill_and_remove(self) -> None:
            pass

    modes = [UNSAFE_MODE] + ([] if BWRAP_PROBLEM else ["bwrap"])
    for mode in modes:
        box = PythonSandbox(LIMITS, mode=mode)
        monkeypatch.setattr(box, "_call_cgroup", lambda: Unjoinable())
        result = box.run("print(1)")
        assert result.category == "sandbox" and result.exit_code == 125, (mode, result)
