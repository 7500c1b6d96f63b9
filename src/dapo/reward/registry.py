"""Which scorer judges a response, chosen by the data set's ``data_source``; and one uniform way to call it.

A scorer is ``fn(solution_str, ground_truth, extra_info) -> float | dict`` (dict: ``"score"`` and
optionally ``"acc"``, ``"pred"``). Patterns are case-sensitive ``fnmatch`` globs matched against the whole
``data_source``; the most recently registered matching pattern wins, so ``register_scorer`` overrides a
built-in. Built-ins (``builtin_registry``):

=====================================================  ===================================================
data_source                                            scorer
=====================================================  ===================================================
``math_dapo``, ``math_dapo*``, ``DAPO-17k``,           ``math_dapo_scorer`` (DAPO's rule: ``Answer:`` line,
``DAPO-Math-17k*``, ``*/DAPO-Math-17k*``, ``aime*``,   exact match after normalisation)
``AIME*``, ``*/aime*``, ``synth*``
``gsm8k*``, ``*/gsm8k*``                               ``gsm8k_score`` (also ``#### N``; no last-number
                                                       fallback)
``math500*``, ``MATH*``, ``*/MATH*``                   ``SymbolicMathScorer`` (math-verify) when installed,
                                                       else ``math_dapo_scorer``
=====================================================  ===================================================

The module-level ``DEFAULT_REGISTRY`` (behind ``get_scorer`` / ``register_scorer``) is this package's one
piece of process-wide mutable state, kept because verl-style code registers scorers by side effect. Code
that wants isolation builds its own ``ScorerRegistry`` and passes it around. Pool workers receive a
pickled copy of the registry, so registered scorers must be picklable (module-level functions).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

from dapo.reward.custom_fn import load_custom_reward_fn
from dapo.reward.gsm8k import gsm8k_score
from dapo.reward.math_dapo import math_dapo_scorer
from dapo.reward.math_dapo_reference import math_dapo_reference_scorer
from dapo.reward.math_verify_scorer import SymbolicMathScorer
from dapo.reward.records import RewardResult, as_reward_result
from dapo.reward.symbolic import math_verify_available

Scorer = Callable[[str, str, "dict | None"], Any]
"""``fn(solution_str, ground_truth, extra_info) -> float | dict``."""

MATH_DAPO_PATTERNS: tuple[str, ...] = (
    "math_dapo",
    "math_dapo*",
    "DAPO-17k",
    "DAPO-Math-17k*",
    "*/DAPO-Math-17k*",
    "aime*",
    "AIME*",
    "*/aime*",
    "synth*",
)
GSM8K_PATTERNS: tuple[str, ...] = ("gsm8k*", "*/gsm8k*")
SYMBOLIC_PATTERNS: tuple[str, ...] = ("math500*", "MATH*", "*/MATH*")

__all__ = [
    "DEFAULT_REGISTRY",
    "Scorer",
    "ScorerRegistry",
    "UnknownDataSourceError",
    "builtin_registry",
    "get_scorer",
    "load_custom_reward_fn",
    "register_scorer",
    "registry_for_compat",
    "score_one",
]


class UnknownDataSourceError(LookupError):
    """No scorer is registered for a data_source (the message lists the registered patterns)."""


class ScorerRegistry:
    """An ordered list of ``(pattern, scorer)``; lookup returns the newest matching entry."""

    def __init__(self) -> None:
        self._entries: list[tuple[str, Scorer]] = []

    def register(self, pattern: str, fn: Scorer) -> None:
        """Send every data_source matching the glob ``pattern`` to ``fn`` (replaces an equal pattern)."""
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"scorer pattern must be a non-empty string, got {pattern!r}")
        if not callable(fn):
            raise TypeError(f"scorer for pattern {pattern!r} must be callable, got {type(fn).__name__}")
        self._entries = [(p, f) for p, f in self._entries if p != pattern]
        self._entries.append((pattern, fn))

    def unregister(self, pattern: str) -> None:
        """Remove ``pattern`` (a ``KeyError`` if it is not registered)."""
        if pattern not in self.patterns:
            raise KeyError(f"scorer pattern {pattern!r} is not registered; registered: {self.patterns}")
        self._entries = [(p, f) for p, f in self._entries if p != pattern]

    @property
    def patterns(self) -> list[str]:
        """Registered patterns, newest (highest precedence) first."""
        return [p for p, _ in reversed(self._entries)]

    def find(self, data_source: str) -> Scorer | None:
        """The scorer for ``data_source``, or None."""
        for pattern, fn in reversed(self._entries):
            if fnmatch.fnmatchcase(data_source, pattern):
                return fn
        return None

    def get(self, data_source: str, default: Scorer | None = None) -> Scorer:
        """The scorer for ``data_source``; ``default`` if none matches; else ``UnknownDataSourceError``."""
        if not isinstance(data_source, str):
            raise TypeError(f"data_source must be str, got {type(data_source).__name__}: {data_source!r:.80}")
        fn = self.find(data_source)
        if fn is not None:
            return fn
        if default is not None:
            return default
        raise UnknownDataSourceError(
            f"no reward scorer for data_source {data_source!r}; registered patterns: {self.patterns}. "
            "Register one with dapo.reward.registry.register_scorer(pattern, fn), set a custom reward "
            "function, or pass default=... to fall back."
        )


def builtin_registry(*, symbolic_timeout_s: float = 5.0, compat: str = "improved") -> ScorerRegistry:
    """A fresh registry holding the built-in scorers (see the module docstring's table).

    ``compat="reference"`` (``reward_model.compat``) sends the DAPO patterns to the published scorer exactly
    (``dapo.reward.math_dapo_reference``) instead of the improved one; the other patterns are unchanged.
    """
    if compat not in ("improved", "reference"):
        raise ValueError(f"compat must be 'improved' or 'reference', got {compat!r}")
    dapo_rule: Scorer = math_dapo_reference_scorer if compat == "reference" else math_dapo_scorer
    registry = ScorerRegistry()
    symbolic: Scorer = SymbolicMathScorer(symbolic_timeout_s) if math_verify_available() else math_dapo_scorer
    for pattern in SYMBOLIC_PATTERNS:
        registry.register(pattern, symbolic)
    for pattern in GSM8K_PATTERNS:
        registry.register(pattern, gsm8k_score)
    for pattern in MATH_DAPO_PATTERNS:
        registry.register(pattern, dapo_rule)
    return registry


DEFAULT_REGISTRY: ScorerRegistry = builtin_registry()


def registry_for_compat(compat: str) -> ScorerRegistry | None:
    """The registry ``reward_model.compat`` asks for: None (the default registry) for 'improved', else a fresh
    registry whose DAPO patterns use the published scorer."""
    return None if compat == "improved" else builtin_registry(compat=compat)


def register_scorer(pattern: str, fn: Scorer) -> None:
    """Register ``fn`` for data_sources matching ``pattern`` in the default registry (overrides built-ins)."""
    DEFAULT_REGISTRY.register(pattern, fn)


def get_scorer(data_source: str, default: Scorer | None = None) -> Scorer:
    """The default registry's scorer for ``data_source`` (``default`` if none; else a clear error)."""
    return DEFAULT_REGISTRY.get(data_source, default)


def score_one(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    scorer: Scorer | None = None,
) -> RewardResult:
    """Score one response with ``scorer`` (default: ``get_scorer(data_source)``), as a ``RewardResult``."""
    fn = scorer if scorer is not None else get_scorer(data_source)
    return as_reward_result(fn(solution_str, ground_truth, extra_info), where=f"scorer {_name(fn)}")


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
