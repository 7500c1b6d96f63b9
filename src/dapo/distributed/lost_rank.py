"""Naming the rank that died under torchrun, for the ranks that survive it.

When one rank dies (killed, out of memory, a crash in a C extension), the others are waiting in a collective, and
gloo / NCCL raise from it with their own words ("Connection closed by peer", "Connection reset by peer" ...) and a
traceback that names neither rank nor remedy. ``lost_rank_message`` turns such an error into one line: which rank
stopped (found among the sibling processes torchrun started on this machine: a rank whose process is gone or a zombie
is the one that died; on another machine it cannot be seen from here) and where a rerun resumes. torchrun may stop
the survivors (SIGTERM) before any of them reaches a collective: that gets the same message.
"""

from __future__ import annotations

import os
from pathlib import Path

# What the process-group backends say when the process at the other end of a connection has gone.
PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL is aborted",
    "Connection refused",
)


def is_lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` (raised from a collective) says the process of another rank has gone."""
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in PEER_GONE)


def _rank_of(pid: int) -> int | None:
    """The torchrun RANK of live process ``pid`` (None: gone, a zombie, not a rank, or not readable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return None
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return None
    for entry in env:
        if entry.startswith(b"RANK="):
            try:
                return int(entry[5:])
            except ValueError:
                return None
    return None


def local_ranks_gone(rank: int, local_rank: int, local_world_size: int) -> list[int] | None:
    """The ranks of this machine whose process has gone: torchrun starts a machine's ranks as siblings (children of
    its agent) with consecutive ranks, so the live siblings' RANKs are compared with those expected. None where this
    cannot be seen (not Linux, not started by torchrun's agent)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    parent = os.getppid()
    first = rank - local_rank
    expected = set(range(first, first + local_world_size))
    alive = set()
    try:
        entries = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    for pid in entries:
        try:
            stat = (proc / str(pid) / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and (r := _rank_of(pid)) is not None:
            alive.add(r)
    if rank not in alive:  # this process is not one of torchrun's siblings: nothing to compare with
        return None
    return sorted(expected - alive)


def lost_rank_message(exc: BaseException | None, rank: int, world_size: int, resume_hint: str) -> str:
    """One message for a surviving rank: which rank died (when visible from here), how this rank learnt it (the
    backend's error ``exc``, or None: torchrun's SIGTERM, which it sends every rank once one has failed), and
    ``resume_hint`` (where a rerun of the same command resumes)."""
    gone = local_ranks_gone(
        rank, int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    )
    if gone:
        who = f"rank {', '.join(map(str, gone))} of {world_size} died"
    else:
        who = f"another rank of the {world_size} failed (on another machine, or it exited already)"
    if exc is None:
        how = "torchrun stopped this rank (SIGTERM)"
    else:
        said = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        how = f"this rank stopped in a collective with it ({said})"
    return f"rank {rank}: {who}; its own output (or torchrun's summary) says why; {how}. {resume_hint}"
