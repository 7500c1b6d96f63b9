"""The survivor's message when a torchrun rank dies (the real launch is in test_train_torchrun.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from dapo.distributed.lost_rank import is_lost_peer, local_ranks_gone, lost_rank_message

GLOO = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29517"

# An "agent" that starts ranks 0 and 1 as siblings, as torchrun does; rank 1 exits at once and stays a zombie (the
# agent does not reap it yet), rank 0 reports what it sees.
AGENT = r"""
import os, subprocess, sys, time
env = dict(os.environ, LOCAL_WORLD_SIZE="2")
one = subprocess.Popen([sys.executable, "-c", "pass"], env=dict(env, RANK="1", LOCAL_RANK="1"))
time.sleep(1.0)
code = "from dapo.distributed.lost_rank import local_ranks_gone; print(local_ranks_gone(0, 0, 2))"
zero = subprocess.run([sys.executable, "-c", code], env=dict(env, RANK="0", LOCAL_RANK="0"), capture_output=True,
                      text=True)
print(zero.stdout.strip() or zero.stderr)
one.wait()
"""


def test_backend_errors_about_a_gone_peer_are_recognised() -> None:
    assert is_lost_peer(RuntimeError(GLOO))
    assert not is_lost_peer(RuntimeError("CUDA out of memory"))
    assert not is_lost_peer(ValueError(GLOO))


def test_the_rank_that_exited_is_found_among_the_siblings() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AGENT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    assert done.stdout.strip() == "[1]", done.stdout + done.stderr


def test_the_message_names_the_backend_error_and_the_resume(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    text = lost_rank_message(RuntimeError(GLOO), 0, 2, "Resume works: ...")
    assert text.startswith("rank 0: ") and "Connection closed by peer" in text and text.endswith("Resume works: ...")
    assert "torchrun stopped this rank" in lost_rank_message(None, 0, 2, "")
    assert local_ranks_gone(0, 0, 2) is None  # this test process is no torchrun rank: nothing to compare with
