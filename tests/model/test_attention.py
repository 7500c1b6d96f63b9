"""The grouped-query SDPA path gives Transformers' SDPA results (same numbers, no repeated KV heads), with and without
a padding mask, for one query (a decode step) and for many; the switch is scoped to its block."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from dapo.model.attention import GQA_SDPA, gqa_sdpa_attention, grouped_query_sdpa
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
