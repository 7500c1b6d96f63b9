"""A rollout worker: a process of its own that owns one engine (HF or vLLM), takes prompts, returns finished
requests, and receives weights from the trainer over a torch.distributed group (``dapo.distributed.weight_transport``).
The process is spawned by the trainer (:meth:`RemoteEngine.start`, control over a pipe) or is a rollout rank of a
torchrun job (:meth:`RemoteEngine.on_rank` and :func:`serve_on_rank`, control over TCP): the same worker either way.

:class:`RemoteEngine` is the trainer's handle on it. It is a :class:`~dapo.rollout.base.RolloutEngine` (blocking
``generate``, ``update_weights``, ``log_probs_of`` for the weight-sync probe) and a
:class:`~dapo.rollout.base.StreamingEngine` (``submit`` returns at once; the worker generates while the trainer
trains; ``receive`` collects what finished). Control messages (requests, push announcements, results) travel over a
pipe; weights over the process group, never through files.

The worker serves its messages in order: a push announced while a request is generating is loaded once that request
has finished, so a request is sampled under one version (``token_versions`` records it per token).

The control channel's integrity: every message of the worker (replies and heartbeats) carries its number, so the
trainer sees a message that cannot be read (a garbled frame) or one that never arrived (the next number is not the
one due; a heartbeat follows within seconds, so a lost last reply shows too). Either way nothing on the channel can
be trusted any more: the worker is stopped and the wait raises ``RolloutWorkerDied`` naming the stage and the
worker, which a run recovers from as from a dead worker (a new process, the current weights pushed, the batch in
flight generated again). The other direction is numbered the same way: the trainer numbers what it sends and sends
a heartbeat of its own, so the worker sees a frame from the trainer it cannot read, or a number that skips one (a
request that never reached it: its next message, at the latest the trainer's next heartbeat, shows it), and ends
with one line naming the message, which the trainer's wait turns into ``RolloutWorkerDied`` as above.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dapo.rollout.base import FinishedRequest, RolloutOutput, SamplingParams
from dapo.rollout.sample_routes import routes_so_far
from dapo.rollout.spec import EngineSpec

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading vLLM on a busy 2-core CPU takes minutes


class RolloutWorkerError(RuntimeError):
    """The rollout worker failed or died; the message carries its traceback or exit code."""


@dataclass(frozen=True)
class MessageFault:
    """Fault injection for tests of the control channel: the first message of kind ``kind`` that one side sends
    goes out garbled (a frame that is no message, ``garble=True``) or is never sent (``garble=False``)."""

    kind: str
    garble: bool = True


GARBLED_FRAME = b"\x80\x05garbled"  # a frame of the right length header whose body is no pickle


class _NumberedSender:
    """One side's sending end of the control channel: numbers each message (module docstring), one send at a time
    (the caller holds the lock), ``fault`` applied once."""

    def __init__(self, conn: Any, fault: MessageFault | None = None) -> None:
        self._conn, self._fault = conn, fault
        self.sent = 0

    def send(self, message: tuple) -> None:
        self.sent += 1
        if self._fault is not None and message[0] == self._fault.kind:
            fault, self._fault = self._fault, None
            if fault.garble:
                self._conn.send_bytes(GARBLED_FRAME)
            return
        self._conn.send((self.sent, message))


@dataclass(frozen=True)
class WorkerOptions:
    """How the worker process runs.

    Attributes:
        num_threads: torch threads in the worker (None: torch's default); the trainer keeps the rest of the cores.
        drop_pushes_after: fault injection for tests of the weight-sync probe: pushes after this many are received
            but not loaded (None: every push is loaded).
        partial_chunk_tokens: partial rollouts: generate requests in segments of this many tokens and load a push
            that arrived between two segments (None: a push waits until the running request has finished).
        reply_fault: fault injection for tests of the control channel (:class:`MessageFault`), in the worker's
            messages; a respawned worker runs without it (the fault's recovery is what is tested).
        request_fault: the same in the trainer's messages to the worker (applied by :class:`RemoteEngine`).
        device: where the worker loads its engine (``dapo.distributed.placement``: the trainer's GPU for a spawned
            worker, ``cuda:LOCAL_RANK`` on a rollout rank, or the CPU).
        weight_backend: the weight group's backend (``gloo``, or ``nccl`` between ranks on GPUs of their own).
        record_routes: R3 (``actor.router_replay.mode``): the worker's engine records the experts each token was
            routed to and returns them in ``RolloutOutput.routed_experts`` (an MoE model only).
    """

    num_threads: int | None = None
    drop_pushes_after: int | None = None
    partial_chunk_tokens: int | None = None
    stall_timeout_s: float = 300.0
    reply_fault: MessageFault | None = None
    request_fault: MessageFault | None = None
    device: str = "cpu"
    weight_backend: str = "gloo"
    record_routes: bool = False

    @property
    def heartbeat_s(self) -> float:
        """How often the worker says it is alive (:func:`heartbeat_interval`)."""
        return heartbeat_interval(self.stall_timeout_s)


def heartbeat_interval(stall_timeout_s: float) -> float:
    """How often each side of the control channel says it is alive: several times per stall deadline, at most every
    5 s."""
    return min(5.0, stall_timeout_s / 5)


class RolloutWorkerDied(RolloutWorkerError):
    """The worker process is gone (killed, crashed); ``engine`` is the handle it belonged to (``respawn`` replaces
    it with a new process)."""

    def __init__(self, message: str, engine: RemoteEngine) -> None:
        super().__init__(message)
        self.engine = engine


class RolloutWorkerStalled(RolloutWorkerError):
    """The worker is alive but has shown no sign of progress for ``stall_timeout_s`` (stopped, or hung)."""


class TrainerGone(RolloutWorkerError):
    """The worker's side: the trainer's end of the control channel or of the weight group closed (the trainer
    exited or was killed) while the worker was at some stage; the worker stops, saying which, instead of waiting."""


class WeightGroupBroke(RolloutWorkerError):
    """The worker's side: a broadcast of the weight group failed while the trainer's control channel stayed open
    (a network fault, or gloo gave up): the group cannot carry another push, so the worker stops, naming the stage,
    after telling the trainer."""


class _BroadcastFailed(Exception):
    """The weight group's broadcast raised in the worker (its peer is gone, or gloo gave up)."""


class _LockedConnection:
    """The worker's end of the pipe, shared by the serving loop and the heartbeat thread: one numbered send at a
    time (:class:`_NumberedSender`)."""

    def __init__(self, conn: Any, fault: MessageFault | None = None) -> None:
        self._conn, self._lock = conn, threading.Lock()
        self._sender = _NumberedSender(conn, fault)

    def send(self, message: tuple) -> None:
        with self._lock:
            self._sender.send(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _heartbeat(conn: _LockedConnection, every_s: float, stop: threading.Event) -> None:
    """Tell the trainer this process still runs (a stopped or hung process goes silent: RolloutWorkerStalled)."""
    while not stop.wait(every_s):
        try:
            conn.send(("alive",))
        except (OSError, EOFError, BrokenPipeError):
            return


def _segment_seed(seed: int, sample: int, segment: int) -> int:
    """The seed of a segment of a partial rollout: a function of the request's seed, the sample and the segment."""
    return (seed * 1_000_003 + sample * 7_919 + segment * 104_729 + 1) % (1 << 62)


class _UnreadableMessage(Exception):
    """A frame from the trainer that is no message, or a message of the trainer's that never arrived: the worker
    stops, telling the trainer why (one line naming the message)."""


class _NumberedReceiver:
    """The worker's receiving end: checks that the trainer's messages arrive numbered one after another (module
    docstring) and drops the trainer's heartbeats, which only carry their number."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.received = 0

    def receive(self) -> tuple:
        """The next message that is not a heartbeat (blocking)."""
        while True:
            message = self._receive_one()
            if message[0] != "alive":
                return message

    def receive_ready(self) -> tuple | None:
        """The next message that has arrived and is not a heartbeat; None when none is there."""
        while self._conn.poll(0):
            message = self._receive_one()
            if message[0] != "alive":
                return message
        return None

    def _receive_one(self) -> tuple:
        due = self.received + 1
        try:
            frame = self._conn.recv()
        except (OSError, EOFError):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever unpickling a garbled frame raises
            raise _UnreadableMessage(
                f"the trainer's message {due} could not be read ({type(exc).__name__}: {exc})"
            ) from None
        if not (isinstance(frame, tuple) and len(frame) == 2 and isinstance(frame[1], tuple) and frame[1]):
            raise _UnreadableMessage(f"the trainer's message {due} is no message ({type(frame).__name__})")
        number, message = frame
        if number != due:
            raise _UnreadableMessage(
                f"the trainer's message {due} never reached the worker (message {number} came next)"
            )
        if not isinstance(message[0], str):
            raise _UnreadableMessage(f"the trainer's message {due} is no message ({type(message[0]).__name__})")
        self.received = number
        return message


class _Worker:
    """The worker's side: serves messages in order; with ``partial_chunk_tokens`` a request is generated in segments
    of that many tokens, and a push that arrived meanwhile is loaded between two segments (the samples continue under
    the new weights, keeping their tokens; each token keeps the version that drew it)."""

    def __init__(self, engine: Any, transport: Any, conn: Any, options: WorkerOptions) -> None:
        self.engine, self.transport, self.conn, self.options = engine, transport, conn, options
        self.incoming = _NumberedReceiver(conn)
        self.version, self.pushes = 0, 0
        self.inbox: collections.deque[tuple] = collections.deque()
        self.stage = "waiting for the trainer's next message"  # what the worker does now (TrainerGone names it)

    def next_message(self) -> tuple:
        return self.inbox.popleft() if self.inbox else self.incoming.receive()

    def serve(self) -> None:
        try:
            while True:
                self.stage = "waiting for the trainer's next message"
                message = self.next_message()
                if message[0] == "close":
                    return
                try:
                    self.handle(message)
                except (_UnreadableMessage, _BroadcastFailed, OSError, EOFError):
                    raise
                except Exception as exc:  # noqa: BLE001 - one failed request must reach the trainer, not kill the worker
                    failure = traceback.format_exc()
                    try:
                        self.conn.send(("error", failure))
                    except OSError:  # nobody to tell: the trainer is gone (e.g. the weight group broke with it)
                        raise self.trainer_gone(exc) from None
        except _UnreadableMessage as exc:  # the channel cannot be trusted any more (module docstring)
            self.conn.send(("broken", str(exc)))
        except _BroadcastFailed as exc:
            raise self.weight_group_broke(exc.__cause__ or exc) from None
        except (OSError, EOFError) as exc:  # the trainer's end of the control channel closed
            raise self.trainer_gone(exc) from None

    def weight_group_broke(self, exc: BaseException) -> RolloutWorkerError:
        """A broken weight group cannot carry another push, so the worker stops. Its usual cause is a trainer that
        is gone; a killed process's sockets close one by one, so its control channel may close a moment after the
        group broke. The worker tells the trainer, then waits that moment (bounded) for the channel to close: a
        closed channel is a trainer that is gone, an open one a group that broke under a live trainer. Either way
        the stage named is the broadcast (without the wait, a channel that closed later was reported as the next
        message's wait)."""
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        deadline = time.monotonic() + min(10.0, self.options.stall_timeout_s)
        try:
            self.conn.send(("error", f"the weight group broke while the worker was {self.stage}: {detail}"))
            while (left := deadline - time.monotonic()) > 0:
                if self.conn.poll(left) and self.conn.recv()[1][0] == "close":
                    break
        except (OSError, EOFError) as closed:
            return self.trainer_gone(closed)
        except Exception:  # noqa: BLE001, S110 - an unreadable frame: the channel is past use anyway
            pass
        return WeightGroupBroke(
            f"rollout worker (pid {os.getpid()}): the weight group broke ({type(exc).__name__}: {detail}) while the "
            f"worker was {self.stage}; the worker stopped. A rerun of the trainer's command resumes from its last "
            "checkpoint"
        )

    def trainer_gone(self, exc: BaseException) -> TrainerGone:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return TrainerGone(
            f"rollout worker (pid {os.getpid()}): the trainer is gone (its end closed: {detail}) while the worker was "
            f"{self.stage}; the worker stopped. A rerun of the trainer's command resumes from its last checkpoint"
        )

    def handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "generate":
            _, request_id, prompts, params = message
            self.stage = f"generating request {request_id}"
            if self.options.partial_chunk_tokens is None:
                output = self.engine.generate(prompts, params)
                versions = [[self.version] * len(ids) for ids in output.response_ids]
            else:
                output, versions = self.generate_in_segments(prompts, params)
            self.conn.send(("finished", request_id, _routes_as_arrays(output), versions))
        elif kind == "push":
            _, new_version, layout = message
            self.stage = f"receiving the weight broadcast of version {new_version}"
            try:
                named, stats = self.transport.receive(layout)
            except RuntimeError as exc:  # gloo's error for a peer that is gone or a broadcast it gave up on
                raise _BroadcastFailed() from exc
            self.pushes += 1
            if self.options.drop_pushes_after is None or self.pushes <= self.options.drop_pushes_after:
                self.engine.update_weights(named)
                self.version = new_version
            self.conn.send(("pushed", new_version, stats.seconds))
        elif kind == "log_probs":
            _, prompt, response = message
            self.stage = "scoring the weight probe"
            self.conn.send(("log_probs", self.engine.log_probs_of(prompt, response)))
        else:
            self.conn.send(("error", f"unknown message {kind!r}"))

    def take_pushes(self) -> None:
        """Between two segments: serve the pushes and probes that arrived; keep other messages for later."""
        generating = self.stage
        while (message := self.incoming.receive_ready()) is not None:
            if message[0] in ("push", "log_probs"):
                self.handle(message)
                self.stage = generating
            else:
                self.inbox.append(message)

    def generate_in_segments(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[RolloutOutput, list[list[int]]]:
        n, chunk = params.n, self.options.partial_chunk_tokens
        assert chunk is not None
        seeds = params.prompt_seeds or tuple(params.seed or 0 for _ in prompts)
        ids: list[list[int]] = [[] for _ in range(len(prompts) * n)]
        logprobs: list[list[float]] = [[] for _ in ids]
        versions: list[list[int]] = [[] for _ in ids]
        reasons: list[str | None] = [None] * len(ids)
        routes: list[torch.Tensor] | None = None  # R3: per sample, [prompt + response tokens, layers, k]
        segment = 0
        while any(r is None for r in reasons):
            if segment > 0:
                self.take_pushes()
            active = [k for k, r in enumerate(reasons) if r is None]
            room = [params.max_tokens - len(ids[k]) for k in active]
            step = dataclasses.replace(
                params,
                n=1,
                max_tokens=min(chunk, min(room)),
                seed=_segment_seed(params.seed or 0, 0, segment),
                prompt_seeds=tuple(_segment_seed(seeds[k // n], k % n, segment) for k in active),
            )
            out = self.engine.generate([prompts[k // n] + ids[k] for k in active], step)
            for j, k in enumerate(active):
                if out.routed_experts is not None:
                    if routes is None:
                        routes = [torch.empty(0, dtype=out.routed_experts[j].dtype) for _ in ids]
                    routes[k] = routes_so_far(routes[k], out.routed_experts[j])
                ids[k] += out.response_ids[j]
                logprobs[k] += out.logprobs[j]
                versions[k] += [self.version] * len(out.response_ids[j])
                if out.finish_reason[j] == "stop":
                    reasons[k] = "stop"
                elif len(ids[k]) >= params.max_tokens:
                    reasons[k] = "length"
            segment += 1
        output = RolloutOutput(
            [k // n for k in range(len(ids))], ids, logprobs, [str(r) for r in reasons], routed_experts=routes
        )
        return output, versions


def _routes_as_arrays(output: RolloutOutput) -> RolloutOutput:
    """The output as it crosses the control channel: routes as numpy arrays, pickled by value. A tensor would go as
    a shared-memory handle (torch's reducers), which a torchrun rank cannot open from another rank's process (the
    resource sharer's handshake needs a common authkey) and which costs a descriptor per sample."""
    if output.routed_experts is None:
        return output
    return dataclasses.replace(output, routed_experts=[r.numpy() for r in output.routed_experts])


def _routes_as_tensors(output: RolloutOutput) -> RolloutOutput:
    """:func:`_routes_as_arrays` undone on the trainer's side."""
    if output.routed_experts is None:
        return output
    return dataclasses.replace(output, routed_experts=[torch.from_numpy(r) for r in output.routed_experts])


def _worker_main(spec: EngineSpec, model_cfg: Any, options: WorkerOptions, conn: Any, address: tuple[str, int]) -> None:
    """The worker process: join the weight group, build the engine, then serve messages until ``close``; a trainer
    that is gone ends it with one line and exit code 1 (no traceback: nobody reads it but the user)."""
    try:
        _serve(spec, model_cfg, options, conn, address)
    except (TrainerGone, WeightGroupBroke) as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


@dataclass(frozen=True)
class RankContact:
    """What a rollout rank needs to serve the trainer rank (``RemoteEngine.on_rank``): the engine and how it runs,
    where the control connection listens (and its key), where the weight group meets. Small and picklable: the
    trainer rank hands it over torchrun's own group, once."""

    spec: EngineSpec
    model_cfg: Any
    options: WorkerOptions
    control: tuple[str, int]
    authkey: bytes
    weights: tuple[str, int]
    weight_rank: int = 1  # this engine's rank in the weight group (the trainer is 0)
    weight_size: int = 2  # the trainer and every engine one push reaches


def serve_on_rank(contact: RankContact, device: str | None = None) -> None:
    """A torchrun rank given to the rollout (disaggregated training): connect to the trainer rank, then run the same
    worker as a spawned process does, until the trainer closes it. ``device``: where this rank loads its engine
    (its own GPU; None: as the contact's options say)."""
    from multiprocessing.connection import Client

    conn = Client(contact.control, authkey=contact.authkey)
    try:
        _serve(
            contact.spec,
            contact.model_cfg,
            contact.options if device is None else dataclasses.replace(contact.options, device=device),
            conn,
            contact.weights,
            contact.weight_rank,
            contact.weight_size,
        )
    finally:
        conn.close()


def _serve(
    spec: EngineSpec,
    model_cfg: Any,
    options: WorkerOptions,
    conn: Any,
    address: tuple[str, int],
    weight_rank: int = 1,
    weight_size: int = 2,
) -> None:
    from dapo.distributed.weight_transport import WeightTransport
    from dapo.rollout.loaded_engine import load_model_engine

    conn = _LockedConnection(conn, options.reply_fault)
    stop_heartbeat = threading.Event()
    threading.Thread(
        target=_heartbeat, args=(conn, options.heartbeat_s, stop_heartbeat), name="dapo-heartbeat", daemon=True
    ).start()
    try:
        if options.num_threads is not None:
            torch.set_num_threads(options.num_threads)
        transport = WeightTransport.connect(
            address,
            timeout_s=options.stall_timeout_s,
            rank=weight_rank,
            size=weight_size,
            backend=options.weight_backend,
        )
        transport.group  # noqa: B018 - the rendezvous, before the slow part
        # A LoRA trainer pushes only its adapters (dapo.training.weight_sync): the engine holds the same ones.
        engine = load_model_engine(model_cfg, spec, device=options.device, fresh_adapters=model_cfg.lora).engine
        conn.send(("ready", os.getpid()))
    except BaseException:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))
        return
    try:
        with contextlib.ExitStack() as routes:
            if options.record_routes:  # the engine's own copy of the model, under a tape of its own
                from dapo.model.router_replay import router_replay

                routes.enter_context(router_replay(engine.model, rollout_routes=True))
            _Worker(engine, transport, conn, options).serve()
    finally:
        stop_heartbeat.set()
        engine.close()
        transport.close()


class RemoteEngine:
    """The trainer's handle on a rollout worker process (module docstring). Build it with :meth:`start`.

    A reader thread files every message of the worker as it arrives (finished requests, replies to pushes and probes,
    failures), so that one thread may wait for generations while another pushes weights."""

    def __init__(
        self,
        process: Any,
        conn: Any,
        transport: Any,
        stall_timeout_s: float = 300.0,
        owns_transport: bool = True,
        request_fault: MessageFault | None = None,
    ) -> None:
        self._process, self._conn, self._transport = process, conn, transport
        self._outgoing = _NumberedSender(conn, request_fault)  # under self._send_lock
        self._owns_transport = owns_transport  # False: the weight group is shared by a fleet, which closes it
        self._stall_timeout_s = stall_timeout_s
        self._last_heard = (time.monotonic(), "nothing yet")  # the worker's last sign of progress: when, what
        self._unresponsive = False
        self._pipe_closed = False
        self._received = 0  # the number of the worker's last message (module docstring)
        self._broken: str | None = None  # what broke the control channel
        self._respawn: tuple | None = None  # (spec, model cfg, options) of a worker this process spawned
        self.restarts = 0  # workers replaced since the run started (async/worker_restarts)
        self._next_id = 0
        self._pending: set[int] = set()
        self._aborted: set[int] = set()
        self._finished: dict[int, FinishedRequest] = {}
        self._replies: collections.deque[tuple] = collections.deque()
        self._failure: str | None = None
        self._version = 0
        self._send_lock = threading.Lock()
        self._reply_lock = threading.Lock()  # one push or probe at a time
        self._arrived = threading.Condition()
        self.last_push: dict[str, float] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="dapo-rollout-reader", daemon=True)
        self._reader.start()
        self._stop_ticking = threading.Event()
        threading.Thread(target=self._tick, name="dapo-rollout-tick", daemon=True).start()

    @classmethod
    def on_ranks(
        cls,
        spec: EngineSpec,
        model_cfg: Any,
        options: WorkerOptions,
        host: str,
        count: int,
        hand_over: Callable[[list[RankContact]], Any],
    ) -> tuple[list[RemoteEngine], Any]:
        """The workers are ``count`` other torchrun ranks (disaggregated training): listen for each one's control
        connection, host one weight group for all of them on ``host`` (an address they reach: torchrun's
        MASTER_ADDR), ``hand_over`` the contacts (over torchrun's group; contact i is for the i-th rollout rank),
        then wait until every one has connected and built its engine. The engines share the weight group: one
        broadcast per push reaches them all (:class:`dapo.rollout.fleet.EngineFleet`)."""
        from multiprocessing.connection import Listener

        from dapo.distributed.weight_transport import WeightTransport

        transport = WeightTransport.host(
            timeout_s=options.stall_timeout_s, advertise=host, size=count + 1, backend=options.weight_backend
        )
        keys = [os.urandom(32) for _ in range(count)]  # only the rank given a contact may drive its engine
        listeners = [Listener((host, 0), authkey=key) for key in keys]
        engines: list[RemoteEngine] = []
        try:
            hand_over(
                [
                    RankContact(spec, model_cfg, options, lst.address, key, transport.address, i + 1, count + 1)
                    for i, (lst, key) in enumerate(zip(listeners, keys, strict=True))
                ]
            )
            for lst in listeners:
                conn = lst.accept()
                engines.append(
                    cls(
                        _PeerRank(conn),
                        conn,
                        transport,
                        options.stall_timeout_s,
                        owns_transport=False,
                        request_fault=options.request_fault,
                    )
                )
            transport.group  # noqa: B018 - the rendezvous with every rollout rank
            for engine in engines:
                engine._reply("ready", timeout=START_TIMEOUT_S, stage="engine start")
        except BaseException:
            for engine in engines:
                engine.close()
            transport.close()
            raise
        finally:
            for lst in listeners:
                lst.close()
        return engines, transport

    @classmethod
    def start(cls, spec: EngineSpec, model_cfg: Any, options: WorkerOptions = WorkerOptions()) -> RemoteEngine:
        """Spawn the worker, join the weight group with it, and wait until its engine is built."""
        from dapo.distributed.weight_transport import WeightTransport

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch threads or CUDA state
        transport = WeightTransport.host(timeout_s=options.stall_timeout_s, backend=options.weight_backend)
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=_worker_main,
            args=(spec, model_cfg, options, child, transport.address),
            name="dapo-rollout-worker",
            daemon=True,
        )
        process.start()
        child.close()
        engine = cls(process, parent, transport, options.stall_timeout_s, request_fault=options.request_fault)
        engine._respawn = (spec, model_cfg, options)
        try:
            transport.group  # noqa: B018 - the rendezvous with the worker
            engine._reply("ready", timeout=START_TIMEOUT_S, stage="engine start")
        except BaseException:
            engine.close()
            raise
        return engine

    def respawn(self) -> RemoteEngine:
        """A new worker process with the same engine in place of this dead one (which is closed); it holds the
        model's initial weights until the caller pushes the current ones. Requests in flight here are lost: their
        callers see ``RolloutWorkerDied`` and generate again."""
        if self._respawn is None:
            raise RolloutWorkerError(
                "the rollout rank died and cannot be restarted from the trainer; torchrun's "
                "--max-restarts restarts the job, which resumes from the last checkpoint"
            )
        self.close()
        spec, model_cfg, options = self._respawn
        fresh = RemoteEngine.start(spec, model_cfg, dataclasses.replace(options, reply_fault=None, request_fault=None))
        fresh.restarts = self.restarts + 1
        return fresh

    # ------------------------------------------------------------------ the streaming interface
    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> int:
        with self._arrived:
            request_id, self._next_id = self._next_id, self._next_id + 1
            self._pending.add(request_id)
        self._send(("generate", request_id, [list(p) for p in prompt_token_ids], params))
        return request_id

    def receive(self, timeout: float | None = None) -> list[FinishedRequest]:
        with self._arrived:
            self._wait(lambda: bool(self._finished) or not self._pending, timeout, stage="generation")
            finished = list(self._finished.values())
            self._finished.clear()
        return finished

    def abort(self, request_id: int) -> None:
        # The worker runs a request to its end (its messages are served in order); the result is dropped here.
        with self._arrived:
            if request_id in self._pending:
                self._aborted.add(request_id)
                self._pending.discard(request_id)
            self._arrived.notify_all()

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Announce the push, broadcast the tensors, and wait until the worker has loaded them (it serves requests
        queued before the push first, or, with partial rollouts, takes it between two segments of a request)."""
        return push_to_engines([self], self._transport, named_tensors, version)

    # ------------------------------------------------------------------ the blocking RolloutEngine interface
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        """Blocking generation; the output's ``token_versions`` say which weights drew each token."""
        request_id = self.submit(prompt_token_ids, params)
        with self._arrived:
            self._wait(lambda: request_id in self._finished, None, stage="generation")
            done = self._finished.pop(request_id)
        done.output.token_versions = done.token_versions
        return done.output

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.push_weights(named_tensors, self._version + 1)

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        with self._reply_lock:
            self._send(("log_probs", list(prompt_token_ids), list(response_ids)))
            return self._reply("log_probs", timeout=None, stage="the weight probe")[1]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_ticking.set()
        if self._unresponsive and self._process.is_alive():  # a stopped worker would hold the exit for 30 s
            self._process.kill()
        try:
            if self._process.is_alive():
                with self._send_lock:
                    self._outgoing.send(("close",))
        except (OSError, EOFError, BrokenPipeError):
            pass
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        self._reader.join(timeout=5)
        self._conn.close()
        if self._owns_transport:
            self._transport.close()

    # ------------------------------------------------------------------ plumbing
    def _read(self) -> None:
        """The reader thread: file each message until the pipe closes or the channel breaks (module docstring)."""
        while True:
            try:
                frame = self._conn.recv()
            except (OSError, EOFError):
                with self._arrived:
                    self._pipe_closed = True
                    self._failure = self._failure or "the pipe to the rollout worker closed"
                    self._arrived.notify_all()
                return
            except Exception as exc:  # noqa: BLE001 - whatever unpickling a garbled frame raises
                return self._break(f"its message {self._received + 1} could not be read ({type(exc).__name__}: {exc})")
            if not (isinstance(frame, tuple) and len(frame) == 2 and isinstance(frame[1], tuple) and frame[1]):
                return self._break(f"its message {self._received + 1} is no message ({type(frame).__name__})")
            number, message = frame
            if number != self._received + 1:
                return self._break(f"its message {self._received + 1} never arrived (message {number} came next)")
            self._received = number
            if message[0] == "broken":
                return self._break(message[1])
            with self._arrived:
                kind = message[0]
                self._last_heard = (time.monotonic(), kind)
                if kind == "alive":
                    continue
                if kind == "finished":
                    _, request_id, output, token_versions = message
                    output = _routes_as_tensors(output)
                    if request_id in self._aborted:
                        self._aborted.discard(request_id)
                    else:
                        self._pending.discard(request_id)
                        self._finished[request_id] = FinishedRequest(request_id, output, token_versions)
                elif kind == "error":
                    self._failure = f"the rollout worker failed:\n{message[1]}"
                else:
                    self._replies.append(message)
                self._arrived.notify_all()

    def _tick(self) -> None:
        """The trainer's heartbeat: a numbered message the worker drops, so a request of the trainer's that never
        reached it shows within seconds (module docstring). Skipped while another send holds the channel (a push:
        the worker cannot read during the broadcast anyway)."""
        while not self._stop_ticking.wait(heartbeat_interval(self._stall_timeout_s)):
            if not self._send_lock.acquire(blocking=False):
                continue
            try:
                if self._closed or self._broken is not None:
                    return
                self._outgoing.send(("alive",))
            except (OSError, EOFError, BrokenPipeError):
                return
            finally:
                self._send_lock.release()

    def _break(self, detail: str) -> None:
        """The reader thread: the control channel broke (``detail``); every wait raises, and closing stops the
        worker at once."""
        with self._arrived:
            self._broken, self._unresponsive = detail, True
            self._arrived.notify_all()

    def _wait(self, ready: Callable[[], bool], timeout: float | None, *, stage: str) -> bool:
        """Under ``self._arrived``: wait until ``ready()``, a failure, the worker's death, a broken channel,
        ``timeout``, or ``stall_timeout_s`` without a message from the worker (RolloutWorkerStalled, naming
        ``stage``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            if self._broken is not None:  # restartable: a new worker gets a new channel
                raise RolloutWorkerDied(
                    f"the control channel to {self._peer()} broke while the trainer waited for {stage}: "
                    f"{self._broken}, after its message {self._last_heard[1]!r}; the worker is stopped",
                    engine=self,
                )
            if self._failure is not None:
                raise self._died() if self._pipe_closed else RolloutWorkerError(self._failure)
            if not self._process.is_alive() and not ready():
                raise self._died()
            if time.monotonic() - self._last_heard[0] > self._stall_timeout_s:
                raise self._stalled(stage)
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                return False
            self._arrived.wait(left)
        return True

    def _peer(self) -> str:
        pid = getattr(self._process, "pid", None)
        return f"the rollout worker (pid {pid})" if pid is not None else "the rollout rank"

    def _stalled(self, stage: str, detail: str = "") -> RolloutWorkerStalled:
        self._unresponsive = True
        when, kind = self._last_heard
        return RolloutWorkerStalled(
            f"{self._peer()} showed no sign of progress for {time.monotonic() - when:.0f} s while the trainer waited "
            f"for {stage} (trainer.stall_timeout_s={self._stall_timeout_s:g}); its last message was {kind!r}{detail}. "
            "It is stopped or hung (a SIGSTOP, a swapped-out or overloaded machine, a deadlock in the engine); the "
            "run stopped"
        )

    def _reply(self, kind: str, timeout: float | None, *, stage: str) -> tuple:
        with self._arrived:
            if not self._wait(lambda: bool(self._replies), timeout, stage=stage):
                raise RolloutWorkerError(f"the rollout worker sent nothing for {timeout:.0f} s during {stage}")
            reply = self._replies.popleft()
        if reply[0] != kind:
            raise RolloutWorkerError(f"the rollout worker answered {reply[0]!r} where {kind!r} was due")
        return reply

    def _send(self, message: tuple, *, locked: bool = False) -> None:
        if self._closed:
            raise RolloutWorkerError("the rollout worker is closed")
        try:
            if locked:
                self._outgoing.send(message)
            else:
                with self._send_lock:
                    self._outgoing.send(message)
        except (OSError, EOFError, BrokenPipeError) as exc:
            raise self._died(exc) from None

    def _died(self, exc: BaseException | None = None) -> RolloutWorkerDied:
        if isinstance(self._process, _PeerRank):  # torchrun's process: no exit code here, only a closed connection
            return RolloutWorkerDied(
                "its connection closed: the rank exited, was killed, or its machine is gone", engine=self
            )
        self._process.join(timeout=5)
        code = self._process.exitcode
        reported = self._failure if self._failure and not self._failure.startswith("the pipe") else None
        return RolloutWorkerDied(
            f"the rollout worker process exited (exit code {code})"
            + (f": {exc}" if exc else "")
            + (f"; before that, {reported}" if reported else ""),
            engine=self,
        )


def push_to_engines(
    engines: Sequence[RemoteEngine], transport: Any, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
) -> dict[str, float]:
    """One weight push to every engine of a weight group: announce it on each control channel, one broadcast per
    dtype reaches them all, then wait until each has loaded it. While the push is on, no other message goes out on
    these channels and no other push or probe runs."""
    layout, tensors = transport.layout_of(named_tensors)
    with contextlib.ExitStack() as held:
        for engine in engines:
            held.enter_context(engine._reply_lock)  # noqa: SLF001 - one module's classes
        t0 = time.perf_counter()
        with contextlib.ExitStack() as sending:
            for engine in engines:
                sending.enter_context(engine._send_lock)  # noqa: SLF001
            for engine in engines:
                engine._send(("push", version, layout), locked=True)  # noqa: SLF001
            try:
                stats = transport.send(layout, tensors)
            except RuntimeError as exc:  # a member died (connection reset) or gloo gave up after stall_timeout_s
                dead = _wait_for_a_death(engines)
                if dead is not None:
                    raise dead._died(exc) from None  # noqa: SLF001 - restartable, not a stall
                late = [e for e in engines if time.monotonic() - e._last_heard[0] > e._stall_timeout_s] or engines
                raise late[0]._stalled("the weight broadcast", detail=f" ({type(exc).__name__}: {exc})") from None
        for engine in engines:
            engine._reply("pushed", timeout=None, stage="the weight push")  # noqa: SLF001
            engine._version = version  # noqa: SLF001
    transfer = {
        "async/weight_transfer_s": time.perf_counter() - t0,
        "async/weight_broadcast_s": stats.seconds,
        "async/weight_transfer_bytes": float(stats.num_bytes),
        "async/worker_restarts": float(sum(e.restarts for e in engines)),
    }
    for engine in engines:
        engine.last_push = transfer
    return transfer


def _wait_for_a_death(engines: Sequence[RemoteEngine], within_s: float = 5.0) -> RemoteEngine | None:
    """The engine whose process is gone, given a few seconds to show it (a reset connection arrives before the
    kernel has reaped the process); None when all are alive."""
    deadline = time.monotonic() + within_s
    while True:
        for engine in engines:
            if not engine._process.is_alive() or engine._pipe_closed:  # noqa: SLF001
                return engine
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


class _PeerRank:
    """The process handle of a worker that is another torchrun rank: this process cannot wait for it or kill it
    (torchrun owns it); it is alive while its connection is open, and a closed connection is how its end shows
    (the reader thread reports it)."""

    exitcode = None

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def is_alive(self) -> bool:
        return not self._conn.closed

    def join(self, timeout: float | None = None) -> None:
        """Nothing to join: ``close`` sent the rank its ``close`` message, and torchrun reaps it."""

    def kill(self) -> None:
        """Not this process's to kill: a rank that does not stop is torchrun's to end."""
