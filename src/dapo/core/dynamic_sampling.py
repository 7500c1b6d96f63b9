"""Dynamic Sampling (DAPO Section 3.2, Eq. 11): train only on prompt groups whose answers are neither all right nor all
wrong, and keep generating until a full batch of such groups is collected.

A group where every answer has the same accuracy has zero reward variance, so every advantage is 0 (Eq. 9) and the
group contributes no gradient, only noise in the batch size. ``select_informative_groups`` enforces the Eq. 11
constraint ``0 < |{o_i : is_equivalent(a, o_i)}| < G`` on raw accuracy (never on the shaped reward, where a length
penalty could make an all-wrong group look informative). ``DynamicSamplingAccumulator`` does the bookkeeping across
generation rounds: it holds kept groups (opaque objects of the caller's choosing) and decides when to stop.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import torch
from torch import Tensor

GroupT = TypeVar("GroupT")
OnExhausted = Literal["error", "train_on_partial"]
ON_EXHAUSTED_CHOICES: tuple[OnExhausted, ...] = ("error", "train_on_partial")


@dataclass(frozen=True)
class GroupStats:
    """Counts of one generation round's prompt groups; ``num_groups = num_all_correct + num_all_wrong + num_kept``.

    A group of one response is always all-correct or all-wrong, so it is counted there and never kept.
    """

    num_groups: int
    num_all_correct: int
    num_all_wrong: int
    num_kept: int


def _group_correct_counts(acc: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Dense group id per sample, and per group the number of correct answers and the group size."""
    if acc.dim() != 1 or group_index.dim() != 1 or acc.shape != group_index.shape:
        raise ValueError(
            "dynamic sampling: acc and group_index must both be 1-D with the same length, "
            f"got acc{tuple(acc.shape)} and group_index{tuple(group_index.shape)}"
        )
    if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
        raise TypeError(f"dynamic sampling: group_index must be an integer tensor, got {group_index.dtype}")
    if acc.dtype != torch.bool:
        not_binary = (acc != 0) & (acc != 1)
        if bool(not_binary.any()):
            bad = acc[not_binary][:5].tolist()
            raise ValueError(
                f"dynamic sampling: acc must be raw 0/1 or bool accuracy (not a shaped reward), got e.g. {bad}"
            )
    correct = acc.bool()
    _, dense_group = torch.unique(group_index, return_inverse=True)
    num_groups = int(dense_group.max()) + 1 if dense_group.numel() else 0
    zeros = torch.zeros(num_groups, dtype=torch.long, device=acc.device)
    num_correct = zeros.index_add(0, dense_group, correct.long())
    group_size = zeros.index_add(0, dense_group, torch.ones_like(dense_group))
    return dense_group, num_correct, group_size


def select_informative_groups(acc: Tensor, group_index: Tensor) -> Tensor:
    """``[B]`` bool, True for every sample of a group with ``0 < #correct < G`` (Eq. 11); size-1 groups are never kept.

    Args:
        acc: ``[B]`` raw accuracy of each response, bool or 0/1.
        group_index: ``[B]`` integer prompt-group id of each response; any ids, in any order.
    """
    dense_group, num_correct, group_size = _group_correct_counts(acc, group_index)
    informative = (num_correct > 0) & (num_correct < group_size)
    return informative[dense_group]


def group_accuracy_stats(acc: Tensor, group_index: Tensor) -> GroupStats:
    """How many groups are all-correct, all-wrong and kept (informative) under Eq. 11; same inputs as above."""
    _, num_correct, group_size = _group_correct_counts(acc, group_index)
    all_correct = int((num_correct == group_size).sum())
    all_wrong = int((num_correct == 0).sum())
    num_groups = int(group_size.numel())
    return GroupStats(
        num_groups=num_groups,
        num_all_correct=all_correct,
        num_all_wrong=all_wrong,
        num_kept=num_groups - all_correct - all_wrong,
    )


@dataclass(frozen=True)
class AccumulatorReport:
    """What one training step's dynamic sampling did; counts cover this step's generation rounds only.

    Attributes:
        num_gen_batches: generation rounds used this step.
        num_groups_generated: prompt groups generated in those rounds.
        num_groups_kept: groups kept among them (the informative ones, when filtering is on).
        kept_group_ratio: ``num_groups_kept / num_groups_generated`` (0 when nothing was generated).
        wasted_tokens: response tokens of the dropped groups, as reported by the caller.
        num_all_correct: generated groups whose answers were all right.
        num_all_wrong: generated groups whose answers were all wrong.
        partial: True when the batch has fewer groups than asked (``on_exhausted="train_on_partial"``).
        num_groups_returned: groups in the returned batch.
        num_groups_carried_in: groups carried over from the previous step (counted in no other field here).
        num_groups_surplus: kept groups beyond the target, carried to the next step or discarded.
    """

    num_gen_batches: int
    num_groups_generated: int
    num_groups_kept: int
    kept_group_ratio: float
    wasted_tokens: int
    num_all_correct: int
    num_all_wrong: int
    partial: bool
    num_groups_returned: int
    num_groups_carried_in: int
    num_groups_surplus: int


class DynamicSamplingExhausted(RuntimeError):
    """Generation rounds ran out before enough informative groups were found; ``report`` holds the counts."""

    def __init__(self, message: str, report: AccumulatorReport) -> None:
        super().__init__(message)
        self.report = report


class DynamicSamplingAccumulator(Generic[GroupT]):
    """Collects informative prompt groups across generation rounds until a training batch is full.

    Use per training step::

        while acc.should_generate_more():
            ...generate a round, score it, select informative groups...
            acc.add_round(kept_groups, num_groups_generated=..., num_all_correct=..., num_all_wrong=...,
                          wasted_tokens=...)
        batch, report = acc.pop_batch()   # exactly target_num_groups, or partial / DynamicSamplingExhausted

    Groups are opaque objects (one per prompt group, never split). ``max_num_gen_batches <= 0`` means unlimited
    rounds: the caller then loops until full, which never ends on data that yields no informative group.
    With ``carry_over_surplus`` the kept groups beyond the target start the next step's batch; they were sampled by
    the previous policy, i.e. slightly off-policy. Otherwise they are discarded.
    """

    def __init__(
        self,
        target_num_groups: int,
        max_num_gen_batches: int,
        on_exhausted: OnExhausted = "error",
        carry_over_surplus: bool = False,
    ) -> None:
        if target_num_groups <= 0:
            raise ValueError(f"DynamicSamplingAccumulator: target_num_groups must be > 0, got {target_num_groups}")
        if on_exhausted not in ON_EXHAUSTED_CHOICES:
            raise ValueError(
                f"DynamicSamplingAccumulator: on_exhausted must be one of {ON_EXHAUSTED_CHOICES}, got {on_exhausted!r}"
            )
        self.target_num_groups = target_num_groups
        self.max_num_gen_batches = max_num_gen_batches
        self.on_exhausted: OnExhausted = on_exhausted
        self.carry_over_surplus = carry_over_surplus
        self._groups: list[GroupT] = []
        self._num_carried_in = 0
        self._reset_round_counts()

    def _reset_round_counts(self) -> None:
        self._num_gen_batches = 0
        self._num_groups_generated = 0
        self._num_groups_kept = 0
        self._num_all_correct = 0
        self._num_all_wrong = 0
        self._wasted_tokens = 0

    @property
    def num_groups(self) -> int:
        """Groups held now (carried-in plus kept this step)."""
        return len(self._groups)

    @property
    def is_full(self) -> bool:
        """At least ``target_num_groups`` groups are held."""
        return len(self._groups) >= self.target_num_groups

    def rounds_exhausted(self) -> bool:
        """The round budget of this step is spent (never, when ``max_num_gen_batches <= 0``)."""
        return 0 < self.max_num_gen_batches <= self._num_gen_batches

    def should_generate_more(self) -> bool:
        """True while the batch is not full and the round budget allows another generation round."""
        return not self.is_full and not self.rounds_exhausted()

    def add_round(
        self,
        groups_kept: Sequence[GroupT],
        *,
        num_groups_generated: int,
        num_all_correct: int,
        num_all_wrong: int,
        wasted_tokens: int = 0,
    ) -> None:
        """Record one generation round: the groups kept, and counts of what was generated (see ``GroupStats``).

        With filtering on, ``len(groups_kept) + num_all_correct + num_all_wrong == num_groups_generated``; with it off
        (every group kept) the all-correct / all-wrong groups are among the kept ones. Either way neither
        ``len(groups_kept)`` nor ``num_all_correct + num_all_wrong`` can exceed ``num_groups_generated``.
        """
        if not self.should_generate_more():
            raise RuntimeError(
                "DynamicSamplingAccumulator.add_round: no more rounds are accepted this step "
                f"(full={self.is_full}, rounds used={self._num_gen_batches}, max_num_gen_batches="
                f"{self.max_num_gen_batches}); call pop_batch()"
            )
        counts = {
            "num_groups_generated": num_groups_generated,
            "num_all_correct": num_all_correct,
            "num_all_wrong": num_all_wrong,
            "wasted_tokens": wasted_tokens,
        }
        negative = {name: value for name, value in counts.items() if value < 0}
        if negative:
            raise ValueError(f"DynamicSamplingAccumulator.add_round: counts must be >= 0, got {negative}")
        if len(groups_kept) > num_groups_generated or num_all_correct + num_all_wrong > num_groups_generated:
            raise ValueError(
                "DynamicSamplingAccumulator.add_round: more groups kept or uniform than generated: "
                f"len(groups_kept)={len(groups_kept)}, num_all_correct={num_all_correct}, "
                f"num_all_wrong={num_all_wrong}, num_groups_generated={num_groups_generated}"
            )
        self._groups.extend(groups_kept)
        self._num_gen_batches += 1
        self._num_groups_generated += num_groups_generated
        self._num_groups_kept += len(groups_kept)
        self._num_all_correct += num_all_correct
        self._num_all_wrong += num_all_wrong
        self._wasted_tokens += wasted_tokens

    def _report(self, num_returned: int, num_surplus: int, partial: bool) -> AccumulatorReport:
        generated = self._num_groups_generated
        return AccumulatorReport(
            num_gen_batches=self._num_gen_batches,
            num_groups_generated=generated,
            num_groups_kept=self._num_groups_kept,
            kept_group_ratio=self._num_groups_kept / generated if generated else 0.0,
            wasted_tokens=self._wasted_tokens,
            num_all_correct=self._num_all_correct,
            num_all_wrong=self._num_all_wrong,
            partial=partial,
            num_groups_returned=num_returned,
            num_groups_carried_in=self._num_carried_in,
            num_groups_surplus=num_surplus,
        )

    def _exhausted_message(self, report: AccumulatorReport) -> str:
        advice = []
        if report.num_all_correct >= report.num_all_wrong:
            advice.append("most groups were all-correct: the data is too easy for the model, use harder prompts")
        if report.num_all_wrong >= report.num_all_correct:
            advice.append("most groups were all-wrong: the data is too hard, use easier prompts or a stronger model")
        advice.append("raise max_num_gen_batches (<= 0 means unlimited) or the responses per prompt")
        advice.append("or set on_exhausted='train_on_partial' to train on the groups found")
        return (
            f"Dynamic sampling exhausted: after {report.num_gen_batches} generation round(s) "
            f"(max_num_gen_batches={self.max_num_gen_batches}) it generated {report.num_groups_generated} groups: "
            f"{report.num_all_correct} all-correct, {report.num_all_wrong} all-wrong, "
            f"{report.num_groups_kept} kept (plus {report.num_groups_carried_in} carried in), so it holds "
            f"{len(self._groups)} of the {self.target_num_groups} informative groups needed. Likely fixes: "
            + "; ".join(advice)
            + "."
        )

    def pop_batch(self) -> tuple[list[GroupT], AccumulatorReport]:
        """Hand out this step's batch and start the next step.

        Returns exactly ``target_num_groups`` groups (the first ones held, whole groups) when full. When the round
        budget is spent first: raises ``DynamicSamplingExhausted`` (``on_exhausted="error"``, nothing is reset), or
        returns every group held, possibly none, with ``report.partial=True`` (``"train_on_partial"``).
        Calling it while more rounds are still allowed and the batch is not full is an error (``RuntimeError``).
        """
        if self.is_full:
            batch = self._groups[: self.target_num_groups]
            surplus = self._groups[self.target_num_groups :]
            report = self._report(num_returned=len(batch), num_surplus=len(surplus), partial=False)
        elif self.rounds_exhausted():
            if self.on_exhausted == "error":
                report = self._report(num_returned=0, num_surplus=0, partial=True)
                raise DynamicSamplingExhausted(self._exhausted_message(report), report)
            batch, surplus = list(self._groups), []
            report = self._report(num_returned=len(batch), num_surplus=0, partial=True)
        else:
            raise RuntimeError(
                f"DynamicSamplingAccumulator.pop_batch: batch holds {len(self._groups)} of {self.target_num_groups} "
                f"groups and {self._num_gen_batches} round(s) were used of max_num_gen_batches="
                f"{self.max_num_gen_batches}; generate more rounds while should_generate_more() is True"
            )
        self._groups = list(surplus) if self.carry_over_surplus else []
        self._num_carried_in = len(self._groups)
        self._reset_round_counts()
        return batch, report

    def state_dict(self, to_state: Callable[[GroupT], Any] | None = None) -> dict[str, Any]:
        """Everything needed to resume: the groups held (the carried surplus between steps) and this step's counts.

        Groups are stored as they are, or as ``to_state(group)`` when given (e.g. to make them serialisable).
        """
        return {
            "groups": [to_state(g) if to_state else g for g in self._groups],
            "num_carried_in": self._num_carried_in,
            "num_gen_batches": self._num_gen_batches,
            "num_groups_generated": self._num_groups_generated,
            "num_groups_kept": self._num_groups_kept,
            "num_all_correct": self._num_all_correct,
            "num_all_wrong": self._num_all_wrong,
            "wasted_tokens": self._wasted_tokens,
        }

    def load_state_dict(self, state: dict[str, Any], from_state: Callable[[Any], GroupT] | None = None) -> None:
        """Restore what ``state_dict`` saved (``from_state`` inverts its ``to_state``); bad keys are a ``KeyError``."""
        expected = set(self.state_dict())
        missing, unexpected = expected - set(state), set(state) - expected
        if missing or unexpected:
            raise KeyError(
                f"DynamicSamplingAccumulator.load_state_dict: missing keys {sorted(missing)}, "
                f"unexpected keys {sorted(unexpected)}"
            )
        self._groups = [from_state(g) if from_state else g for g in state["groups"]]
        self._num_carried_in = int(state["num_carried_in"])
        self._num_gen_batches = int(state["num_gen_batches"])
        self._num_groups_generated = int(state["num_groups_generated"])
        self._num_groups_kept = int(state["num_groups_kept"])
        self._num_all_correct = int(state["num_all_correct"])
        self._num_all_wrong = int(state["num_all_wrong"])
        self._wasted_tokens = int(state["wasted_tokens"])
