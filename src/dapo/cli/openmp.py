"""OpenMP's waiting policy, chosen before torch (and its libgomp) is loaded: passive, for every command.

When a parallel region ends, libgomp's threads either spin for a while before sleeping (its default: up to 300,000
iterations) or sleep at once (``OMP_WAIT_POLICY=PASSIVE``). Spinning wins only while dapo owns the cores; beside
anything else that computes (a second run, a test suite, an editor's indexer, a rollout worker) the spinning threads
burn the time slices the working thread needs. Measured with ``scripts/bench_omp_policy.py`` (3-step `dapo train`
of the tiny task, docs/performance.md "OpenMP waiting policy"): spinning is ~1.2x faster alone and ~2x slower beside
one busy process, and a short spin (GOMP_SPINCOUNT=10000) collapses the same way. A default should not collapse
under contention (#39 item 12), so every command waits passively. A user who owns the machine opts back in by
exporting either variable (``GOMP_SPINCOUNT=300000`` is libgomp's default spin); an exported value is never changed.
"""

from __future__ import annotations

import os


def default_to_passive() -> None:
    """Passive waiting unless the user chose a policy (called by ``dapo.cli.main`` before anything imports torch)."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
