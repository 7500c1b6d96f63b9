"""The resumable, seeded prompt sampler that feeds generation rounds, and its optional per-prompt pass-rate record.

Without the record the position is the whole state. With it (``algorithm.filter_groups.skip_solved_prompts``) the
sampler also remembers, for every training prompt (identified by its index in the sampler's items, stable across
resumes), the fraction of its G samples that were correct each time it was sampled, and skips prompts that every
sample solved in each of the last ``k`` epochs they were seen: such a prompt would most likely give an all-correct
group again, which Dynamic Sampling (DAPO, arXiv 2503.14476, Eq. 11) drops after its tokens were generated.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from dapo.core.dynamic_sampling import solved_in_recent_epochs
from dapo.data.prompts import PromptItem

if TYPE_CHECKING:
    from dapo.config import DapoConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Draw:
    """One sampled prompt: its index in the sampler's items (the record's key), the epoch it was drawn in, the item."""

    index: int
    epoch: int
    item: PromptItem


class PassRateRecord:
    """Per prompt index, the ``(epoch, pass_rate)`` of every time it was sampled and scored, in recording order."""

    def __init__(self, num_prompts: int) -> None:
        self._history: list[list[tuple[int, float]]] = [[] for _ in range(num_prompts)]

    def __len__(self) -> int:
        return len(self._history)

    def add(self, index: int, epoch: int, pass_rate: float) -> None:
        if not 0.0 <= pass_rate <= 1.0:
            raise ValueError(f"PassRateRecord.add: pass_rate must be in [0, 1], got {pass_rate}")
        self._history[index].append((int(epoch), float(pass_rate)))

    def history(self, index: int) -> list[tuple[int, float]]:
        return list(self._history[index])

    def state_dict(self) -> list[list[list[int | float]]]:
        """JSON-exact: one list of ``[epoch, pass_rate]`` pairs per prompt index."""
        return [[[e, r] for e, r in h] for h in self._history]

    def load_state_dict(self, state: list[list[list[int | float]]]) -> None:
        if len(state) != len(self._history):
            raise ValueError(
                f"PassRateRecord: the checkpoint records {len(state)} prompts, this run has {len(self._history)}"
            )
        self._history = [[(int(e), float(r)) for e, r in h] for h in state]


class PromptSampler:
    """Draws prompts in epochs; each epoch's order is a seeded permutation.

    ``skip_solved_epochs=k`` (None = off) keeps a ``PassRateRecord`` (fed by ``record_pass_rates``) and skips, when
    its turn in an epoch comes, every prompt solved by all samples in each of its last ``k`` epochs; each skip is
    counted in ``num_skipped_solved``. Fallback: an epoch that starts with fewer unsolved prompts than the batch being
    drawn skips nothing (every prompt is sampled again, which also re-tests prompts the policy may have unlearned), so
    the sampler always fills a batch and never loops over epochs that yield nothing.
    """

    def __init__(
        self, items: Sequence[PromptItem], *, seed: int, shuffle: bool = True, skip_solved_epochs: int | None = None
    ) -> None:
        if not items:
            raise ValueError("no prompts to train on (all were dropped or the data set is empty)")
        if skip_solved_epochs is not None and skip_solved_epochs < 1:
            raise ValueError(f"PromptSampler: skip_solved_epochs must be >= 1 or None, got {skip_solved_epochs}")
        self._items = list(items)
        self._seed = seed
        self._shuffle = shuffle
        self._skip_epochs = skip_solved_epochs
        self.record = PassRateRecord(len(self._items)) if skip_solved_epochs is not None else None
        self.num_skipped_solved = 0
        self._fallback = False  # this epoch skips nothing (decided when it started; saved, since the record moves on)
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    @classmethod
    def from_config(cls, items: Sequence[PromptItem], cfg: "DapoConfig") -> "PromptSampler":
        """The sampler ``data`` and ``algorithm.filter_groups.skip_solved_prompts`` describe."""
        skip = cfg.algorithm.filter_groups.skip_solved_prompts
        return cls(
            items, seed=cfg.data.seed, shuffle=cfg.data.shuffle, skip_solved_epochs=skip.epochs if skip.enable else None
        )

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._items)))
        if self._shuffle:
            random.Random(f"{self._seed}:{epoch}").shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self._items)

    def is_solved(self, index: int) -> bool:
        """The prompt at ``index`` is one to skip now (always False without the record)."""
        return self.record is not None and solved_in_recent_epochs(self.record.history(index), self._skip_epochs)

    def _start_epoch(self, epoch: int, batch_size: int) -> None:
        self.epoch = epoch
        self.position = 0
        self._order = self._epoch_order(epoch)
        self._fallback = False
        if self.record is not None:
            unsolved = sum(not self.is_solved(i) for i in self._order)
            self._fallback = unsolved < batch_size
            if self._fallback:
                log.info(
                    "epoch %d: only %d of %d prompts are not solved, fewer than a batch of %d: this epoch "
                    "samples every prompt",
                    epoch,
                    unsolved,
                    len(self._order),
                    batch_size,
                )

    def next_draws(self, size: int) -> list[Draw]:
        """The next ``size`` prompts with their index and epoch, wrapping into a new epoch when one ends."""
        draws: list[Draw] = []
        while len(draws) < size:
            if self.position >= len(self._order):
                self._start_epoch(self.epoch + 1, size)
            index = self._order[self.position]
            self.position += 1
            if not self._fallback and self.is_solved(index):
                self.num_skipped_solved += 1
                continue
            draws.append(Draw(index, self.epoch, self._items[index]))
        return draws

    def next_batch(self, size: int) -> list[PromptItem]:
        """The next `size` prompts, wrapping into a new epoch (and a new permutation) when one ends."""
        return [d.item for d in self.next_draws(size)]

    def record_pass_rates(self, draws: Sequence[Draw], pass_rates: Sequence[float]) -> None:
        """Record each drawn prompt's pass rate (fraction of its samples correct); a no-op without the record."""
        if len(draws) != len(pass_rates):
            raise ValueError(f"PromptSampler.record_pass_rates: {len(draws)} draws but {len(pass_rates)} pass rates")
        if self.record is not None:
            for d, rate in zip(draws, pass_rates):
                self.record.add(d.index, d.epoch, rate)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position}
        if self.record is not None:
            state.update(
                fallback=self._fallback, num_skipped_solved=self.num_skipped_solved, pass_rates=self.record.state_dict()
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``. A state without a record (the record was off) starts an empty one; a record in the
        state is ignored when this sampler keeps none."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._epoch_order(self.epoch)
        if self.record is not None:
            self.record = PassRateRecord(len(self._items))
            if "pass_rates" in state:
                self.record.load_state_dict(state["pass_rates"])
            self._fallback = bool(state.get("fallback", False))
            self.num_skipped_solved = int(state.get("num_skipped_solved", 0))
