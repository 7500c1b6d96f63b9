"""Helpers for the reward's helper processes: spawn-safe, killable, and never outliving their parent."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
import sys

SPAWN: multiprocessing.context.SpawnContext = multiprocessing.get_context("spawn")
"""Every helper process is started with "spawn": fork is unsafe once torch or tokenizers run threads."""

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Make the calling process die when its parent does (Linux), and exit now if it already has.

    A helper killed mid-computation cannot clean up its own children, so each child asks the kernel
    to SIGKILL it when the parent goes; elsewhere the pipe to the parent closing ends its loop instead.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def kill_and_reap(process: multiprocessing.process.BaseProcess | None) -> None:
    """SIGKILL ``process`` (a no-op if it already exited) and wait for it, so no zombie is left."""
    if process is None:
        return
    if process.is_alive():
        process.kill()
    process.join(timeout=10)
