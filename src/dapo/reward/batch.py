"""Score a batch of responses, in-process or in a crash- and hang-proof process pool.

``num_workers=0`` scores the built-in scorers in the calling process: they are bounded there (the exact path is
linear-time on a 300-character tail; the symbolic path has its own killable child with a hard limit). A custom
reward function is never trusted that far: with ``num_workers=0`` it runs in one worker process, so a call that
hangs, crashes or calls ``os._exit`` is bounded by ``timeout_s`` in every mode and never takes the trainer with it.

Pool or not? On the integer answers of DAPO-Math-17k and AIME a response costs about 10 microseconds
in-process, less than sending it to another process, so the pool only pays off for expensive scorers
(math-verify, custom functions). See docs/reward.md for the measurements (benchmarks/bench_reward.py).
``score_batch`` starts and stops its pool on every call (0.2-0.5 s on 2 cores); a caller scoring
many batches keeps one ``RewardScorer`` (or ``RewardWorkerPool``) instead.

``RewardScorer`` adds the failure policy a training run needs: every failed call (timeout, worker crash, error) is
counted (``counts``), logged with its data_source and sample index, and scored -1 / wrong; the run stops with a
``RewardScoringError`` about the reward function when ``on_failure="stop"``, when more than ``max_failures`` calls
failed, or when every call of a batch failed (a broken reward function, not data that is too hard).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dapo.reward.item_scorer import ItemScorer
from dapo.reward.pool import RewardBatchStopped, RewardScoringError, RewardWorkerPool
from dapo.reward.records import FAILURE_KINDS, InvalidRewardError, RewardInput, RewardResult
from dapo.reward.registry import ScorerRegistry

__all__ = ["RewardInput", "RewardResult", "RewardScorer", "RewardScoringError", "RewardWorkerPool", "score_batch"]

log = logging.getLogger(__name__)

ON_FAILURE = ("score_as_failed", "stop")
_LOGGED_PER_BATCH = 5


def score_batch(
    items: Sequence[RewardInput],
    *,
    num_workers: int = 0,
    timeout_s: float = 10.0,
    custom_fn_spec: str | None = None,
    registry: ScorerRegistry | None = None,
) -> list[RewardResult]:
    """One ``RewardResult`` per item, in input order.

    Each item is scored by the custom reward function ``custom_fn_spec`` (``"file.py:function"``) when
    given, else by the scorer registered for its ``data_source`` (``registry``, default: the package's).
    An item whose scorer runs past ``timeout_s`` (or crashes its worker) yields score -1 / acc False
    and the pool carries on; a scorer that raises stops with ``RewardScoringError`` naming the item.
    """
    _check_items(items, num_workers)
    if num_workers == 0 and custom_fn_spec is None:
        return _score_in_process(ItemScorer(registry, None), items, capture_errors=False)
    if not items:
        return []
    with RewardWorkerPool(
        max(1, num_workers), timeout_s=timeout_s, registry=registry, custom_fn_spec=custom_fn_spec
    ) as pool:
        return pool.score(items)


class RewardScorer:
    """Scores batch after batch with one pool kept for its lifetime, and applies the failure policy.

    ``counts`` holds the failed calls so far by kind (``timeout``, ``worker_crash``, ``error``). Use as a context
    manager (or call ``close``).
    """

    def __init__(
        self,
        *,
        num_workers: int = 0,
        timeout_s: float = 10.0,
        custom_fn_spec: str | None = None,
        registry: ScorerRegistry | None = None,
        on_failure: str = "score_as_failed",
        max_failures: int | None = None,
    ) -> None:
        if on_failure not in ON_FAILURE:
            raise ValueError(f"RewardScorer on_failure must be one of {ON_FAILURE}, got {on_failure!r}")
        _check_items((), num_workers)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.custom_fn_spec = custom_fn_spec
        self.registry = registry
        self.on_failure = on_failure
        self.max_failures = max_failures
        self.counts: dict[str, int] = dict.fromkeys(FAILURE_KINDS, 0)
        self._in_process = ItemScorer(registry, None) if num_workers == 0 and custom_fn_spec is None else None
        self._pool: RewardWorkerPool | None = None

    def score(self, items: Sequence[RewardInput]) -> list[RewardResult]:
        _check_items(items, self.num_workers)
        if not items:
            return []
        if self._in_process is not None:
            results = _score_in_process(self._in_process, items, capture_errors=True)
        else:
            if self._pool is None:
                self._pool = RewardWorkerPool(
                    max(1, self.num_workers),
                    timeout_s=self.timeout_s,
                    registry=self.registry,
                    custom_fn_spec=self.custom_fn_spec,
                    capture_errors=True,
                )
            try:
                results = self._pool.score(items, stop_after_failures=self._failures_allowed())
            except RewardBatchStopped as stopped:  # the policy stops the run: no use scoring the rest
                self._apply_policy(items, stopped.results)
                raise AssertionError("the reward pool stopped a batch the failure policy lets continue") from None
        self._apply_policy(items, results)
        return results

    def _failures_allowed(self) -> int | None:
        """Failed calls in the next batch after which the policy stops the run anyway (None: only at its end)."""
        if self.on_failure == "stop":
            return 1
        if self.max_failures is not None:
            return self.max_failures - self.total_failures + 1
        return None

    @property
    def total_failures(self) -> int:
        return sum(self.counts.values())

    def _what(self) -> str:
        return f"the custom reward function {self.custom_fn_spec}" if self.custom_fn_spec else "the reward scorer"

    def _apply_policy(self, items: Sequence[RewardInput], results: Sequence[RewardResult | None]) -> None:
        """Count and log the failed calls of a batch; raise ``RewardScoringError`` when the policy says stop.

        ``results`` holds None for responses not scored because the batch was stopped early."""
        failed = [i for i, r in enumerate(results) if r is not None and r.failure]
        if not failed:
            return
        batch_counts = dict.fromkeys(FAILURE_KINDS, 0)
        for i in failed:
            batch_counts[results[i].failure] += 1
            self.counts[results[i].failure] += 1
        for i in failed[:_LOGGED_PER_BATCH]:
            log.warning(
                "reward %s for sample %d (data_source=%r): %s; scored -1 / wrong",
                results[i].failure,
                i,
                items[i].data_source,
                results[i].error,
            )
        if len(failed) > _LOGGED_PER_BATCH:
            log.warning("... and %d more failed reward calls in this batch", len(failed) - _LOGGED_PER_BATCH)
        first = results[failed[0]]
        assert first is not None
        unscored = sum(r is None for r in results)
        detail = (
            f"{batch_counts['timeout']} timeouts, {batch_counts['worker_crash']} worker crashes, "
            f"{batch_counts['error']} errors; first: sample {failed[0]} "
            f"(data_source={items[failed[0]].data_source!r}): {first.failure}: {first.error}"
            + (f"; the other {unscored} responses of the batch were not scored" if unscored else "")
        )
        if self.on_failure == "stop":
            raise RewardScoringError(f"a call to {self._what()} failed and reward_model.on_failure=stop ({detail})")
        if len(failed) == len(results):
            raise RewardScoringError(
                f"every call to {self._what()} failed in a batch of {len(results)} responses ({detail}). The reward "
                "function is broken, not the data: fix it (or raise reward_model.timeout_s if it is only slow)"
            )
        if self.max_failures is not None and self.total_failures > self.max_failures:
            raise RewardScoringError(
                f"{self.total_failures} calls to {self._what()} failed in this run, more than "
                f"reward_model.max_failures={self.max_failures} (this batch: {detail})"
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_items(items: Sequence[RewardInput], num_workers: int) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"score_batch num_workers must be an int >= 0, got {num_workers!r}")
    for k, item in enumerate(items):
        if not isinstance(item, RewardInput):
            raise TypeError(f"score_batch items[{k}] must be a RewardInput, got {type(item).__name__}")


def _score_in_process(
    item_scorer: ItemScorer, items: Sequence[RewardInput], *, capture_errors: bool
) -> list[RewardResult]:
    item_scorer.prepare(items, warm_up=False)
    results = []
    for k, item in enumerate(items):
        try:
            results.append(item_scorer(item))
        except Exception as e:
            if capture_errors and not isinstance(e, InvalidRewardError):
                results.append(RewardResult.failed(failure="error", error=f"{type(e).__name__}: {e}"))
                continue
            raise RewardScoringError(
                f"scoring item {k} (data_source={item.data_source!r}) raised {type(e).__name__}: {e}"
            ) from e
    return results
