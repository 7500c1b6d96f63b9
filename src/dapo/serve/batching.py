"""Batch concurrent requests into engine calls.

Requests wait in a queue; whenever the engine is free, everything queued (up to ``max_batch_rows`` sequences) is taken
and grouped by sampling settings (temperature, top-p, top-k, max_tokens, stop ids); each group is one
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

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.params.n


class BatchingEngine:
    """``await generate(prompts, params)`` -> one list of ``params.n`` samples per prompt, batched with other calls."""

    def __init__(self, engine: RolloutEngine, *, max_batch_rows: int = 256, batch_wait_s: float = 0.005) -> None:
        self.engine = engine
        self.max_batch_rows = max_batch_rows
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

    def _take(self) -> list[_Job]:
        taken, rows = [], 0
        while self._queue and (not taken or rows + self._queue[0].rows <= self.max_batch_rows):
            job = self._queue.pop(0)
            if job.future.done():  # the client went away
                continue
            taken.append(job)
            rows += job.rows
        return taken

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            await self._wake.wait()
            if self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)
            self._wake.clear()
            jobs = self._take()
            groups: dict[tuple, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            for group in groups.values():
                try:
                    results = await loop.run_in_executor(self._executor, self._generate_group, group)
                except Exception as e:  # an engine failure fails these requests, never the server
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(e)
                    continue
                for job, result in zip(group, results):
                    if not job.future.done():
                        job.future.set_result(result)
                self.requests_done += len(group)
            if self._queue:
                self._wake.set()

    def _generate_group(self, group: list[_Job]) -> list[list[list[Sample]]]:
        first = group[0].params
        rows: list[list[int]] = []
        for job in group:
            for prompt in job.prompts:
                rows.extend([prompt] * job.params.n)
        params = SamplingParams(n=1, temperature=first.temperature, top_p=first.top_p, top_k=first.top_k,
                                max_tokens=first.max_tokens, stop_token_ids=first.stop_token_ids,
                                seed=first.seed if not first.greedy else None)
        self.engine_calls += 1
        out = self.engine.generate(rows, params)
        results, k = [], 0
        for job in group:
            per_prompt = []
            for _ in job.prompts:
                samples = []
                for _ in range(job.params.n):
                    samples.append((out.response_ids[k], out.logprobs[k], out.finish_reason[k]))
                    k += 1
                per_prompt.append(samples)
            results.append(per_prompt)
        return results

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
