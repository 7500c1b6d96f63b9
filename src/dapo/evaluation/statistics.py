"""Sample statistics: a mean with its spread and 95% interval, over problems or over seeds; seeded-run summaries.

Over problems: an accuracy measured on P problems with k samples each is a mean of P per-problem accuracies (the
samples of one problem are correlated, so the problem is the unit), and its 95% interval is mean +- 1.96 s / sqrt(P)
(normal approximation; validation and ``dapo eval`` report the half-width beside the accuracy).

Over seeds: a single seed cannot separate techniques whose effects are smaller than seed-to-seed noise (the six-config ablation
on one seed did not), so every comparison in ``docs/results.md`` is a mean +- sample standard deviation over seeds,
with the seed count beside it. Inputs are the per-step metric records of ``metrics.jsonl`` (``read_metrics``); this
module does no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dapo.infra.tracking import val_acc_keys

__all__ = [
    "MeanStd",
    "RunSummary",
    "SeedBand",
    "config_of_run",
    "group_share_series",
    "mean_std",
    "seed_band",
    "series",
    "steps_to_reach",
    "summarize_run",
    "val_acc_key_of",
]

_SEED_SUFFIX = re.compile(r"^(?P<config>.+)-s(?P<seed>\d+)$")


@dataclass(frozen=True)
class MeanStd:
    mean: float
    std: float  # sample standard deviation (ddof = 1); 0 for a single value
    n: int

    @property
    def ci95(self) -> float | None:
        """Half-width of the 95% interval of the mean (normal approximation): 1.96 s / sqrt(n); None below n = 2."""
        return 1.96 * self.std / math.sqrt(self.n) if self.n > 1 else None

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        if math.isnan(self.mean):
            return "n/a"
        return f"{self.mean:{spec}} ± {self.std:{spec}}" if self.n > 1 else f"{self.mean:{spec}}"


def mean_std(values: Sequence[float | None]) -> MeanStd:
    """Mean and sample standard deviation of the values that are not None or NaN (NaN mean when none are)."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return MeanStd(float("nan"), float("nan"), 0)
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return MeanStd(mean, math.sqrt(var), len(xs))


def config_of_run(name: str) -> tuple[str, int | None]:
    """``ablation-3-clip-higher-s2`` -> (``ablation-3-clip-higher``, 2); a name without ``-s<seed>`` is its own config."""
    m = _SEED_SUFFIX.match(name)
    return (m["config"], int(m["seed"])) if m else (name, None)


def series(records: Sequence[Mapping], key: str) -> list[tuple[int, float]]:
    """(step, value) of every record that logged ``key`` (finite values only)."""
    return [
        (int(r["step"]), float(r[key])) for r in records if r.get(key) is not None and not math.isnan(float(r[key]))
    ]


def val_acc_key_of(records: Sequence[Mapping]) -> str | None:
    """The run's ``val/acc/mean@k`` key (the largest k when several were logged)."""
    keys = val_acc_keys(records)
    return keys[-1] if keys else None


def steps_to_reach(points: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first step at which the value is >= ``threshold``; None when it never is (it did not reach it)."""
    return next((step for step, value in points if value >= threshold), None)


def _window_mean(points: Sequence[tuple[int, float]], window: slice) -> float | None:
    values = [v for _, v in points][window]
    return sum(values) / len(values) if values else None


def group_share_series(records: Sequence[Mapping], kind: str, groups_per_round: int) -> list[tuple[int, float]]:
    """(step, share of the step's generated groups that were all-correct or all-wrong) (``kind``: correct | wrong).

    ``groups_per_round`` is the number of prompt groups one generation round produces (``gen_batch_size``)."""
    count = {"correct": "train/num_all_correct_groups", "wrong": "train/num_all_wrong_groups"}[kind]
    return [
        (int(r["step"]), r.get(count, 0.0) / (r["train/num_gen_batches"] * groups_per_round))
        for r in records
        if r.get("train/num_gen_batches")
    ]


@dataclass(frozen=True)
class RunSummary:
    """What one run says about its technique; a None field is a metric the run did not log."""

    val_first: float | None
    val_final: float | None
    val_best: float | None
    steps_to_threshold: int | None  # first validation step at or above the threshold; None: never reached
    entropy_first: float | None  # mean of the first ``window`` steps
    entropy_last: float | None  # mean of the last ``window`` steps
    length_last: float | None
    truncated_last: float | None  # share of responses that hit L_max
    all_correct_share: float | None  # of the groups generated, the share with every sample right (Fig. 3b)
    all_wrong_share: float | None
    generated_tokens: float | None  # response tokens generated by the whole run (the cost Fig. 6 asks about)
    clip_fraction: float | None  # actor/pg_clipfrac averaged over the steps that updated (what each loss clips)
    steps: int


def summarize_run(
    records: Sequence[Mapping], *, threshold: float, groups_per_round: int, window: int = 5
) -> RunSummary:
    """Summarise one run's ``metrics.jsonl`` records.

    ``groups_per_round`` is the number of prompt groups one generation round produces (``gen_batch_size``), so that
    the all-correct / all-wrong counts become shares of the groups generated in the step.
    """
    if not records:
        raise ValueError("summarize_run: the run logged no steps")
    if groups_per_round < 1:
        raise ValueError(f"summarize_run: groups_per_round must be >= 1, got {groups_per_round}")
    key = val_acc_key_of(records)
    val = series(records, key) if key else []
    first, last = slice(0, window), slice(-window, None)
    shares = {
        kind: [v for _, v in group_share_series(records, kind, groups_per_round)] for kind in ("correct", "wrong")
    }
    totals = series(records, "train/generated_tokens_total")
    return RunSummary(
        val_first=val[0][1] if val else None,
        val_final=val[-1][1] if val else None,
        val_best=max(v for _, v in val) if val else None,
        steps_to_threshold=steps_to_reach(val, threshold),
        entropy_first=_window_mean(series(records, "actor/entropy"), first),
        entropy_last=_window_mean(series(records, "actor/entropy"), last),
        length_last=_window_mean(series(records, "response_length/mean"), last),
        truncated_last=_window_mean(series(records, "response_length/clip_ratio"), last),
        all_correct_share=sum(shares["correct"]) / len(shares["correct"]) if shares["correct"] else None,
        all_wrong_share=sum(shares["wrong"]) / len(shares["wrong"]) if shares["wrong"] else None,
        generated_tokens=totals[-1][1] if totals else None,
        clip_fraction=_window_mean(series(records, "actor/pg_clipfrac"), slice(None)),
        steps=int(records[-1]["step"]),
    )


@dataclass(frozen=True)
class SeedBand:
    """A metric across seeds at the x values every seed logged: the line and the +- 1 std band of a plot."""

    x: list[float]
    mean: list[float]
    std: list[float]
    n: int


def seed_band(curves: Sequence[Sequence[tuple[float, float]]]) -> SeedBand:
    """Mean and sample std over seeds at each x present in every curve (seeds that validate at the same steps)."""
    if not curves:
        raise ValueError("seed_band: no curves")
    common = set.intersection(*({x for x, _ in c} for c in curves))
    xs = sorted(common)
    by_x = [dict(c) for c in curves]
    stats = [mean_std([d[x] for d in by_x]) for x in xs]
    return SeedBand(x=list(xs), mean=[s.mean for s in stats], std=[s.std for s in stats], n=len(curves))
