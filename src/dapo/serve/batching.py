"""Batch concurrent requests into engine calls; stream every token as it is decoded; let requests come and go.

Continuous batching at call granularity. Every sequence a request asks for (each prompt x ``n``) is a row. Whenever
the engine is free, the scheduler takes rows of the waiting requests (up to ``max_batch_rows``, round-robin between
requests, at most ``max_rows_per_request`` of any one), groups them by sampling settings, and decodes each group for
at most ``chunk_tokens`` tokens in one engine call (a row continues from its prompt plus what it has generated so far).
After each call, finished rows leave, their request is answered as soon as all its rows are done, and requests that
arrived meanwhile join the next call. A request whose client went away (its future cancelled, its stream closed) is
dropped before the next call.

With an engine that reports its decode steps (:class:`dapo.rollout.base.TokenStreamingEngine`: the Transformers
engine) every token reaches its stream the step it is drawn, and a call ends early, after the step under way, when a
request arrives that could join it (or every request in it has gone away): a newcomer waits one decode step and a
re-prefill of the running rows, not a whole chunk, for its first token. Other engines (vLLM) stream each call's tokens
when it returns.

The engine runs on one worker thread, so the event loop keeps answering (health checks, new requests, streams) while
it decodes; a step's tokens are handed to the event loop with ``call_soon_threadsafe``, so they reach a stream before
the end of the call that made them.

Seeds. A greedy request's output does not depend on its batch, so greedy requests batch whatever their seed. A sampled
request *with* a seed runs in engine calls of its own, the k-th seeded with ``seed + k``, never ended early by an
arrival, so the same request and seed give the same output however many other requests are in flight; sampled
requests without a seed share calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dapo.rollout.base import RolloutEngine, SamplingParams, TokenStreamingEngine

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

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        max_batch_rows: int = 256,
        batch_wait_s: float = 0.005,
        max_rows_per_request: int | None = None,
        chunk_tokens: int = 16,
    ) -> None:
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
        self._arrivals = 0  # requests queued so far: a call in progress ends early when it changes
        self._streams_steps = isinstance(engine, TokenStreamingEngine)
        self.engine_calls = 0
        self.requests_done = 0

    def _key(self, params: SamplingParams) -> tuple:
        base = (params.temperature, params.top_p, params.top_k, params.stop_token_ids)
        if not params.greedy and params.seed is not None:
            return ("solo", next(self._solo)) + base
        return base

    async def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        stopped: Callable[[int, int, list[int]], bool] | None = None,
    ) -> list[list[Sample]]:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        job = _Job(prompts, params, loop.create_future(), self._key(params), on_progress, stopped)
        self._queue.append(job)
        self._arrivals += 1
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
            arrivals = self._arrivals
            groups: dict[tuple, list[tuple[_Job, list[_Row]]]] = {}
            taken = self._take()
            room = sum(len(rows) for _, rows in taken) < self.max_batch_rows  # can a newcomer join the next call?
            for job, rows in taken:
                groups.setdefault(job.key, []).append((job, rows))
            for group in groups.values():
                live = [(job, rows) for job, rows in group if not job.future.done()]
                if not live:
                    continue
                # One call runs every row for the same number of tokens: the fewest any row has left, so a row near
                # its max_tokens (a short request) never waits behind a longer one; the others go on in the next call.
                budget = min(
                    min(self.chunk_tokens, job.params.max_tokens - len(row.tokens))
                    for job, rows in live
                    for row in rows
                )
                try:
                    samples = await loop.run_in_executor(
                        self._executor, self._generate_group, live, budget, loop, arrivals if room else None
                    )
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
        if self._streams_steps:  # the tokens went out step by step: only the end is news
            if row.finish is not None:
                self._progress(job, (row.prompt, row.sample, [], [], row.finish))
        else:
            self._progress(job, (row.prompt, row.sample, ids, logprobs, row.finish))

    @staticmethod
    def _progress(job: _Job, item: Progress) -> None:
        if job.on_progress is not None and not job.future.done():
            try:
                job.on_progress(item)
            except Exception:  # a broken stream consumer must not stop the batch
                pass

    def _deliver_step(self, items: list[tuple[_Job, _Row, int, float]]) -> None:
        """One decode step's tokens, on the event loop (before the call that made them returns)."""
        for job, row, token, logprob in items:
            self._progress(job, (row.prompt, row.sample, [token], [logprob], None))

    def _step_callback(
        self, group: list[tuple[_Job, list[_Row]]], loop: asyncio.AbstractEventLoop, arrivals: int | None
    ):
        """What the engine calls after each decode step (on the engine thread): hands the step's tokens to the streams
        and says whether to end the call (a request arrived that can join, unless this group is a seeded one; or no
        request of the group is still waited for)."""
        entries = [(job, row) for job, rows in group for row in rows]
        jobs = list({id(job): job for job, _ in group}.values())
        solo = group[0][0].key[:1] == ("solo",)

        def on_step(indices: list[int], tokens: list[int], logprobs: list[float]) -> bool:
            items = [
                (*entries[k], t, lp)
                for k, t, lp in zip(indices, tokens, logprobs)
                if entries[k][0].on_progress is not None
            ]
            if items:
                loop.call_soon_threadsafe(self._deliver_step, items)
            if all(job.future.done() for job in jobs):
                return True
            return not solo and arrivals is not None and self._arrivals != arrivals

        return on_step

    def _generate_group(
        self,
        group: list[tuple[_Job, list[_Row]]],
        max_tokens: int,
        loop: asyncio.AbstractEventLoop | None = None,
        arrivals: int | None = None,
    ) -> list[Sample]:
        first_job = group[0][0]
        first = first_job.params
        inputs = [job.prompts[row.prompt] + row.tokens for job, rows in group for row in rows]
        seed = None
        if not first.greedy and first.seed is not None:
            seed = first.seed + first_job.chunks
        for job in {id(job): job for job, _ in group}.values():
            job.chunks += 1
        params = SamplingParams(
            n=1,
            temperature=first.temperature,
            top_p=first.top_p,
            top_k=first.top_k,
            max_tokens=max_tokens,
            stop_token_ids=first.stop_token_ids,
            seed=seed,
        )
        self.engine_calls += 1
        if self._streams_steps and loop is not None:
            out = self.engine.generate_streaming(inputs, params, self._step_callback(group, loop, arrivals))
        else:
            out = self.engine.generate(inputs, params)
        return [(out.response_ids[k], out.logprobs[k], out.finish_reason[k]) for k in range(len(inputs))]

    async def run_on_engine(self, fn: Callable[[], object]) -> object:
        """``fn()`` on the engine's thread, between engine calls (the model is never used by two threads)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
