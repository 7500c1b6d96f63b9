"""Tokenised prompts and the resumable, seeded prompt sampler that feeds generation rounds."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from dapo.data.schema import DapoRecord


class PromptTooLongError(ValueError):
    """A prompt is longer than data.max_prompt_length and the config says to stop."""


@dataclass(frozen=True)
class PromptItem:
    """One prompt ready for the rollout engine, with what the reward needs."""

    uid: int  # position in the loaded data set: stable across resumes
    input_ids: tuple[int, ...]
    ground_truth: str
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class EncodedPrompts:
    items: list[PromptItem]
    num_dropped_too_long: int
    longest_dropped: int


def encode_prompts(
    records: Sequence[DapoRecord], tokenizer, *, max_prompt_length: int, too_long: str = "drop", where: str = "data"
) -> EncodedPrompts:
    """Apply the chat template and tokenise; prompts over max_prompt_length are dropped (counted) or an error."""
    items: list[PromptItem] = []
    dropped, longest = 0, 0
    for index, record in enumerate(records):
        ids = tokenizer.apply_chat_template(record.messages(), add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "input_ids"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        ids = [int(t) for t in ids]
        if len(ids) > max_prompt_length:
            if too_long == "error":
                raise PromptTooLongError(
                    f"{where}: row {index} has a prompt of {len(ids)} tokens > data.max_prompt_length="
                    f"{max_prompt_length} (set data.filter_overlong_prompts=drop to skip such prompts)"
                )
            dropped += 1
            longest = max(longest, len(ids))
            continue
        items.append(PromptItem(index, tuple(ids), record.ground_truth, record.data_source, dict(record.extra_info)))
    return EncodedPrompts(items, dropped, longest)


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
