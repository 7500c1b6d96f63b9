"""Score a batch of responses, in-process or in a crash- and hang-proof process pool.

``num_workers=0`` scores in the calling process. The built-in scorers are bounded there too (the exact
path is linear-time on a 300-character tail; the symbolic path has its own killable child with a hard
limit), but a custom reward function is not: give ``num_workers >= 1`` to bound an untrusted one by
``timeout_s`` per item.

Pool or not? On the integer answers of DAPO-Math-17k and AIME a response costs about 10 microseconds
in-process, less than sending it to another process, so the pool only pays off for expensive scorers
(math-verify, custom functions). See docs/reward.md for the measurements (benchmarks/bench_reward.py).
``score_batch`` starts and stops its pool on every call (0.2-0.5 s on 2 cores); a caller scoring
many batches keeps one ``RewardWorkerPool`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from dapo.reward.item_scorer import ItemScorer
from dapo.reward.pool import RewardScoringError, RewardWorkerPool
from dapo.reward.records import RewardInput, RewardResult
from dapo.reward.registry import ScorerRegistry

__all__ = ["RewardInput", "RewardResult", "RewardScoringError", "RewardWorkerPool", "score_batch"]


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
    With ``num_workers >= 1`` an item whose scorer runs past ``timeout_s`` (or crashes its worker)
    yields score -1 / acc False and the pool carries on.
    """
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"score_batch num_workers must be an int >= 0, got {num_workers!r}")
    for k, item in enumerate(items):
        if not isinstance(item, RewardInput):
            raise TypeError(f"score_batch items[{k}] must be a RewardInput, got {type(item).__name__}")
    if num_workers == 0:
        item_scorer = ItemScorer(registry, custom_fn_spec)
        item_scorer.prepare(items, warm_up=False)
        results = []
        for k, item in enumerate(items):
            try:
                results.append(item_scorer(item))
            except Exception as e:
                raise RewardScoringError(
                    f"scoring item {k} (data_source={item.data_source!r}) raised {type(e).__name__}: {e}"
                ) from e
        return results
    if not items:
        return []
    with RewardWorkerPool(
        num_workers, timeout_s=timeout_s, registry=registry, custom_fn_spec=custom_fn_spec
    ) as pool:
        return pool.score(items)
