"""Batch concurrent requests into engine calls, decoded in short chunks so that requests come and go between them.

Continuous batching at chunk granularity. Every sequence a request asks for (each prompt x ``n``) is a row. Whenever
the engine is free, the scheduler takes rows of the waiting requests (up to ``max_batch_rows``, round-robin between
requests, at most ``max_rows_per_request`` of any one), groups them by sampling settings, and decodes each group for
at most ``chunk_tokens`` tokens in one ``engine.generate`` call (a row continues from its prompt plus what it has
generated so far). After each call, finished rows leave, their request is answered as soon as all its rows are done,
and requests that arrived meanwhile join the next call: a short request that arrives during a long decode finishes
after a few chunks instead of after the long one. Streamed requests receive each chunk's tokens as soon as the call
returns. A request whose client went away (its future cancelled, its stream closed) is dropped before the next call.

The engine runs on one worker thread, so the event loop keeps answering (health checks, new requests, streams) while
it decodes.

Seeds. A greedy request's output does not depend on its batch, so greedy requests batch whatever their seed. A sampled
request *with* a seed runs in engine calls of its own, the k-th seeded with ``seed + k``, so the same request and seed
give the same output however many other requests are in flight; sampled requests without a seed share calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dapo.rollout.base import RolloutEngine, SamplingParams

Sample = tuple[list[int], list[float], str]  # response ids, logprobs, finish reason
# (prompt index, sample index, new token ids, their logprobs, finish reason or None while the row continues)
Progress = tuple[int, int, list[int], list[float], str | None]


@dataclass
class _Row:
    prompt: int
    sample: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


@dataclass
class _Job:
    prompts: list[list[int]]
    params: SamplingParams
    future: asyncio.Future
    key: tuple = ()
    on_progress: Callable[[Progress], None] | None = None
    stopped: Callable[[int, int, list[int]], bool] | None = None  # (prompt, sample, tokens): a stop string was hit
    rows: list[_Row] = field(default_factory=list)
    chunks: int = 0  # engine calls made for this job so far (a seeded job's k-th call is seeded with seed + k)

    def __post_init__(self) -> None:
        self.rows = [_Row(p, s) for p in range(len(self.prompts)) for s in range(self.params.n)]

    @property
    def pending(self) -> list[_Row]:
        return [r for r in self.rows if r.finish is None]

    def results(self) -> list[list[Sample]]:
        out: list[list[Sample]] = [[] for _ in self.prompts]
        for r in self.rows:
            out[r.prompt].append((r.tokens, r.logprobs, r.finish or "length"))
        return out


class BatchingEngine:
    """``await generate(prompts, params)`` -> one list of ``params.n`` samples per prompt, batched with other calls;
    ``on_progress`` (called on the event loop) receives each row's new tokens after every chunk."""

    def __init__(self, engine: RolloutEngine, *, max_batch_rows: int = 256, batch_wait_s: float = 0.005,
                 max_rows_per_request: int | None = None, chunk_tokens: int = 16) -> None:
        self.engine = engine
        self.max_batch_rows = max_batch_rows
        self.max_rows_per_request = max(1, min(max_rows_per_request or max(1, max_batch_rows // 4), max_batch_rows))
        self.chunk_tokens = max(1, chunk_tokens)
        self.batch_wait_s = batch_wait_s
        self._queue: list[_Job] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-engine")
        self._solo = itertools.count()
        self.engine_calls = 0
        self.requests_done = 0

    def _key(self, params: SamplingParams) -> tuple:
        base = (params.temperature, params.top_p, params.top_k, params.stop_token_ids)
        if not params.greedy and params.seed is not None:
            return ("solo", next(self._solo)) + base
        return base

    async def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                       on_progress: Callable[[Progress], None] | None = None,
                       stopped: Callable[[int, int, list[int]], bool] | None = None) -> list[list[Sample]]:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        job = _Job(prompts, params, loop.create_future(), self._key(params), on_progress, stopped)
        self._queue.append(job)
        assert self._wake is not None
        self._wake.set()
        return await job.future

    @property
    def active_requests(self) -> int:
        return sum(1 for j in self._queue if not j.future.done())

    def _take(self) -> list[tuple[_Job, list[_Row]]]:
        """(job, rows) pairs for the next engine calls: round-robin over waiting jobs, oldest first."""
        self._queue = [j for j in self._queue if not j.future.done() and j.pending]  # finished or went away
        pending = [j.pending for j in self._queue]
        taken: list[list[_Row]] = [[] for _ in self._queue]
        budget, progressed = self.max_batch_rows, True
        while budget > 0 and progressed:
            progressed = False
            for job, rows, have in zip(self._queue, pending, taken):
                if budget == 0 or not rows or len(have) >= self.max_rows_per_request:
                    continue
                if job.key[:1] == ("solo",):  # a seeded job is cut into the same calls whatever else is waiting
                    step = min(len(rows), self.max_rows_per_request)
                    if have or step > budget:
                        continue
                else:
                    step = 1
                have.extend(rows[:step])
                del rows[:step]
                budget -= step
                progressed = True
        return [(job, rows) for job, rows in zip(self._queue, taken) if rows]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            await self._wake.wait()
            if self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)
            self._wake.clear()
            groups: dict[tuple, list[tuple[_Job, list[_Row]]]] = {}
            for job, rows in self._take():
                for row in rows:  # rows decode together only when they may run the same number of tokens
                    budget = min(self.chunk_tokens, job.params.max_tokens - len(row.tokens))
                    groups.setdefault(job.key + (budget,), []).append((job, [row]))
            for key, group in groups.items():
                live = [(job, rows) for job, rows in group if not job.future.done()]
                if not live:
                    continue
                try:
                    samples = await loop.run_in_executor(self._executor, self._generate_group, live, key[-1])
                except Exception as e:  # an engine failure fails these requests, never the server
                    for job, _ in live:
                        if not job.future.done():
                            job.future.set_exception(e)
                    continue
                k = 0
                for job, rows in live:
                    for row in rows:
                        self._advance(job, row, *samples[k])
                        k += 1
                    if not job.pending and not job.future.done():
                        job.future.set_result(job.results())
                        self.requests_done += 1
            self._queue = [j for j in self._queue if j.pending and not j.future.done()]
            if self._queue:
                self._wake.set()

    def _advance(self, job: _Job, row: _Row, ids: list[int], logprobs: list[float], reason: str) -> None:
        row.tokens.extend(ids)
        row.logprobs.extend(logprobs)
        if reason == "stop":
            row.finish = "stop"
        elif len(row.tokens) >= job.params.max_tokens:
            row.finish = "length"
        elif job.stopped is not None and job.stopped(row.prompt, row.sample, row.tokens):
            row.finish = "stop"  # a stop string: the server cuts the text, no need to decode further
        if job.on_progress is not None and not job.future.done():
            try:
                job.on_progress((row.prompt, row.sample, ids, logprobs, row.finish))
            except Exception:  # a broken stream consumer must not stop the batch
                pass

    def _generate_group(self, group: list[tuple[_Job, list[_Row]]], max_tokens: int) -> list[Sample]:
        first_job = group[0][0]
        first = first_job.params
        inputs = [job.prompts[row.prompt] + row.tokens for job, rows in group for row in rows]
        seed = None
        if not first.greedy and first.seed is not None:
            seed = first.seed + first_job.chunks
        for job in {id(job): job for job, _ in group}.values():
            job.chunks += 1
        params = SamplingParams(n=1, temperature=first.temperature, top_p=first.top_p, top_k=first.top_k,
                                max_tokens=max_tokens, stop_token_ids=first.stop_token_ids, seed=seed)
        self.engine_calls += 1
        out = self.engine.generate(inputs, params)
        return [(out.response_ids[k], out.logprobs[k], out.finish_reason[k]) for k in range(len(inputs))]

    async def run_on_engine(self, fn: Callable[[], object]) -> object:
        """``fn()`` on the engine's thread, between engine calls (the model is never used by two threads)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
