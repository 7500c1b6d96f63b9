"""Dynamic Sampling's state (DAPO Section 3.2, Algorithm 1 lines 3-9): the informative groups collected across
generation rounds until a training batch is full, and the decision to stop.

The pure Eq. 11 decision is ``dapo.core.dynamic_sampling.filter_informative_groups``; this buffer only holds what it
kept, counts, and hands out batches. Its ``state_dict`` is part of every checkpoint (the surplus carried between steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from dapo.config import DapoConfig

GroupT = TypeVar("GroupT")
OnExhausted = Literal["error", "train_on_partial"]
ON_EXHAUSTED_CHOICES: tuple[OnExhausted, ...] = ("error", "train_on_partial")


@dataclass(frozen=True)
class AccumulatorReport:
    """What one training step's dynamic sampling did; counts cover this step's generation rounds only.

    Attributes:
        num_gen_batches: generation rounds used this step.
        num_groups_generated: prompt groups generated in those rounds.
        num_groups_kept: groups kept among them (the informative ones, when filtering is on).
        kept_group_ratio: ``num_groups_kept / num_groups_generated`` (0 when nothing was generated).
        wasted_tokens: response tokens that carry no gradient: those of the groups the filter dropped (as reported by
            the caller to ``add_round``) plus ``discarded_tokens``.
        num_all_correct: generated groups whose answers were all right.
        num_all_wrong: generated groups whose answers were all wrong.
        partial: True when the batch has fewer groups than asked (``on_exhausted="train_on_partial"``).
        num_groups_returned: groups in the returned batch.
        num_groups_carried_in: groups carried over from the previous step (counted in no other field here).
        num_groups_surplus: kept groups beyond the target, carried to the next step or discarded.
        num_groups_discarded: surplus groups discarded (0 with ``carry_over_surplus``).
        discarded_tokens: response tokens of the discarded surplus groups (counted by ``pop_batch``'s ``tokens_of``).
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
    num_groups_discarded: int = 0
    discarded_tokens: int = 0


class DynamicSamplingExhausted(RuntimeError):
    """Generation rounds ran out before enough informative groups were found; ``report`` holds the counts."""

    def __init__(self, message: str, report: AccumulatorReport) -> None:
        super().__init__(message)
        self.report = report


class DynamicSamplingBuffer(Generic[GroupT]):
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
    the previous policy, i.e. slightly off-policy. Otherwise they are discarded, and their tokens count as wasted.
    Carrying works the same with the skip-solved-prompts record (``dapo.data.prompt_sampler``): the record is written
    when a group is generated and scored, so a carried group is recorded once, in the epoch it was drawn in.
    """

    def __init__(
        self,
        target_num_groups: int,
        max_num_gen_batches: int,
        on_exhausted: OnExhausted = "error",
        carry_over_surplus: bool = False,
    ) -> None:
        if target_num_groups <= 0:
            raise ValueError(f"DynamicSamplingBuffer: target_num_groups must be > 0, got {target_num_groups}")
        if on_exhausted not in ON_EXHAUSTED_CHOICES:
            raise ValueError(
                f"DynamicSamplingBuffer: on_exhausted must be one of {ON_EXHAUSTED_CHOICES}, got {on_exhausted!r}"
            )
        self.target_num_groups = target_num_groups
        self.max_num_gen_batches = max_num_gen_batches
        self.on_exhausted: OnExhausted = on_exhausted
        self.carry_over_surplus = carry_over_surplus
        self._groups: list[GroupT] = []
        self._num_carried_in = 0
        self._reset_round_counts()

    @classmethod
    def from_config(cls, cfg: "DapoConfig") -> "DynamicSamplingBuffer[Any]":
        """The buffer ``algorithm.filter_groups`` describes; with filtering off, one round per step and every group."""
        fg = cfg.algorithm.filter_groups
        on = cfg.filters_groups
        return cls(
            target_num_groups=cfg.data.train_batch_size,
            max_num_gen_batches=fg.max_num_gen_batches if on else 1,
            on_exhausted=fg.on_exhausted if on else "train_on_partial",
            carry_over_surplus=fg.carry_over_surplus,
        )

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

    def drop_held(
        self, is_stale: Callable[[GroupT], bool], tokens_of: Callable[[GroupT], int] | None = None
    ) -> list[GroupT]:
        """Before this step's rounds: remove the held (carried-in) groups ``is_stale`` names, and return them. An
        asynchronous run trains a carried group one batch later than it was generated for, which can put its weights
        past the staleness bound; the rounds that follow refill the batch. Their tokens (``tokens_of``) count as
        wasted."""
        flags = [is_stale(g) for g in self._groups]
        stale = [g for g, s in zip(self._groups, flags) if s]
        self._num_carried_in -= sum(flags[: self._num_carried_in])
        self._groups = [g for g, s in zip(self._groups, flags) if not s]
        self._wasted_tokens += sum(map(tokens_of, stale)) if tokens_of else 0
        return stale

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
                "DynamicSamplingBuffer.add_round: no more rounds are accepted this step "
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
            raise ValueError(f"DynamicSamplingBuffer.add_round: counts must be >= 0, got {negative}")
        if len(groups_kept) > num_groups_generated or num_all_correct + num_all_wrong > num_groups_generated:
            raise ValueError(
                "DynamicSamplingBuffer.add_round: more groups kept or uniform than generated: "
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

    def _report(
        self, num_returned: int, num_surplus: int, partial: bool, num_discarded: int = 0, discarded_tokens: int = 0
    ) -> AccumulatorReport:
        generated = self._num_groups_generated
        return AccumulatorReport(
            num_gen_batches=self._num_gen_batches,
            num_groups_generated=generated,
            num_groups_kept=self._num_groups_kept,
            kept_group_ratio=self._num_groups_kept / generated if generated else 0.0,
            wasted_tokens=self._wasted_tokens + discarded_tokens,
            num_all_correct=self._num_all_correct,
            num_all_wrong=self._num_all_wrong,
            partial=partial,
            num_groups_returned=num_returned,
            num_groups_carried_in=self._num_carried_in,
            num_groups_surplus=num_surplus,
            num_groups_discarded=num_discarded,
            discarded_tokens=discarded_tokens,
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

    def pop_batch(self, tokens_of: Callable[[GroupT], int] | None = None) -> tuple[list[GroupT], AccumulatorReport]:
        """Hand out this step's batch and start the next step.

        ``tokens_of(group)`` (optional) counts a group's response tokens, so that discarded surplus groups (without
        ``carry_over_surplus``) are reported in ``discarded_tokens`` and ``wasted_tokens``.

        Returns exactly ``target_num_groups`` groups (the first ones held, whole groups) when full. When the round
        budget is spent first: raises ``DynamicSamplingExhausted`` (``on_exhausted="error"``, nothing is reset), or
        returns every group held, possibly none, with ``report.partial=True`` (``"train_on_partial"``).
        Calling it while more rounds are still allowed and the batch is not full is an error (``RuntimeError``).
        """
        if self.is_full:
            batch = self._groups[: self.target_num_groups]
            surplus = self._groups[self.target_num_groups :]
            discarded = [] if self.carry_over_surplus else surplus
            report = self._report(
                num_returned=len(batch),
                num_surplus=len(surplus),
                partial=False,
                num_discarded=len(discarded),
                discarded_tokens=sum(map(tokens_of, discarded)) if tokens_of else 0,
            )
        elif self.rounds_exhausted():
            if self.on_exhausted == "error":
                report = self._report(num_returned=0, num_surplus=0, partial=True)
                raise DynamicSamplingExhausted(self._exhausted_message(report), report)
            batch, surplus = list(self._groups), []
            report = self._report(num_returned=len(batch), num_surplus=0, partial=True)
        else:
            raise RuntimeError(
                f"DynamicSamplingBuffer.pop_batch: batch holds {len(self._groups)} of {self.target_num_groups} "
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
                f"DynamicSamplingBuffer.load_state_dict: missing keys {sorted(missing)}, "
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
