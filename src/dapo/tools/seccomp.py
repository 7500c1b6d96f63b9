"""The tool sandbox's system-call filter: a classic-BPF seccomp program, assembled here, that bubblewrap loads
(``--seccomp FD``) right before it starts the launcher.

The namespaces already take the host's files, network and processes out of reach; the filter removes the kernel
interfaces a contained process has no use for and that have been the way out of containers: mounting (a new mount
or user namespace would let an unprivileged process mount), new namespaces (``unshare``, ``setns``, ``clone`` with a
namespace flag; ``clone3`` answers ENOSYS, so the C library falls back to ``clone``, whose flags the filter can read),
the kernel keyring, eBPF, userfaultfd, io_uring (its operations bypass seccomp), ptrace and cross-process memory
access, module and kexec loading, and calls aimed at *another* process's limits, priority or CPU set (``prlimit64``,
``setpriority``, ``sched_setaffinity`` with a pid other than 0, the caller itself), and pidfds. A denied call fails
with EPERM (the code sees an ordinary ``PermissionError``); a system call of another ABI (x32, i386) kills the process.

Only the x86-64 numbering is written here (``asm/unistd_64.h``; tests/tools check it against the header where the
host has one); on another architecture :func:`seccomp_filter` returns None and the sandbox runs without a filter,
saying so (docs/tools.md).
"""

from __future__ import annotations

import platform
import struct

# <linux/audit.h>, <linux/seccomp.h>, <linux/filter.h>
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
EPERM, ENOSYS = 1, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARGS_OFFSET = 0, 4, 16  # struct seccomp_data

# The namespace flags of clone(2) (<linux/sched.h>): a clone with any of them is refused.
CLONE_NAMESPACES = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME

X86_64 = {
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "unshare": 272,
    "setns": 308,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "open_tree": 428,
    "move_mount": 429,
    "mount_setattr": 442,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "perf_event_open": 298,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "pidfd_open": 434,
    "pidfd_send_signal": 424,
    "pidfd_getfd": 438,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "acct": 163,
    "quotactl": 179,
    "syslog": 103,
    "iopl": 172,
    "ioperm": 173,
    "sethostname": 170,
    "setdomainname": 171,
    "settimeofday": 164,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "adjtimex": 159,
    "lookup_dcookie": 212,
    "vhangup": 153,
    # filtered on an argument, and clone3 (ENOSYS) below
    "clone": 56,
    "clone3": 435,
    "prlimit64": 302,
    "setpriority": 141,
    "sched_setaffinity": 203,
}
# Refused whatever their arguments.
DENIED: tuple[str, ...] = tuple(
    name for name in X86_64 if name not in ("clone", "clone3", "prlimit64", "setpriority", "sched_setaffinity")
)
# Refused when the pid argument (its index) names another process than the caller (0).
OTHER_PROCESS_ARG: dict[str, int] = {"prlimit64": 0, "setpriority": 1, "sched_setaffinity": 0}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _load_nr() -> bytes:
    return _op(BPF_LD_W_ABS, NR_OFFSET)


def _ret(value: int) -> bytes:
    return _op(BPF_RET_K, value)


def build_filter(table: dict[str, int] = X86_64, arch: int = AUDIT_ARCH_X86_64) -> bytes:
    """The filter program (an array of ``struct sock_filter``), as bubblewrap's ``--seccomp`` reads it."""
    prog = [
        _op(BPF_LD_W_ABS, ARCH_OFFSET),
        _op(BPF_JEQ_K, arch, jt=1),
        _ret(SECCOMP_RET_KILL_PROCESS),
        _load_nr(),
        _op(BPF_JGE_K, X32_SYSCALL_BIT, jf=1),
        _ret(SECCOMP_RET_KILL_PROCESS),
    ]
    for name in DENIED:  # A holds the syscall number throughout these pairs
        prog += [_op(BPF_JEQ_K, table[name], jf=1), _ret(SECCOMP_RET_ERRNO | EPERM)]
    prog += [_op(BPF_JEQ_K, table["clone3"], jf=1), _ret(SECCOMP_RET_ERRNO | ENOSYS)]
    # clone: the flags' low word (args[0]) must hold no namespace flag.
    prog += [
        _op(BPF_JEQ_K, table["clone"], jf=3),  # not clone: to the reload
        _op(BPF_LD_W_ABS, ARGS_OFFSET),  # args[0], low 32 bits
        _op(BPF_JSET_K, CLONE_NAMESPACES, jf=1),
        _ret(SECCOMP_RET_ERRNO | EPERM),
        _load_nr(),
    ]
    for name, arg in OTHER_PROCESS_ARG.items():  # pid argument != 0 (both 32-bit halves checked)
        low = ARGS_OFFSET + 8 * arg
        prog += [
            _op(BPF_JEQ_K, table[name], jf=5),  # not this call: to the reload
            _op(BPF_LD_W_ABS, low),
            _op(BPF_JEQ_K, 0, jf=2),  # low half non-zero: deny
            _op(BPF_LD_W_ABS, low + 4),
            _op(BPF_JEQ_K, 0, jt=1),  # both halves zero: to the reload
            _ret(SECCOMP_RET_ERRNO | EPERM),
            _load_nr(),
        ]
    prog.append(_ret(SECCOMP_RET_ALLOW))
    return b"".join(prog)


def seccomp_filter() -> bytes | None:
    """The filter for this machine's architecture, or None where no syscall table is written here."""
    return build_filter() if platform.machine() in ("x86_64", "AMD64") else None


def seccomp_problem() -> str | None:
    """Why calls run without the filter here (None: they run with it)."""
    return (
        None
        if seccomp_filter() is not None
        else (f"no seccomp filter: only the x86-64 system-call table is written (this machine: {platform.machine()})")
    )
