"""A rollout worker: a process of its own that owns one engine (HF or vLLM), takes prompts, returns finished
requests, and receives weights from the trainer over a torch.distributed group (``dapo.distributed.weight_transport``).

:class:`RemoteEngine` is the trainer's handle on it. It is a :class:`~dapo.rollout.base.RolloutEngine` (blocking
``generate``, ``update_weights``, ``log_probs_of`` for the weight-sync probe) and a
:class:`~dapo.rollout.base.StreamingEngine` (``submit`` returns at once; the worker generates while the trainer
trains; ``receive`` collects what finished). Control messages (requests, push announcements, results) travel over a
pipe; weights over the process group, never through files.

The worker serves its messages in order: a push announced while a request is generating is loaded once that request
has finished, so a request is sampled under one version (``token_versions`` records it per token).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dapo.rollout.base import FinishedRequest, RolloutOutput, SamplingParams
from dapo.rollout.factory import EngineSpec

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading vLLM on a busy 2-core CPU takes minutes


class RolloutWorkerError(RuntimeError):
    """The rollout worker failed or died; the message carries its traceback or exit code."""


@dataclass(frozen=True)
class WorkerOptions:
    """How the worker process runs.

    Attributes:
        num_threads: torch threads in the worker (None: torch's default); the trainer keeps the rest of the cores.
        drop_pushes_after: fault injection for tests of the weight-sync probe: pushes after this many are received
            but not loaded (None: every push is loaded).
    """

    num_threads: int | None = None
    drop_pushes_after: int | None = None


def _worker_main(spec: EngineSpec, model_cfg: Any, options: WorkerOptions, conn: Any,
                 address: tuple[str, int]) -> None:
    """The worker process: join the weight group, build the engine, then serve messages until ``close``."""
    from dapo.distributed.weight_transport import WeightTransport
    from dapo.model.loading import load_policy
    from dapo.rollout.factory import build_rollout_engine

    try:
        if options.num_threads is not None:
            torch.set_num_threads(options.num_threads)
        transport = WeightTransport.connect(address)
        transport.group  # the rendezvous, before the slow part
        policy = load_policy(model_cfg)
        engine = build_rollout_engine(spec, policy)
        conn.send(("ready", os.getpid()))
    except BaseException:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))
        return
    version, pushes = 0, 0
    try:
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "close":
                break
            try:
                if kind == "generate":
                    _, request_id, prompts, params = message
                    output = engine.generate(prompts, params)
                    conn.send(("finished", request_id, output, version))
                elif kind == "push":
                    _, new_version, layout = message
                    named, stats = transport.receive(layout)
                    pushes += 1
                    if options.drop_pushes_after is None or pushes <= options.drop_pushes_after:
                        engine.update_weights(named)
                        version = new_version
                    conn.send(("pushed", new_version, stats.seconds))
                elif kind == "log_probs":
                    _, prompt, response = message
                    conn.send(("log_probs", engine.log_probs_of(prompt, response)))
                else:
                    conn.send(("error", f"unknown message {kind!r}"))
            except Exception:  # noqa: BLE001 - one failed request must reach the trainer, not kill the worker silently
                conn.send(("error", traceback.format_exc()))
    finally:
        engine.close()
        transport.close()


class RemoteEngine:
    """The trainer's handle on a rollout worker process (module docstring). Build it with :meth:`start`."""

    def __init__(self, process: Any, conn: Any, transport: Any) -> None:
        self._process, self._conn, self._transport = process, conn, transport
        self._next_id = 0
        self._pending: set[int] = set()
        self._aborted: set[int] = set()
        self._finished: list[FinishedRequest] = []
        self._version = 0
        self._stash: list[FinishedRequest] = []  # other requests' results met while a blocking call waited
        self.last_push: dict[str, float] = {}
        self._closed = False

    @classmethod
    def start(cls, spec: EngineSpec, model_cfg: Any, options: WorkerOptions = WorkerOptions()) -> RemoteEngine:
        """Spawn the worker, join the weight group with it, and wait until its engine is built."""
        from dapo.distributed.weight_transport import WeightTransport

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch threads or CUDA state
        transport = WeightTransport.host()
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_worker_main, args=(spec, model_cfg, options, child, transport.address),
                              name="dapo-rollout-worker", daemon=True)
        process.start()
        child.close()
        engine = cls(process, parent, transport)
        try:
            transport.group  # noqa: B018 - the rendezvous with the worker
            kind, value = engine._recv(timeout=START_TIMEOUT_S)
            if kind != "ready":
                raise RolloutWorkerError(f"the rollout worker did not start: {value}")
        except BaseException:
            engine.close()
            raise
        return engine

    # ------------------------------------------------------------------ the streaming interface
    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> int:
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._send(("generate", request_id, [list(p) for p in prompt_token_ids], params))
        self._pending.add(request_id)
        return request_id

    def receive(self, timeout: float | None = None) -> list[FinishedRequest]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished and self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._poll(left):
                break
            self._take(self._recv(timeout=0))
        finished, self._finished = self._stash + self._finished, []
        self._stash = []
        return finished

    def abort(self, request_id: int) -> None:
        # The worker runs a request to its end (its messages are served in order); the result is dropped here.
        if request_id in self._pending:
            self._aborted.add(request_id)

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Announce the push, broadcast the tensors, and wait until the worker has loaded them (it serves requests
        queued before the push first)."""
        layout, tensors = self._transport.layout_of(named_tensors)
        t0 = time.perf_counter()
        self._send(("push", version, layout))
        stats = self._transport.send(layout, tensors)
        while True:
            reply = self._recv(timeout=None)
            if reply[0] == "pushed":
                break
            self._take(reply)
        self._version = version
        self.last_push = {"async/weight_transfer_s": time.perf_counter() - t0,
                          "async/weight_broadcast_s": stats.seconds,
                          "async/weight_transfer_bytes": float(stats.num_bytes)}
        return self.last_push

    # ------------------------------------------------------------------ the blocking RolloutEngine interface
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        request_id = self.submit(prompt_token_ids, params)
        others: list[FinishedRequest] = []
        while True:
            for done in self.receive():
                if done.request_id == request_id:
                    self._stash = others + self._stash  # other requests stay for their receiver
                    return done.output
                others.append(done)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.push_weights(named_tensors, self._version + 1)

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        self._send(("log_probs", list(prompt_token_ids), list(response_ids)))
        while True:
            reply = self._recv(timeout=None)
            if reply[0] == "log_probs":
                return reply[1]
            self._take(reply)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._process.is_alive():
                self._conn.send(("close",))
        except (OSError, EOFError, BrokenPipeError):
            pass
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        self._conn.close()
        self._transport.close()

    # ------------------------------------------------------------------ plumbing
    def _send(self, message: tuple) -> None:
        if self._closed:
            raise RolloutWorkerError("the rollout worker is closed")
        try:
            self._conn.send(message)
        except (OSError, EOFError, BrokenPipeError) as exc:
            raise self._died(exc) from None

    def _poll(self, timeout: float | None) -> bool:
        """Wait for a message, checking every second that the worker is still alive."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            if self._conn.poll(step):
                return True
            if not self._process.is_alive():
                raise self._died(None)
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _recv(self, timeout: float | None) -> tuple:
        if timeout != 0 and not self._poll(timeout):
            raise RolloutWorkerError(f"the rollout worker sent nothing for {timeout:.0f} s")
        try:
            message = self._conn.recv()
        except (OSError, EOFError) as exc:
            raise self._died(exc) from None
        if message[0] == "error":
            raise RolloutWorkerError(f"the rollout worker failed:\n{message[1]}")
        return message

    def _take(self, message: tuple) -> None:
        """File a request's result (the only unsolicited message) under the finished ones."""
        if message[0] != "finished":
            raise RolloutWorkerError(f"unexpected message from the rollout worker: {message[0]!r}")
        _, request_id, output, version = message
        self._pending.discard(request_id)
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return
        self._finished.append(FinishedRequest(request_id, output, [[version] * len(ids)
                                                                   for ids in output.response_ids]))

    def _died(self, exc: BaseException | None) -> RolloutWorkerError:
        self._process.join(timeout=5)
        code = self._process.exitcode
        return RolloutWorkerError(f"the rollout worker process exited (exit code {code})"
                                  + (f": {exc}" if exc else ""))
