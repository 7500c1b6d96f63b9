"""Evaluation metrics over sampled responses: avg@K, unbiased pass@k, maj@K, response length, truncation rate.

How samples are grouped. Metrics are computed per *problem*, and a problem is identified by its content
(``data_source``, prompt messages, ground truth; see :func:`dapo.evaluation.problems.problem_key`), never by its row. So
the official AIME 2024 file, which repeats each of its 30 problems 32 times, evaluated with ``--n 1`` gives 30 problems
of 32 samples each -- exactly what ``--n 32`` on a de-duplicated file gives. A problem's sample count K is
``repeats x n``.

Definitions, for a problem with n samples of which c are correct:

* ``avg@K`` (the paper's ``acc/mean@32``): the mean accuracy over samples. Overall and per data_source it is the mean
  over problems of each problem's mean. When every problem has the same number of samples (always, for a finished run)
  this equals the plain mean over all rows that the published ``eval_aime24.py`` prints. ``avg@K/ci95`` is the
  half-width of its 95% interval over problems (1.96 s / sqrt(problems); null for a single problem).
* ``pass@k``: the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``, averaged over problems;
  reported for k = 1, 2, 4, ... and K (only for k <= the smallest sample count). ``pass@1`` equals ``avg@K``.
* ``maj@K`` (cons@K): majority vote over the normalised predictions of the K samples. A sample whose prediction is
  empty (the scorer found no answer) does not vote; a problem where no sample has a prediction scores 0. Ties between
  equally frequent predictions are broken deterministically: the prediction whose first occurrence has the lowest
  sample index wins. The vote is correct when the first sample carrying the winning prediction is correct.
* ``response_length/mean``: mean response length in tokens over all samples (stop token included), problem-weighted
  like the rest; ``truncation_rate``: share of samples that ended on ``max_tokens`` (finish reason ``"length"``).
* multi-turn runs (``dapo eval --multi-turn``): ``tool/samples_with_call``, ``tool/calls_per_sample``,
  ``tool/acc_with_call``, ``tool/acc_without_call``, ``tool/errors``, ... (:func:`dapo.tools.metrics.tool_use_metrics`,
  over samples).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dapo.evaluation.statistics import mean_std
from dapo.tools.metrics import tool_use_metrics
from dapo.reward.normalize import normalize_final_answer

OVERALL = "overall"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct: ``1 - C(n-c, k) / C(n, k)``."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Product form (numerically stable, no huge binomials): prod_{i=n-c+1}^{n} (1 - k / i).
    result = 1.0
    for i in range(n - c + 1, n + 1):
        result *= 1.0 - k / i
    return 1.0 - result


def normalize_prediction(pred: str | None) -> str:
    """The form predictions are compared in for voting: Minerva normalisation (``dapo.reward.normalize``)."""
    if pred is None:
        return ""
    text = str(pred).strip()
    if not text:
        return ""
    try:
        return normalize_final_answer(text)
    except Exception:  # a hostile prediction must not break the summary; fall back to the stripped text
        return text


def majority_vote(preds: Sequence[str | None], accs: Sequence[bool]) -> tuple[str, bool]:
    """(winning normalised prediction, whether it is correct); ("", False) when no sample has a prediction.

    Ties go to the prediction that occurs first (lowest index); see the module docstring.
    """
    if len(preds) != len(accs):
        raise ValueError(f"majority_vote: {len(preds)} predictions but {len(accs)} accuracies")
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, pred in enumerate(preds):
        key = normalize_prediction(pred)
        if not key:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, index)
    if not counts:
        return "", False
    winner = min(counts, key=lambda p: (-counts[p], first[p]))
    return winner, bool(accs[first[winner]])


@dataclass(frozen=True)
class SampleOutcome:
    """What the metrics need of one sample."""

    problem_key: str
    data_source: str
    sample_index: int
    acc: bool
    pred: str = ""
    response_tokens: int = 0
    truncated: bool = False
    tool_calls: tuple[str, ...] | None = None  # multi-turn: each tool call's result category; None = single turn

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> SampleOutcome:
        """From one line of a ``dapo eval`` samples file."""
        return cls(
            problem_key=str(row["problem_key"]),
            data_source=str(row["data_source"]),
            sample_index=int(row["sample_index"]),
            acc=bool(row["acc"]),
            pred=str(row.get("prediction") or ""),
            response_tokens=int(row.get("response_tokens") or 0),
            truncated=row.get("finish_reason") == "length",
            tool_calls=None if row.get("tool_calls") is None else tuple(row["tool_calls"]),
        )


@dataclass
class ProblemStats:
    """One problem's samples, in sample-index order."""

    key: str
    data_source: str
    samples: list[SampleOutcome] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def correct(self) -> int:
        return sum(s.acc for s in self.samples)


def group_by_problem(samples: Iterable[SampleOutcome]) -> list[ProblemStats]:
    """Problems in order of first appearance, each with its samples sorted by sample index (duplicates dropped)."""
    problems: dict[str, ProblemStats] = {}
    seen: set[tuple[str, int]] = set()
    for s in samples:
        if (s.problem_key, s.sample_index) in seen:
            continue
        seen.add((s.problem_key, s.sample_index))
        problem = problems.get(s.problem_key)
        if problem is None:
            problem = problems[s.problem_key] = ProblemStats(s.problem_key, s.data_source)
        problem.samples.append(s)
    for problem in problems.values():
        problem.samples.sort(key=lambda s: s.sample_index)
    return list(problems.values())


def pass_ks(min_samples: int) -> list[int]:
    """1, 2, 4, ... up to ``min_samples``, and ``min_samples`` itself."""
    ks, k = [], 1
    while k <= min_samples:
        ks.append(k)
        k *= 2
    if min_samples >= 1 and ks[-1] != min_samples:
        ks.append(min_samples)
    return ks


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize_problems(problems: Sequence[ProblemStats]) -> dict[str, Any]:
    """The metrics of one set of problems (see the module docstring); an empty set gives ``{"problems": 0}``."""
    problems = [p for p in problems if p.n]
    if not problems:
        return {"problems": 0, "samples": 0}
    counts = [p.n for p in problems]
    accuracies = [p.correct / p.n for p in problems]
    k_min, k_max = min(counts), max(counts)
    label = str(k_max) if k_min == k_max else f"{k_min}-{k_max}"
    out: dict[str, Any] = {
        "problems": len(problems),
        "samples": sum(counts),
        "k": k_max if k_min == k_max else None,
        "samples_per_problem": label,
        f"avg@{label}": _mean(accuracies),
        # over problems, normal approximation; None (JSON null) for a single problem
        f"avg@{label}/ci95": mean_std(accuracies).ci95,
    }
    for k in pass_ks(k_min):
        out[f"pass@{k}"] = _mean([pass_at_k(p.n, p.correct, k) for p in problems])
    out[f"maj@{label}"] = _mean(
        [float(majority_vote([s.pred for s in p.samples], [s.acc for s in p.samples])[1]) for p in problems]
    )
    out["response_length/mean"] = _mean([_mean([s.response_tokens for s in p.samples]) for p in problems])
    out["truncation_rate"] = _mean([_mean([float(s.truncated) for s in p.samples]) for p in problems])
    # multi-turn samples: how they used the tool (over samples, not problem-weighted: every problem has K of them)
    out.update(
        tool_use_metrics(
            [(s.tool_calls, float(s.acc)) for p in problems for s in p.samples if s.tool_calls is not None]
        )
    )
    return out


def summarize_samples(samples: Iterable[SampleOutcome]) -> dict[str, dict[str, Any]]:
    """Metrics per data_source (sorted by name) and ``"overall"`` (last)."""
    problems = group_by_problem(samples)
    by_source: dict[str, list[ProblemStats]] = defaultdict(list)
    for p in problems:
        by_source[p.data_source].append(p)
    result = {source: summarize_problems(ps) for source, ps in sorted(by_source.items())}
    result[OVERALL] = summarize_problems(problems)
    return result


def headline(metrics: Mapping[str, Any]) -> tuple[str, float] | None:
    """The ``avg@K`` entry of one summary block, as (name, value)."""
    for name, value in metrics.items():
        if name.startswith("avg@"):
            return name, value
    return None


def is_finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
