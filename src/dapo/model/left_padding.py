"""Prompts of different lengths as one left-padded block: every row ends with its prompt's last token, so the last
column's hidden state predicts each prompt's first response token, and keys/values continue at the same column.

Used by the rollout engine's prefill and by the actor's shared-prompt pass, which must lay prompts out identically
(the actor recomputes what the engine sampled from)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class LeftPadded(NamedTuple):
    input_ids: Tensor  # [B, W], pad_token_id on the left of shorter prompts
    attention_mask: Tensor  # [B, W], 1 on prompt tokens
    position_ids: Tensor  # [B, W], 0 at each prompt's first token (padding at 0 too, never attended to)


def left_pad(prompts: Sequence[Tensor], pad_token_id: int = 0, device: torch.device | str = "cpu") -> LeftPadded:
    """``prompts`` (1-D token tensors) left-padded to the longest, with the mask and the position ids."""
    width = max(int(p.numel()) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        length = int(prompt.numel())
        input_ids[row, width - length :] = prompt.to(device)
        attention_mask[row, width - length :] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return LeftPadded(input_ids, attention_mask, position_ids)
