"""The resumable, seeded prompt sampler that feeds generation rounds."""

from __future__ import annotations

import random
from typing import Sequence

from dapo.data.prompts import PromptItem


class PromptSampler:
    """Draws prompts in epochs; each epoch's order is a seeded permutation, so the position is the whole state."""

    def __init__(self, items: Sequence[PromptItem], *, seed: int, shuffle: bool = True) -> None:
        if not items:
            raise ValueError("no prompts to train on (all were dropped or the data set is empty)")
        self._items = list(items)
        self._seed = seed
        self._shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._items)))
        if self._shuffle:
            random.Random(f"{self._seed}:{epoch}").shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self._items)

    def next_batch(self, size: int) -> list[PromptItem]:
        """The next `size` prompts, wrapping into a new epoch (and a new permutation) when one ends."""
        batch: list[PromptItem] = []
        while len(batch) < size:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            take = min(size - len(batch), len(self._order) - self.position)
            batch.extend(self._items[i] for i in self._order[self.position : self.position + take])
            self.position += take
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._epoch_order(self.epoch)
