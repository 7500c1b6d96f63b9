"""OpenMP's waiting policy, chosen per command before torch (and its libgomp) is loaded.

When a parallel region ends, libgomp's threads either spin for a while (its default) or sleep at once (``PASSIVE``).
Measured on this project's 2-core machine (``docs/performance.md``):

* alone in its process, the trainer's update of the tiny model takes 3.2 s spinning and 4.9 s passive: thousands of
  small operators per step each wake sleeping threads;
* with another process computing on the same cores (a vLLM engine core, a server and its clients, a busy neighbour),
  spinning threads steal the other process's time slices: 11.4 s spinning, 5.6 s passive, and far worse with vLLM.

So the CLI defaults to passive waiting, and ``dapo train`` with the in-process Transformers engine, where nothing
else computes alongside, goes back to libgomp's default. A value the user exported is never changed.
"""

from __future__ import annotations

import os

_USER_CHOSE = "OMP_WAIT_POLICY" in os.environ


def default_to_passive() -> None:
    """Passive waiting unless the user chose a policy (called by ``dapo.cli.main`` before anything imports torch)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def spin_when_alone(alone: bool) -> None:
    """Back to libgomp's own default when this process is the only one computing, unless the user chose a policy.

    Effective only before torch is imported (libgomp reads the variable once, when it loads)."""
    if alone and not _USER_CHOSE and os.environ.get("OMP_WAIT_POLICY") == "PASSIVE":
        del os.environ["OMP_WAIT_POLICY"]
