"""A process pool for scoring that survives scorers that hang or crash.

``concurrent.futures`` and ``multiprocessing.Pool`` cannot stop one stuck task: the only remedy is to
tear the whole pool down. Here each worker owns a pipe and a shared progress counter (the index, within
its current chunk, of the item it is scoring). The parent polls the counters; a worker whose counter has
not moved for ``timeout_s`` is SIGKILLed, that one item gets ``RewardResult.failed()`` (-1, wrong), the
rest of its chunk is queued again, and a fresh worker takes its place. (Before the first item of a
chunk, while the worker warms up its scorers, e.g. starts a math-verify child, ``start_timeout_s``
applies instead.) A worker that dies by itself
(out of memory, a segfault in a C extension) is handled the same way, except that one that dies before its chunk's first
item blames no item: the chunk is queued again (at most ``2 * num_workers`` times a batch). Results keep input order.

Hanging calls run side by side, not one after another: a worker whose current item has run longer than
``suspect_after_s`` is *detached*: it may finish that one item (a shared limit, set under a lock, stops it before its
next one), the rest of its chunk is queued again one item per chunk, and a spare worker (at most ``max_spare_workers``
beyond ``num_workers``) takes its place. So a batch of hanging calls costs about one ``timeout_s`` per
``num_workers + max_spare_workers`` hanging calls, not ``timeout_s`` each. Spares are stopped at the end of the batch.
``score(items, stop_after_failures=k)`` stops the batch as soon as ``k`` items failed (``RewardBatchStopped``, with the
results so far), so a failure policy (``reward_model.max_failures``) does not wait for the rest of a doomed batch.

Workers are spawned (safe beside torch and tokenizer threads), receive a pickled copy of the scorer
registry and load the custom reward function themselves, and are SIGKILLed by the kernel if the parent
dies. Each failed item's ``RewardResult`` says why (``failure`` "timeout" or "worker_crash", and ``error``).
Scoring errors (a custom function raising) stop the pool and re-raise in the parent as ``RewardScoringError``
naming the item, unless ``capture_errors`` is set: then that item is scored as failed (``failure`` "error") and the
worker carries on. An invalid return value (``InvalidRewardError``) always stops: it is a bug, not bad luck.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from dapo.reward.child_process import SPAWN, die_with_parent, kill_and_reap
from dapo.reward.item_scorer import ItemScorer
from dapo.reward.records import InvalidRewardError, RewardInput, RewardResult
from dapo.reward.registry import ScorerRegistry

MAX_CHUNK = 1024
"""Upper bound of the automatic chunk size (items sent to a worker in one message). The automatic size
gives each worker about four chunks (load balance when costs vary) up to this bound; on cheap items larger
chunks were faster (benchmarks/bench_reward.py: chunk 64 / 256 / 1024 -> 0.58x / 0.62x / 0.77x of
in-process speed on 2 cores)."""


MAX_SPARE_WORKERS = 8
"""Default bound of the extra workers started while others are stuck on a slow or hanging call (each is a process
that imports the scorers, tens of MB)."""


class RewardScoringError(RuntimeError):
    """A scorer raised (rather than returning -1) while scoring an item in a worker."""


class RewardBatchStopped(Exception):
    """``score(..., stop_after_failures=k)`` saw ``k`` failed items; ``results`` holds what was scored (None: not)."""

    def __init__(self, results: list[RewardResult | None]) -> None:
        super().__init__(f"stopped after {sum(r is not None and bool(r.failure) for r in results)} failed items")
        self.results = results


@dataclass
class _Worker:
    process: Any
    conn: Connection
    progress: Any  # multiprocessing RawValue("q"): index in the current chunk, -1 before the first item
    limit: Any  # multiprocessing RawValue("q"): the worker scores items of its chunk with an index below this only
    lock: Any  # guards progress and limit together (the worker claims an item, the parent detaches)
    ready: bool = False
    detached: bool = False  # slow on its current item: no further items; a spare works in its place
    started_at: float = field(default_factory=time.monotonic)
    job: list[int] | None = None  # item indices of the chunk being scored
    seen_progress: int = -1
    since: float = 0.0  # when seen_progress last changed


class RewardWorkerPool:
    """``num_workers`` scoring processes; ``score(items)`` returns one ``RewardResult`` per item, in order.

    Use as a context manager (or call ``close``). Reusable across calls, so a trainer can keep one for
    the whole run and pay the worker start-up (a fraction of a second each) once.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        timeout_s: float = 10.0,
        registry: ScorerRegistry | None = None,
        custom_fn_spec: str | None = None,
        chunk_size: int | None = None,
        start_timeout_s: float = 120.0,
        capture_errors: bool = False,
        max_spare_workers: int = MAX_SPARE_WORKERS,
        suspect_after_s: float | None = None,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"RewardWorkerPool num_workers must be an int >= 1, got {num_workers!r}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"RewardWorkerPool timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"RewardWorkerPool chunk_size must be an int >= 1 or None, got {chunk_size!r}")
        # Validate in the parent, where the error is readable: the scorer setup must load and pickle.
        self._item_scorer = ItemScorer(registry, custom_fn_spec)
        try:
            self._payload = pickle.dumps(self._item_scorer)
        except Exception as e:
            raise TypeError(
                f"the reward scorers cannot be sent to worker processes ({type(e).__name__}: {e}); register "
                "module-level functions (not lambdas or closures) or use num_workers=0"
            ) from e
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.chunk_size = chunk_size
        self.start_timeout_s = float(start_timeout_s)
        self.capture_errors = bool(capture_errors)
        self.max_spare_workers = max(0, int(max_spare_workers))
        # A reward call takes microseconds to milliseconds; one running this long is likely to hang.
        self.suspect_after_s = float(suspect_after_s) if suspect_after_s is not None else min(1.0, self.timeout_s / 4)
        self.kills = 0  # workers killed for hanging or found dead
        # Deaths before a worker said "ready" that are tolerated (a worker can be killed while idle before its ready
        # message was read, e.g. by the OOM killer between batches); a start-up that keeps failing is an error.
        self._start_deaths_left = 2 * num_workers
        self._workers: list[_Worker | None] = [self._start_worker() for _ in range(num_workers)]
        self._closed = False
        self._one_at_a_time = False  # this batch has a slow item: queue items singly so spares share the rest
        self._failed = 0  # failed items in this batch
        self._unstarted_deaths_left = 0  # deaths before a chunk's first item forgiven in this batch (set per batch)

    # ------------------------------------------------------------------------------------------ public
    def score(self, items: Sequence[RewardInput], *, stop_after_failures: int | None = None) -> list[RewardResult]:
        """Score ``items`` across the workers; a hung or crashed item yields ``RewardResult.failed()``.

        ``stop_after_failures``: raise ``RewardBatchStopped`` (with the results so far) as soon as that many items
        failed, instead of scoring the rest; the workers busy on other items are replaced."""
        if self._closed:
            raise RuntimeError("RewardWorkerPool.score called after close()")
        self._item_scorer.prepare(items, warm_up=False)  # an unknown data_source fails here, before any work
        n = len(items)
        results: list[RewardResult | None] = [None] * n
        chunk = self.chunk_size or max(1, min(MAX_CHUNK, math.ceil(n / (4 * self.num_workers))))
        pending: deque[list[int]] = deque(list(range(s, min(n, s + chunk))) for s in range(0, n, chunk))
        poll_s = min(0.05, self.timeout_s / 4, self.suspect_after_s / 2)
        self._one_at_a_time, self._failed = False, 0
        self._unstarted_deaths_left = 2 * self.num_workers
        try:
            for slot, w in enumerate(self._workers):  # died between batches: replaced now, no item is to blame
                if w is not None and w.job is None and not w.process.is_alive():
                    self._replace(slot, results, pending, why="died")
            while pending or any(w is not None and w.job is not None for w in self._workers):
                self._dispatch(pending, items)
                conns = [w.conn for w in self._workers if w is not None]
                for conn in wait(conns, timeout=poll_s):
                    self._receive(self._slot_of(conn), items, results, pending)
                self._reap_hung(results, pending)
                self._detach_slow(pending)
                if stop_after_failures is not None and self._failed >= stop_after_failures:
                    self._abandon_batch()
                    raise RewardBatchStopped(results)
        except RewardBatchStopped:
            raise
        except BaseException:
            self.close()
            raise
        self._stop_spares()
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (they change when a worker is replaced)."""
        return [w.process.pid for w in self._workers if w is not None]

    def close(self) -> None:
        """Stop every worker. Idempotent."""
        self._closed = True
        for k, w in enumerate(self._workers):
            if w is None:
                continue
            try:
                w.conn.send(None)
            except OSError:
                pass
            w.process.join(timeout=1)
            kill_and_reap(w.process)
            w.conn.close()
            self._workers[k] = None

    def __enter__(self) -> RewardWorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            for w in self._workers:
                if w is not None:
                    kill_and_reap(w.process)
        except Exception:
            pass

    # ----------------------------------------------------------------------------------------- parent
    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = SPAWN.Pipe()
        progress = SPAWN.RawValue("q", -1)
        limit = SPAWN.RawValue("q", 0)
        lock = SPAWN.Lock()
        process = SPAWN.Process(
            target=_worker_main,
            args=(child_conn, progress, limit, lock, os.getpid(), self._payload, self.capture_errors),
            name="dapo-reward-worker",
            daemon=True,  # terminated with the parent; it re-enables child processes for itself
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn, progress, limit, lock)

    def _working(self) -> int:
        """Workers that take new items: started and not detached."""
        return sum(1 for w in self._workers if w is not None and not w.detached)

    def _top_up(self, waiting: int = 0) -> None:
        """Start workers until ``num_workers`` take new items; once a batch has a slow item, start spares for up to
        ``waiting`` queued items at once (at most ``max_spare_workers`` beyond ``num_workers`` in all): where one call
        hangs, others often do too, and one spare per detached worker would run the hangs nearly one by one again."""
        target = self.num_workers + (min(self.max_spare_workers, waiting) if self._one_at_a_time else 0)
        while (
            self._working() < target
            and sum(w is not None for w in self._workers) < self.num_workers + self.max_spare_workers
        ):
            free = next((k for k, w in enumerate(self._workers) if w is None), None)
            if free is None:
                self._workers.append(self._start_worker())
            else:
                self._workers[free] = self._start_worker()

    def _detach_slow(self, pending: deque[list[int]]) -> None:
        """Detach every worker slow on its current item: it stops after that item, its other items are queued again
        one per chunk, and a spare takes its place (see the module)."""
        now = time.monotonic()
        for w in list(self._workers):
            if w is None or w.job is None or w.detached or w.seen_progress < 0 or now - w.since <= self.suspect_after_s:
                continue
            with w.lock:  # the worker claims its next item under this lock, so it cannot start one of `rest`
                k = w.progress.value
                w.limit.value = k + 1
            rest = w.job[k + 1 :]
            w.job = w.job[: k + 1]
            pending.extendleft([i] for i in reversed(rest))
            w.detached = True
            self._one_at_a_time = True

    def _abandon_batch(self) -> None:
        """Stop every worker busy on this batch (their items are not needed any more) and restore the pool."""
        for slot, w in enumerate(self._workers):
            if w is not None and w.job is not None:
                kill_and_reap(w.process)
                w.conn.close()
                self._workers[slot] = None
        self._top_up()
        self._stop_spares()

    def _stop_spares(self) -> None:
        """Back to ``num_workers`` workers after a batch: the extra (idle) ones are stopped."""
        for w in self._workers:
            if w is not None:
                w.detached = False
        extra = sum(w is not None for w in self._workers) - self.num_workers
        for slot in reversed(range(len(self._workers))):
            w = self._workers[slot]
            if extra <= 0:
                break
            if w is None or w.job is not None:
                continue
            if w.ready:
                try:
                    w.conn.send(None)
                    w.process.join(timeout=1)
                except OSError:
                    pass
            kill_and_reap(w.process)
            w.conn.close()
            self._workers[slot] = None
            extra -= 1
        self._workers = [w for w in self._workers if w is not None]

    def _slot_of(self, conn: Connection) -> int:
        return next(k for k, w in enumerate(self._workers) if w is not None and w.conn is conn)

    def _dispatch(self, pending: deque[list[int]], items: Sequence[RewardInput]) -> None:
        if pending:  # a spare for each detached worker, and a fresh one for each killed one
            self._top_up(sum(len(job) for job in pending))
        for slot, w in enumerate(self._workers):
            if not pending:
                return
            if w is None or not w.ready or w.job is not None or w.detached:
                continue
            job = pending.popleft()
            if self._one_at_a_time and len(job) > 1:
                pending.appendleft(job[1:])
                job = job[:1]
            w.progress.value = -1
            w.limit.value = len(job)
            # Plain tuples pickle several times faster than dataclass instances.
            chunk = [
                (items[i].data_source, items[i].solution_str, items[i].ground_truth, items[i].extra_info) for i in job
            ]
            try:
                w.conn.send(chunk)
            except OSError:  # it died while idle (e.g. the OOM killer): no item is to blame
                pending.appendleft(job)
                self._replace(slot, [], pending, why="died")
                continue
            w.job, w.seen_progress, w.since = job, -1, time.monotonic()

    def _receive(
        self, slot: int, items: Sequence[RewardInput], results: list[RewardResult | None], pending: deque[list[int]]
    ) -> None:
        w = self._workers[slot]
        assert w is not None
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            self._replace(slot, results, pending, why="died")
            return
        kind = message[0]
        if kind == "ready":
            w.ready = True
        elif kind == "done":
            assert w.job is not None and len(message[1]) == len(w.job)
            for i, fields in zip(w.job, message[1]):
                results[i] = RewardResult(*fields)
                self._failed += bool(results[i].failure)
            w.job = None
            if w.detached:  # it finished its slow item; a spare took its place, so it retires if one too many
                w.detached = False
        elif kind == "error":
            _, k, summary, text = message
            i = w.job[k] if w.job is not None and 0 <= k < len(w.job) else -1
            where = f"item {i} (data_source={items[i].data_source!r})" if i >= 0 else "worker start-up"
            raise RewardScoringError(
                f"scoring {where} raised {summary} (in a reward worker)" + (f"\n{text}" if text else "")
            )

    def _reap_hung(self, results: list[RewardResult | None], pending: deque[list[int]]) -> None:
        now = time.monotonic()
        for slot, w in enumerate(self._workers):
            if w is None:
                continue
            if not w.ready:
                if now - w.started_at > self.start_timeout_s:
                    raise RuntimeError(f"a reward worker did not start within {self.start_timeout_s:.0f} s")
                if not w.process.is_alive():
                    self._replace(slot, results, pending, why="died")
                continue
            if w.job is None:
                continue
            progress = w.progress.value
            if progress != w.seen_progress:
                w.seen_progress, w.since = progress, now
            elif now - w.since > (self.start_timeout_s if progress < 0 else self.timeout_s):
                self._replace(slot, results, pending, why="hung")

    def _replace(self, slot: int, results: list[RewardResult | None], pending: deque[list[int]], why: str) -> None:
        """Kill the worker in ``slot``; its current item fails (none if it died before the first), the rest of its
        chunk is queued again."""
        w = self._workers[slot]
        assert w is not None
        if not w.ready:
            if self._start_deaths_left <= 0 or w.job is not None:
                raise RuntimeError(f"a reward worker {why} while starting (exit code {w.process.exitcode})")
            self._start_deaths_left -= 1
        kill_and_reap(w.process)
        w.conn.close()
        self.kills += 1
        if w.job is not None and why == "died" and w.progress.value < 0 and self._unstarted_deaths_left > 0:
            # It died before claiming its chunk's first item: no item is to blame. (A worker killed between batches
            # can look alive, and take a chunk, for a moment after /proc shows it a zombie: its other threads still
            # hold the pipe open.) The budget keeps a worker that dies on every chunk's warm-up from looping forever.
            self._unstarted_deaths_left -= 1
            pending.appendleft(w.job)
        elif w.job is not None:
            k = max(0, w.progress.value)
            if why == "hung":
                failure, error = "timeout", f"no result within reward_model.timeout_s={self.timeout_s:g} s"
            else:
                failure, error = "worker_crash", f"the reward worker died (exit code {w.process.exitcode})"
            results[w.job[k]] = RewardResult.failed(failure=failure, error=error)
            self._failed += 1
            rest = w.job[:k] + w.job[k + 1 :]
            if rest:
                pending.appendleft(rest)
        self._workers[slot] = None
        self._top_up()


# -------------------------------------------------------------------------------------------- worker
def _worker_main(
    conn: Connection, progress: Any, limit: Any, lock: Any, parent_pid: int, payload: bytes, capture_errors: bool
) -> None:
    """A worker: receive a chunk of ``RewardInput``, score it item by item, send the results back."""
    die_with_parent(parent_pid)
    multiprocessing.current_process().daemon = False  # may start its own child (the symbolic verifier)
    try:
        item_scorer: ItemScorer = pickle.loads(payload)
    except BaseException as e:
        conn.send(("error", -1, _summary(e), traceback.format_exc()))
        return
    conn.send(("ready",))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        chunk = [RewardInput(*fields) for fields in chunk]
        try:
            item_scorer.prepare(chunk)  # progress is still -1: this runs under start_timeout_s
        except Exception as e:
            conn.send(("error", 0, _summary(e), traceback.format_exc()))
            continue
        out: list[tuple[float, bool, str, str, str]] | None = []
        for k, item in enumerate(chunk):
            with lock:  # the parent may have taken the rest of the chunk back (it detached this worker)
                if k >= limit.value:
                    break
                progress.value = k
            try:
                r = item_scorer(item)
            except Exception as e:
                if capture_errors and not isinstance(e, InvalidRewardError):
                    out.append((-1.0, False, "", "error", _summary(e)))
                    continue
                # An invalid return value is described in full by its message; a raise needs its traceback.
                conn.send(
                    ("error", k, _summary(e), "" if isinstance(e, InvalidRewardError) else traceback.format_exc())
                )
                out = None
                break
            out.append((r.score, r.acc, r.pred, "", ""))
        if out is not None:
            conn.send(("done", out))


def _summary(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 500 else text[:497] + "..."
