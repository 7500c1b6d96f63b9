"""The program that runs inside the sandbox: it sets the limits, drops privileges, then runs the untrusted code.

This file is passed to ``python -I -c`` as source text (:data:`LAUNCHER_SOURCE`), never imported inside the sandbox,
so it uses the standard library only and nothing of ``dapo``. It reads a JSON header line and then the code from
stdin. When the code raises, it writes a one-line JSON record ``{"outcome": "exception" | "memory"}`` on the status
pipe named by the header's ``status_fd`` (never stdout/stderr) and exits with :data:`EXIT_EXCEPTION` /
:data:`EXIT_MEMORY`. The parent classifies from that record, not from the exit status: the code's own
``sys.exit(n)`` / ``os._exit(n)`` can choose any status (82 included), and is then reported as an exit with that
status. The code runs in this process and could write that pipe too, but a record it writes can only claim what it
could get by raising (``raise MemoryError``); its exit status and its printed text claim nothing.

Order matters: limits first (so nothing later runs unlimited), then the identity change (dropping every capability
a root launcher held), then, in the ``unsafe-no-isolation`` mode only, the Python audit hook (no boundary: it turns
away accidents); only then the code.
"""

from __future__ import annotations

EXIT_EXCEPTION = 81
EXIT_MEMORY = 82


def main() -> None:  # pragma: no cover - runs in the sandboxed child (tests observe it through the sandbox)
    import ast
    import io
    import json
    import os
    import resource
    import sys
    import traceback

    header = json.loads(sys.stdin.buffer.readline())
    status_fd = int(header["status_fd"])

    def report(outcome: str) -> None:
        # The outcome goes on its own pipe, not in the exit status: the code's sys.exit(n) / os._exit(n) can set any
        # status, so a status alone never says "memory" (the parent reads this record).
        try:
            os.write(status_fd, json.dumps({"outcome": outcome}).encode() + b"\n")
        except OSError:
            pass

    code = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    sys.stdin.close()
    # The sandbox's set-up (bubblewrap, the cgroup, the tmpfs) is done once this runs: without this record the parent
    # reports a "sandbox" failure, whatever the exit status says.
    try:
        os.write(status_fd, b'{"started": true}\n')
    except OSError:
        pass

    # Limits: hard == soft, so the code cannot raise them again (it never holds CAP_SYS_RESOURCE).
    cpu = int(header["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu s, SIGKILL one second later
    memory = int(header["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    fsize = int(header["file_size_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(header["open_files"]),) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if header["nproc"] is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (int(header["nproc"]),) * 2)

    uid = header["uid"]
    if uid is not None:  # a root launcher becomes an unprivileged user of its own (RLIMIT_NPROC binds it)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    if header["audit"]:
        _die_with_parent_no_new_privs()
        _install_audit_hook(header["workdir"], header["read_roots"])

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        tree = ast.parse(code, filename="<tool>")
        # A bare expression as the last statement prints its value, as an interactive interpreter does.
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<tool>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except MemoryError:
        del namespace
        sys.stderr.write("MemoryError: the code exceeded the sandbox's memory limit\n")
        sys.stderr.flush()
        report("memory")
        os._exit(EXIT_MEMORY)
    except SystemExit as exc:
        sys.stdout.flush()
        code_ = exc.code
        os._exit(code_ if isinstance(code_, int) else (0 if code_ is None else 1))
    except BaseException as exc:  # noqa: BLE001 - any failure of the code is the code's result
        sys.stdout.flush()
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tool>"]
        text = io.StringIO()
        if frames:
            text.write("Traceback (most recent call last):\n")
            text.write("".join(traceback.format_list(frames)))
        text.write("".join(traceback.format_exception_only(type(exc), exc)))
        sys.stderr.write(text.getvalue())
        sys.stderr.flush()
        report("exception")
        os._exit(EXIT_EXCEPTION)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _die_with_parent_no_new_privs() -> None:  # pragma: no cover - sandboxed child
    """The unsafe mode's two prctl(2) calls (bubblewrap makes both itself): the launcher is SIGKILLed when the trainer
    dies, and nothing it execs gains privileges (setuid bits, file capabilities). ctypes is still allowed here: the
    audit hook that refuses it comes next."""
    import ctypes
    import os
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig, pr_set_no_new_privs = 1, 38
    parent = os.getppid()
    libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0)
    if os.getppid() != parent:  # the trainer died before the death signal was armed
        os._exit(1)


def _install_audit_hook(workdir: str, read_roots: list[str]) -> None:  # pragma: no cover - sandboxed child
    """The ``unsafe-no-isolation`` mode's only file, network and process fence: a Python audit hook (PEP 578).

    It refuses opening files outside ``workdir`` (reads are also allowed under the interpreter's own prefixes, for
    imports), sockets, signals to other processes, new processes and ctypes. An audit hook is not a security
    boundary (docs/tools.md says what slips past it); it stops the accidents and the obvious hostile calls.
    """
    import os
    import sys

    work = os.path.realpath(workdir) + os.sep
    roots = tuple(os.path.realpath(r) + os.sep for r in read_roots)
    forbidden = {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.getaddrinfo",
        "os.kill",
        "os.killpg",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.exec",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "os.startfile",
        "pty.spawn",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "ctypes.call_function",
        "os.chdir",
        "os.chroot",
        "os.symlink",
        "os.link",
    }
    file_events = {
        "open",
        "os.listdir",
        "os.scandir",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.truncate",
        "os.chmod",
        "os.chown",
        "shutil.rmtree",
        "shutil.copyfile",
    }

    def allowed_path(path: object, writing: bool) -> bool:
        if isinstance(path, int):  # an already open descriptor: it was checked when it was opened
            return True
        try:
            real = os.path.realpath(os.fsdecode(path)) + os.sep
        except (TypeError, ValueError):
            return False
        if real.startswith(work):
            return True
        return not writing and real.startswith(roots)

    def hook(event: str, args: tuple) -> None:
        if event in forbidden:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in file_events and args:
            writing = event != "os.listdir" and event != "os.scandir"
            if event == "open":
                mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
                flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
                writing = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
                if args[0] is None:
                    return
            if not allowed_path(args[0], writing):
                raise PermissionError(f"sandbox: {event} outside the sandbox directory: {args[0]!r}")

    os.chdir(workdir)
    sys.addaudithook(hook)


if __name__ == "__main__":  # pragma: no cover
    main()
