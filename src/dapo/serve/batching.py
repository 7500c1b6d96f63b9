"""Batch concurrent requests into engine calls.

Requests wait in a queue; whenever the engine is free, sequences of the queued requests (up to ``max_batch_rows``,
round-robin between requests, at most ``max_rows_per_request`` of any one) are taken and grouped by sampling settings (temperature, top-p, top-k, max_tokens, stop ids); each group is one
``engine.generate`` call, with every request's prompt repeated ``n`` times. The engine runs on one worker thread, so
the event loop keeps answering (health checks, new requests, streams) while it decodes.

Seeds. A greedy request's output does not depend on its batch, so greedy requests batch whatever their seed. A sampled
request *with* a seed runs in an engine call of its own seeded with it, so the same request and seed give the same
output however many other requests are in flight; sampled requests without a seed share batches (torch's RNG).
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dapo.rollout.base import RolloutEngine, SamplingParams

Sample = tuple[list[int], list[float], str]  # response ids, logprobs, finish reason


@dataclass
class _Job:
    prompts: list[list[int]]
    params: SamplingParams
    future: asyncio.Future
    key: tuple = field(default=())
    pending: list[tuple[int, int]] = field(default_factory=list)  # (prompt index, sample index) not yet decoded
    results: list[list[Sample | None]] = field(default_factory=list)
    left: int = 0
    chunks: int = 0  # engine calls made for this job so far (a seeded job's k-th call is seeded with seed + k)

    def __post_init__(self) -> None:
        self.pending = [(p, s) for p in range(len(self.prompts)) for s in range(self.params.n)]
        self.results = [[None] * self.params.n for _ in self.prompts]
        self.left = len(self.pending)

    @property
    def rows(self) -> int:
        return len(self.pending)


class BatchingEngine:
    """``await generate(prompts, params)`` -> one list of ``params.n`` samples per prompt, batched with other calls.

    Fair between requests: one engine call takes at most ``max_rows_per_request`` sequences of any one request, and
    shares ``max_batch_rows`` round-robin between the requests waiting, so a request asking for hundreds of
    sequences is decoded over several calls and a small request that arrives meanwhile joins the next one.
    """

    def __init__(self, engine: RolloutEngine, *, max_batch_rows: int = 256, batch_wait_s: float = 0.005,
                 max_rows_per_request: int | None = None) -> None:
        self.engine = engine
        self.max_batch_rows = max_batch_rows
        self.max_rows_per_request = max(1, min(max_rows_per_request or max(1, max_batch_rows // 4), max_batch_rows))
        self.batch_wait_s = batch_wait_s
        self._queue: list[_Job] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-engine")
        self._solo = itertools.count()
        self.engine_calls = 0
        self.requests_done = 0

    def _key(self, params: SamplingParams) -> tuple:
        base = (params.temperature, params.top_p, params.top_k, params.max_tokens, params.stop_token_ids)
        if not params.greedy and params.seed is not None:
            return ("solo", next(self._solo)) + base
        return base

    async def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        job = _Job(prompts, params, loop.create_future(), self._key(params))
        self._queue.append(job)
        assert self._wake is not None
        self._wake.set()
        return await job.future

    def _take(self) -> list[tuple[_Job, list[tuple[int, int]]]]:
        """(job, rows) pairs for the next engine calls: round-robin over waiting jobs, oldest first."""
        self._queue = [j for j in self._queue if not j.future.done()]  # clients that went away
        taken: list[list[tuple[int, int]]] = [[] for _ in self._queue]
        budget, progressed = self.max_batch_rows, True
        while budget > 0 and progressed:
            progressed = False
            for job, have in zip(self._queue, taken):
                if budget == 0 or not job.pending or len(have) >= self.max_rows_per_request:
                    continue
                if job.key[:1] == ("solo",):  # a seeded job is cut into the same chunks whatever else is waiting
                    step = min(len(job.pending), self.max_rows_per_request)
                    if have or step > budget:
                        continue
                else:
                    step = 1
                have.extend(job.pending[:step])
                del job.pending[:step]
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
            parts = self._take()
            groups: dict[tuple, list[tuple[_Job, list[tuple[int, int]]]]] = {}
            for job, rows in parts:
                groups.setdefault(job.key, []).append((job, rows))
            for group in groups.values():
                try:
                    samples = await loop.run_in_executor(self._executor, self._generate_group, group)
                except Exception as e:  # an engine failure fails these requests, never the server
                    for job, _ in group:
                        if not job.future.done():
                            job.future.set_exception(e)
                    continue
                k = 0
                for job, rows in group:
                    for p, s in rows:
                        job.results[p][s] = samples[k]
                        k += 1
                    job.left -= len(rows)
                    if job.left == 0 and not job.future.done():
                        job.future.set_result(job.results)
                        self.requests_done += 1
            self._queue = [j for j in self._queue if j.pending and not j.future.done()]
            if self._queue:
                self._wake.set()

    def _generate_group(self, group: list[tuple[_Job, list[tuple[int, int]]]]) -> list[Sample]:
        first_job = group[0][0]
        first = first_job.params
        rows = [job.prompts[p] for job, part in group for p, _ in part]
        seed = None
        if not first.greedy and first.seed is not None:
            seed = first.seed + first_job.chunks
        first_job.chunks += 1
        params = SamplingParams(n=1, temperature=first.temperature, top_p=first.top_p, top_k=first.top_k,
                                max_tokens=first.max_tokens, stop_token_ids=first.stop_token_ids, seed=seed)
        self.engine_calls += 1
        out = self.engine.generate(rows, params)
        return [(out.response_ids[k], out.logprobs[k], out.finish_reason[k]) for k in range(len(rows))]

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
