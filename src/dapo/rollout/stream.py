"""The streaming engine interface for an engine in this process, and the blocking call on top of any streaming one.

An in-process engine has nothing to overlap with (it computes in the caller's thread), so :class:`InProcessStream`
runs queued requests when results are asked for. The synchronous trainer is then the case "submit, then receive
everything": the same calls an engine in its own process (``dapo.rollout.worker``) answers while the trainer works.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from dapo.rollout.base import FinishedRequest, RolloutEngine, RolloutOutput, SamplingParams


class InProcessStream:
    """:class:`~dapo.rollout.base.StreamingEngine` over a blocking engine of this process."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self._version = 0
        self._next_id = 0
        self._queued: dict[int, tuple[list[list[int]], SamplingParams]] = {}

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> int:
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._queued[request_id] = ([list(p) for p in prompt_token_ids], params)
        return request_id

    def receive(self, timeout: float | None = None) -> list[FinishedRequest]:
        finished = []
        for request_id in list(self._queued):
            prompts, params = self._queued.pop(request_id)
            output = self.engine.generate(prompts, params)
            finished.append(
                FinishedRequest(request_id, output, [[self._version] * len(ids) for ids in output.response_ids])
            )
        return finished

    def abort(self, request_id: int) -> None:
        self._queued.pop(request_id, None)

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        self.engine.update_weights(named_tensors)
        self._version = version
        return {}


def generate_through(
    stream, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams
) -> tuple[RolloutOutput, list[list[int]]]:
    """Blocking generation over a streaming engine: the request's output and its per-token weight versions. Other
    requests that finish meanwhile are not this caller's; it must be the only one waiting on ``stream``."""
    request_id = stream.submit(prompt_token_ids, params)
    while True:
        for done in stream.receive():
            if done.request_id == request_id:
                return done.output, done.token_versions
