"""The worker whose weight broadcast fails: it stops naming the broadcast as its stage, whether the trainer's
control channel closes a moment later (a killed trainer: its sockets close one by one, the weight group's first) or
stays open (the group broke under a live trainer). Driven through a real pipe, with a transport whose broadcast
raises as gloo does when its peer is gone."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe

import pytest

from dapo.rollout.worker import TrainerGone, WeightGroupBroke, WorkerOptions, _LockedConnection, _Worker


class _BrokenGroup:
    def receive(self, layout):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234")


class _NoEngine:
    def update_weights(self, named):
        raise AssertionError("a failed broadcast loaded weights")


def _worker_with_push_announced(version: int, stall_timeout_s: float = 30.0):
    trainer, worker_end = Pipe()
    trainer.send((1, ("push", version, object())))
    worker = _Worker(
        _NoEngine(), _BrokenGroup(), _LockedConnection(worker_end), WorkerOptions(stall_timeout_s=stall_timeout_s)
    )
    return trainer, worker


def test_a_trainer_whose_control_channel_closes_after_the_group_broke_is_gone_at_the_broadcast() -> None:
    trainer, worker = _worker_with_push_announced(version=2)
    # the killed trainer's control socket closes 0.3 s after its weight group did, the worker's error unread
    threading.Timer(0.3, trainer.close).start()
    t0 = time.monotonic()
    with pytest.raises(TrainerGone) as gone:
        worker.serve()
    assert time.monotonic() - t0 < 5  # the close ends the wait, not the deadline
    assert "while the worker was receiving the weight broadcast of version 2;" in str(gone.value)


def test_a_group_that_broke_under_a_live_trainer_stops_the_worker_naming_the_broadcast_and_tells_the_trainer() -> None:
    trainer, worker = _worker_with_push_announced(version=3, stall_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(WeightGroupBroke) as broke:
        worker.serve()
    waited = time.monotonic() - t0
    assert 1.0 <= waited < 5, waited  # the wait is bounded by the stall deadline
    message = str(broke.value)
    assert "the weight group broke (RuntimeError: [gloo" in message
    assert "while the worker was receiving the weight broadcast of version 3;" in message
    number, reply = trainer.recv()
    assert number == 1 and reply[0] == "error"
    assert reply[1].startswith(
        "the weight group broke while the worker was receiving the weight broadcast of version 3"
    )


def test_a_close_from_the_trainer_after_the_group_broke_ends_the_wait_at_once() -> None:
    trainer, worker = _worker_with_push_announced(version=2)
    threading.Timer(0.3, lambda: trainer.send((2, ("close",)))).start()
    t0 = time.monotonic()
    with pytest.raises(WeightGroupBroke):
        worker.serve()
    assert time.monotonic() - t0 < 5
