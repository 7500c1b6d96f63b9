"""left_pad: the prompt block the engine prefills and the actor's shared-prompt pass recomputes, by hand."""

from __future__ import annotations

import torch

from dapo.model.left_padding import left_pad


def test_prompts_end_in_the_last_column_with_positions_from_zero() -> None:
    block = left_pad([torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])], pad_token_id=1)
    assert block.input_ids.tolist() == [[5, 6, 7], [1, 1, 8], [1, 9, 10]]
    assert block.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert block.position_ids.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    assert block.input_ids.dtype == torch.long


def test_equal_lengths_need_no_padding() -> None:
    block = left_pad([torch.tensor([3, 4]), torch.tensor([5, 6])])
    assert bool(block.attention_mask.all()) and block.position_ids.tolist() == [[0, 1], [0, 1]]
