"""Tokenised prompts: the chat template applied, over-long prompts dropped or refused."""

from __future__ import annotations

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
                # The row in its own file: in a data set of several files the index alone points at the wrong one.
                raise PromptTooLongError(
                    f"{where}: {record.origin or f'row {index}'} has a prompt of {len(ids)} tokens > "
                    f"data.max_prompt_length="
                    f"{max_prompt_length} (set data.filter_overlong_prompts=drop to skip such prompts)"
                )
            dropped += 1
            longest = max(longest, len(ids))
            continue
        items.append(PromptItem(index, tuple(ids), record.ground_truth, record.data_source, dict(record.extra_info)))
    return EncodedPrompts(items, dropped, longest)
