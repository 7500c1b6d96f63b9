"""The grouped-query SDPA path gives Transformers' SDPA results (same numbers, no repeated KV heads), with and without
a padding mask, for one query (a decode step) and for many; the switch is scoped to its block."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from dapo.model.attention import (
    GQA_SDPA,
    SHARED_PREFIX_CACHE,
    SharedPrefix,
    gqa_sdpa_attention,
    grouped_query_sdpa,
    shared_prefix_attention,
)
from dapo.model.loading import EMBEDDED_MODEL_DIR


class _Attention(nn.Module):
    """What Transformers' attention functions read from the calling module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("queries", [1, 5])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_heads_give_transformers_sdpa_numbers(queries: int, masked: bool) -> None:
    g = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, keys, dim = 3, 6, 2, 7, 16
    query = torch.randn(batch, heads, queries, dim, generator=g)
    key = torch.randn(batch, kv_heads, keys, dim, generator=g)
    value = torch.randn(batch, kv_heads, keys, dim, generator=g)
    mask = None
    if masked:  # row 1 is left-padded by 3 positions; causal for the last `queries` positions
        mask = torch.ones(batch, 1, queries, keys, dtype=torch.bool).tril(diagonal=keys - queries)
        mask[1, :, :, :3] = False
    module = _Attention(heads // kv_heads)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, weights = gqa_sdpa_attention(module, query, key, value, mask, scaling=0.3)
    assert weights is None and got.shape == want.shape == (batch, queries, heads, dim)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def test_a_model_generates_the_same_logits_inside_the_switch_and_the_switch_is_scoped() -> None:
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, dtype=torch.float32, attn_implementation="sdpa")
    assert model.config.num_attention_heads != model.config.num_key_value_heads  # grouped heads: the case at stake
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        with grouped_query_sdpa(model):
            assert model.config._attn_implementation == GQA_SDPA
            got = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)

    with pytest.raises(RuntimeError, match="inside"), grouped_query_sdpa(model):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"  # restored on the way out of a failing block too

    eager = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, dtype=torch.float32, attn_implementation="eager")
    with grouped_query_sdpa(eager):
        assert eager.config._attn_implementation == "eager"  # only sdpa models are switched


class _Layer:
    def __init__(self, prefix: SharedPrefix) -> None:
        self.prefix = prefix


class _Cache:
    def __init__(self, prefix: SharedPrefix) -> None:
        self.layers = [_Layer(prefix)]


@pytest.mark.parametrize("drop", [None, [0, 2, 3, 6]], ids=["every-row", "after-drops"])
def test_shared_prefix_attention_is_attention_over_each_rows_whole_sequence(drop: list[int] | None) -> None:
    # 3 prompts (widths 5, left-padded by 0 / 2 / 4) with 3, 1 and 3 rows: uneven groups, so the slot grid has holes
    g = torch.Generator().manual_seed(1)
    prompts, kv_heads, heads, width, own, dim = 3, 2, 6, 5, 4, 8
    row_to_prompt = torch.tensor([0, 0, 0, 1, 2, 2, 2])
    prompt_keys = torch.randn(prompts, kv_heads, width, dim, generator=g)
    prompt_values = torch.randn(prompts, kv_heads, width, dim, generator=g)
    prompt_mask = torch.ones(prompts, width, dtype=torch.bool)
    prompt_mask[1, :2] = prompt_mask[2, :4] = False
    prefix = SharedPrefix.of_rows(prompt_keys, prompt_values, prompt_mask, row_to_prompt)
    assert prefix.slots == 3 and not prefix.dense
    rows = torch.arange(7) if drop is None else torch.tensor(drop)
    if drop is not None:
        prefix = prefix.select(rows)
    query = torch.randn(len(rows), heads, 1, dim, generator=g)
    own_keys = torch.randn(len(rows), kv_heads, own, dim, generator=g)
    own_values = torch.randn(len(rows), kv_heads, own, dim, generator=g)
    module = _Attention(heads // kv_heads)
    module.layer_idx = 0
    got, _ = shared_prefix_attention(
        module, query, own_keys, own_values, None, scaling=0.4, **{SHARED_PREFIX_CACHE: _Cache(prefix)}
    )
    # the reference: each row's prompt copied in front of its own keys, the prompt padding masked
    of_row = row_to_prompt[rows]
    keys = torch.cat([prompt_keys[of_row], own_keys], dim=2)
    values = torch.cat([prompt_values[of_row], own_values], dim=2)
    mask = torch.cat([prompt_mask[of_row], torch.ones(len(rows), own, dtype=torch.bool)], dim=1)[:, None, None, :]
    want, _ = sdpa_attention_forward(module, query, keys, values, mask, scaling=0.4)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def test_a_dense_prefix_needs_no_scatter_and_gives_the_same_numbers() -> None:
    g = torch.Generator().manual_seed(2)
    keys, values = torch.randn(2, 1, 3, 4, generator=g), torch.randn(2, 1, 3, 4, generator=g)
    prefix = SharedPrefix.of_rows(keys, values, torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 0, 1, 1]))
    assert prefix.dense and prefix.slots == 2
    per_row = torch.randn(4, 1, 2, 5, generator=g)
    assert torch.equal(prefix.to_rows(prefix.to_grid(per_row), group=2), per_row)
    holes = prefix.select(torch.tensor([3, 0]))
    assert torch.equal(holes.to_rows(holes.to_grid(per_row[[3, 0]]), group=2), per_row[[3, 0]])
