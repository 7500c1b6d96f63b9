"""Several rollout engines behind one engine: the trainer's view of M rollout ranks (disaggregated training).

Each rollout rank owns one engine (:class:`dapo.rollout.worker.RemoteEngine`). A generation call is dealt out in
contiguous shares of its prompts, one per engine (sizes differ by at most one, the first engines taking the extra
prompt), the shares generate concurrently, and the outputs are merged back in prompt order. Every prompt carries its
own seed (``SamplingParams.prompt_seeds``, derived from its position in the whole batch), so how the prompts are dealt
does not change what is sampled: M engines draw what one engine would, up to float rounding of differently shaped
batches. Dynamic sampling (Eq. 11 and the refill buffer) works on the merged rounds, so over-generation stays bounded
exactly as with one engine.

One weight push reaches every engine: the engines share one weight group with the trainer (trainer rank 0, engine i
rank i + 1) and one broadcast per dtype carries the weights to all of them (``push_to_engines``). The probe
(``log_probs_of``) asks every engine and reports the largest disagreement between them, so a rank that missed a push
cannot hide behind the others.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from dapo.rollout.base import RolloutOutput, SamplingParams
from dapo.rollout.worker import RemoteEngine, RolloutWorkerDied, RolloutWorkerError, push_to_engines


def deal(num_prompts: int, engines: int) -> list[slice]:
    """Contiguous shares of ``num_prompts`` for ``engines`` engines, sizes differing by at most one (the first
    ``num_prompts % engines`` take one more); an engine may get an empty share."""
    base, extra = divmod(num_prompts, engines)
    shares, start = [], 0
    for i in range(engines):
        size = base + (1 if i < extra else 0)
        shares.append(slice(start, start + size))
        start += size
    return shares


def merge(outputs: Sequence[RolloutOutput], shares: Sequence[slice]) -> RolloutOutput:
    """The engines' outputs for their shares as one output over the whole call, prompts in input order."""
    prompt_index, response_ids, logprobs, finish_reason, versions = [], [], [], [], []
    for out, share in zip(outputs, shares, strict=True):
        prompt_index += [share.start + i for i in out.prompt_index]
        response_ids += out.response_ids
        logprobs += out.logprobs
        finish_reason += out.finish_reason
        versions += out.token_versions if out.token_versions is not None else [[] for _ in out.response_ids]
    tracked = all(out.token_versions is not None for out in outputs)
    routed = all(out.routed_experts is not None for out in outputs)  # R3: every engine records, or none does
    return RolloutOutput(
        prompt_index,
        response_ids,
        logprobs,
        finish_reason,
        token_versions=versions if tracked else None,
        routed_experts=[r for out in outputs for r in out.routed_experts] if routed else None,  # type: ignore[union-attr]
    )


class EngineFleet:
    """M remote engines as one :class:`~dapo.rollout.base.RolloutEngine` (module docstring)."""

    def __init__(self, engines: Sequence[RemoteEngine], transport: Any, ranks: Sequence[int]) -> None:
        """``ranks``: the torchrun rank of each engine, for messages."""
        if not engines or len(engines) != len(ranks):
            raise ValueError("EngineFleet: one torchrun rank per engine, at least one engine")
        self.engines, self._transport, self.ranks = list(engines), transport, list(ranks)
        self._pool = concurrent.futures.ThreadPoolExecutor(len(self.engines), thread_name_prefix="dapo-fleet")
        self.last_push: dict[str, float] = {}
        self.samples_per_engine = [0] * len(self.engines)  # since the last read (per-engine counts, every step)
        self._closed = False
        self.death = "a rollout rank died"

    @property
    def weight_version(self) -> int:
        return min(engine.weight_version for engine in self.engines)

    @property
    def restarts(self) -> int:
        return sum(engine.restarts for engine in self.engines)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        shares = deal(len(prompt_token_ids), len(self.engines))
        busy = [(i, share) for i, share in enumerate(shares) if share.stop > share.start]

        def run(job: tuple[int, slice]) -> RolloutOutput:
            i, share = job
            seeds = params.prompt_seeds
            part = params if seeds is None else dataclasses.replace(params, prompt_seeds=tuple(seeds[share]))
            with self._naming(i):
                return self.engines[i].generate(list(prompt_token_ids[share]), part)

        outputs = list(self._pool.map(run, busy))
        for (i, _), out in zip(busy, outputs, strict=True):
            self.samples_per_engine[i] += len(out.response_ids)
        return merge(outputs, [share for _, share in busy])

    def take_engine_counts(self) -> dict[str, float]:
        """``async/engine_samples/<i>``: samples each engine generated since the last call (every engine should
        contribute every step)."""
        counts = {f"async/engine_samples/{i}": float(n) for i, n in enumerate(self.samples_per_engine)}
        self.samples_per_engine = [0] * len(self.engines)
        return counts

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        try:
            self.last_push = push_to_engines(self.engines, self._transport, named_tensors, version)
        except RolloutWorkerError as exc:
            dead = getattr(exc, "engine", None)
            with self._naming(self.engines.index(dead) if dead in self.engines else None):
                raise
        return self.last_push

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.push_weights(named_tensors, self.weight_version + 1)

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Every engine's log-probs of the probe; engines holding the same weights agree, and one that does not is
        a rank that missed a push: stop, naming it."""

        def probe(i: int) -> list[float]:
            with self._naming(i):
                return self.engines[i].log_probs_of(prompt_token_ids, response_ids)

        answers = list(self._pool.map(probe, range(len(self.engines))))
        first = torch.tensor(answers[0], dtype=torch.float64)
        for i, other in enumerate(answers[1:], start=1):
            gap = float((torch.tensor(other, dtype=torch.float64) - first).abs().max())
            if gap > 1e-4:  # the same weights on the same kernels: rounding differences only (~1e-7)
                raise RolloutWorkerError(
                    f"the engine of rollout rank {self.ranks[i]} disagrees with rank {self.ranks[0]}'s on the weight probe by {gap:.3g} (max |log-prob "
                    "difference|) after the same push: it holds other weights than the others"
                )
        return answers[0]

    @contextlib.contextmanager
    def _naming(self, i: int | None) -> Iterator[None]:
        """A failure of engine ``i`` as the fleet's, naming its torchrun rank; a death becomes the fleet's death, so
        the run's restart path sees it (and ``respawn`` says why a rank is not restarted)."""
        try:
            yield
        except RolloutWorkerDied as death:
            rank = "a rollout rank" if i is None else f"rollout rank {self.ranks[i]}"
            self.death = f"{rank}: {death}"
            raise RolloutWorkerDied(self.death, engine=self) from None  # type: ignore[arg-type]
        except RolloutWorkerError as exc:
            if i is None:
                raise
            raise type(exc)(f"rollout rank {self.ranks[i]}: {exc}") from None

    def respawn(self) -> EngineFleet:
        raise RolloutWorkerError(
            f"{self.death}. A rollout rank is torchrun's process, not the trainer's: it cannot "
            "be restarted from here; torchrun's --max-restarts restarts the job, which resumes "
            "from the last checkpoint"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for engine in self.engines:
            engine.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._transport.close()
