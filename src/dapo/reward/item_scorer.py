"""Score one ``RewardInput``: with the custom reward function when one is set, else the registry's scorer.

Picklable (only the registry and the custom function's spec travel), so the same object scores in the
trainer's process and in pool workers; each process loads the custom function from its file itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dapo.reward.custom_fn import CustomRewardFn, load_custom_reward_fn
from dapo.reward.records import RewardInput, RewardResult, as_reward_result
from dapo.reward.registry import DEFAULT_REGISTRY, Scorer, ScorerRegistry


class ItemScorer:
    """Callable ``RewardInput -> RewardResult``; the scorer for each data_source is looked up once."""

    def __init__(self, registry: ScorerRegistry | None = None, custom_fn_spec: str | None = None) -> None:
        self.registry = registry if registry is not None else DEFAULT_REGISTRY
        self.custom_fn_spec = custom_fn_spec
        self._custom_fn: CustomRewardFn | None = load_custom_reward_fn(custom_fn_spec) if custom_fn_spec else None
        self._scorers: dict[str, tuple[Scorer, str]] = {}

    def prepare(self, items: Sequence[RewardInput], *, warm_up: bool = True) -> None:
        """Resolve the scorers ``items`` need (``UnknownDataSourceError`` before any work is done) and, with
        ``warm_up``, warm up those that have a ``warm_up()`` method (they start child processes)."""
        if self._custom_fn is not None:
            return
        for data_source in {item.data_source for item in items} - self._scorers.keys():
            fn, _ = self._scorer_for(data_source)
            start = getattr(fn, "warm_up", None)
            if warm_up and callable(start):
                start()

    def __call__(self, item: RewardInput) -> RewardResult:
        if self._custom_fn is not None:
            raw = self._custom_fn(
                data_source=item.data_source,
                solution_str=item.solution_str,
                ground_truth=item.ground_truth,
                extra_info=item.extra_info,
            )
            return as_reward_result(raw, where=f"custom reward function {self.custom_fn_spec}")
        fn, where = self._scorers.get(item.data_source) or self._scorer_for(item.data_source)
        return as_reward_result(fn(item.solution_str, item.ground_truth, item.extra_info), where=where)

    def _scorer_for(self, data_source: str) -> tuple[Scorer, str]:
        fn = self.registry.get(data_source)
        self._scorers[data_source] = (fn, f"scorer {getattr(fn, '__qualname__', fn)!r}")
        return self._scorers[data_source]

    def __getstate__(self) -> dict[str, Any]:
        return {"registry": self.registry, "custom_fn_spec": self.custom_fn_spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["registry"], state["custom_fn_spec"])  # type: ignore[misc]
