"""Grouped-query attention through SDPA without copying the keys and values, under a padding mask too.

Transformers' ``sdpa`` attention passes ``enable_gqa=True`` to ``torch.nn.functional.scaled_dot_product_attention``
only when there is no attention mask; with one (left-padded prompts, right-padded responses) it first repeats every
key/value head ``num_attention_heads / num_key_value_heads`` times (``repeat_kv``), a copy of the whole KV cache in
every layer at every decode step. Profiled on SmolLM2-135M (9 query / 3 KV heads) generating 8 x 8 samples of 64
tokens on 2 CPU cores, those copies were 18% of the time and attention itself another 15%; torch's SDPA takes the
grouped heads with a mask as well (the same numbers, no copy; 8.3 ms -> 2.7 ms per layer and step in that shape).

:func:`grouped_query_sdpa` switches a model that runs ``sdpa`` to this implementation for the duration of a block:
the function is registered with Transformers' attention and mask interfaces under :data:`GQA_SDPA`, so the model's
own masks (``sdpa_mask``) and everything else stay as they are.

:func:`shared_prefix_attention` (registered as :data:`SHARED_PREFIX`) is the decode step for rows that share a
prompt: the n samples of a group attend to the same prompt keys and values, which are kept once per distinct prompt
(:class:`SharedPrefix`) instead of being copied to every row. The query heads of all the rows of a prompt become the
rows of one product against that prompt's keys, so the prompt part of the KV cache is read once per prompt and step
instead of n times (the idea of cascade attention in FlashInfer and vLLM). On SmolLM2-135M (8 prompts x 8 samples)
the copied prompt keys were most of what attention read at every decode step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = [
    "GQA_SDPA",
    "SHARED_PREFIX",
    "SHARED_PREFIX_CACHE",
    "SharedPrefix",
    "attention_implementation",
    "gqa_sdpa_attention",
    "grouped_query_sdpa",
    "shared_prefix_attention",
    "ungroup_expanded_heads",
]

GQA_SDPA = "dapo_gqa_sdpa"
SHARED_PREFIX = "dapo_shared_prefix"
# The keyword a model forward passes on to its attention functions: the cache whose layers hold the SharedPrefix.
SHARED_PREFIX_CACHE = "dapo_shared_prefix_cache"


def gqa_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Transformers' SDPA attention, except that grouped KV heads under a mask go to SDPA as they are.

    Without a mask, or without grouped heads, or with the extras this path does not handle (a position bias, a paged
    cache), Transformers' own function runs. With a mask, Transformers sets ``is_causal`` False anyway (the mask holds
    the causal pattern), so this call is the one it would make, minus ``repeat_kv``.
    """
    grouped = query.shape[1] != key.shape[1]
    if attention_mask is None or not grouped or kwargs.get("position_bias") is not None or kwargs.get("cache"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )  # type: ignore[arg-type]
    if query.shape[2] == 1 and attention_mask.dtype == torch.bool and not (dropout and module.training):
        return _one_query_attention(query, key, value, attention_mask, scaling), None
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=False,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _one_query_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """softmax(q K^T * scale, masked) V for one query token per row (a decode step), as two batched matmuls.

    The query heads of a KV head form the rows of one matmul against that head's keys, so nothing is repeated; at one
    query per row this is 30% faster on CPU than SDPA's flash kernel, which tiles for long queries. Returns
    ``[batch, 1, heads, value_head_dim]`` like the attention functions.
    """
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * scale  # [batch, kv_heads, group, keys]
    scores = scores.masked_fill(~mask.reshape(batch, 1, 1, -1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [batch, kv_heads, group, value dim]
    return out.reshape(batch, 1, heads, value.shape[-1])  # MLA: the value head dim differs from the query's


@dataclass(frozen=True)
class SharedPrefix:
    """The keys and values of a batch's distinct prompts, held once for all the rows that decode after them.

    Rows are placed on a grid of ``slots`` places per prompt: ``slot[row] = prompt * slots + rank`` (its rank among
    that prompt's rows). ``dense`` says that every place holds a row, in order (``slot == arange``), so moving between
    rows and the grid is a reshape; once rows have finished and left, places are empty and it is a scatter/gather.
    """

    keys_t: torch.Tensor  # [prompts, kv_heads, head_dim, prompt_positions]: K^T, contiguous (what the product reads)
    values: torch.Tensor  # [prompts, kv_heads, prompt_positions, head_dim]
    bias: torch.Tensor  # [prompts, 1, 1, prompt_positions]: 0 at a prompt's tokens, -inf in its left padding
    slot: torch.Tensor  # [rows] int64
    slots: int
    dense: bool

    @classmethod
    def of_rows(
        cls, keys: torch.Tensor, values: torch.Tensor, prompt_mask: torch.Tensor, row_to_prompt: torch.Tensor
    ) -> SharedPrefix:
        """The prefix of rows decoding after prompts ``row_to_prompt[row]``, given the prompts' keys and values and
        their padding mask (``[prompts, prompt_positions]``, true at tokens)."""
        prompts = keys.shape[0]
        counts = torch.bincount(row_to_prompt, minlength=prompts)
        order = torch.argsort(row_to_prompt, stable=True)
        first = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(row_to_prompt)
        rank[order] = torch.arange(row_to_prompt.numel(), device=row_to_prompt.device) - first[row_to_prompt[order]]
        slots = int(counts.max())
        slot = row_to_prompt * slots + rank
        bias = torch.zeros(prompt_mask.shape, dtype=keys.dtype, device=keys.device)
        bias = bias.masked_fill(~prompt_mask.bool(), float("-inf"))[:, None, None, :]
        dense = slot.numel() == prompts * slots and bool((slot == torch.arange(slot.numel(), device=slot.device)).all())
        return cls(keys.transpose(-1, -2).contiguous(), values, bias, slot, slots, dense)

    def with_tensors(self, keys: torch.Tensor, values: torch.Tensor) -> SharedPrefix:
        """The same rows' places over another layer's prompt keys and values (``[prompts, kv_heads, positions, dim]``)."""
        return SharedPrefix(keys.transpose(-1, -2).contiguous(), values, self.bias, self.slot, self.slots, self.dense)

    def select(self, indices: torch.Tensor) -> SharedPrefix:
        """The prefix of the rows ``indices`` (the others have finished): same prompts, fewer rows."""
        return SharedPrefix(self.keys_t, self.values, self.bias, self.slot[indices], self.slots, dense=False)

    def to_grid(self, per_row: torch.Tensor) -> torch.Tensor:
        """``[rows, kv_heads, group, F]`` -> ``[prompts, kv_heads, slots * group, F]`` (empty places are zero)."""
        prompts = self.keys_t.shape[0]
        _, kv_heads, group, features = per_row.shape
        if self.dense:
            grid = per_row
        else:
            grid = per_row.new_zeros((prompts * self.slots, kv_heads, group, features))
            grid[self.slot] = per_row
        return (
            grid.view(prompts, self.slots, kv_heads, group, features)
            .transpose(1, 2)
            .reshape(prompts, kv_heads, self.slots * group, features)
        )

    def to_rows(self, per_prompt: torch.Tensor, group: int) -> torch.Tensor:
        """The inverse of :meth:`to_grid`: ``[prompts, kv_heads, slots * group, F]`` -> ``[rows, kv_heads, group, F]``."""
        prompts, kv_heads, _, features = per_prompt.shape
        grid = (
            per_prompt.view(prompts, kv_heads, self.slots, group, features)
            .transpose(1, 2)
            .reshape(prompts * self.slots, kv_heads, group, features)
        )
        return grid if self.dense else grid[self.slot]


def shared_prefix_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """One decode step of rows that share prompts: softmax over [prompt keys, own keys] of q k^T * scale, times V.

    ``key``/``value`` are the row's own tokens (its response so far, this step's included, none of them padding); the
    prompt part comes from the :class:`SharedPrefix` of this layer of the cache passed as ``SHARED_PREFIX_CACHE``.
    Both parts enter one softmax (the scores are concatenated), so this is the same attention as over the row's
    whole sequence, with the prompt's left padding masked by the prefix's bias. Returns ``[rows, 1, heads, value dim]``
    (MLA's value heads are narrower than its query and key heads).
    """
    cache = kwargs.get(SHARED_PREFIX_CACHE)
    if cache is None or query.shape[2] != 1:
        raise ValueError(
            "shared_prefix_attention runs one-query decode steps of a cache with shared prefixes; got "
            f"{query.shape[2]} queries and cache {type(cache).__name__}"
        )
    layer = cache.layers[module.layer_idx]  # type: ignore[attr-defined]
    expand = getattr(module, "expand_kv", None)
    if expand is not None and not getattr(layer, "prefix_expanded", False):
        # MLA (DeepSeek-V3): the cache holds the compressed latents, which the module expands to per-head keys and
        # values after reading it. The prompt part is expanded once per call, here, where the module is at hand.
        latent_keys, latent_values = layer.prefix.keys_t.transpose(-1, -2), layer.prefix.values
        layer.prefix = layer.prefix.with_tensors(*expand(latent_keys, latent_values))
        layer.prefix_expanded = True
    prefix: SharedPrefix = layer.prefix
    rows, heads, _, dim = query.shape
    kv_heads, prompt_positions = prefix.keys_t.shape[1], prefix.keys_t.shape[3]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    grouped = (query * scale).reshape(rows, kv_heads, group, dim)  # a KV head's query heads are the rows of a product
    prompt_scores = torch.matmul(prefix.to_grid(grouped), prefix.keys_t) + prefix.bias
    scores = torch.cat([prefix.to_rows(prompt_scores, group), torch.matmul(grouped, key.transpose(-1, -2))], dim=-1)
    probs = torch.softmax(scores, dim=-1)  # [rows, kv_heads, group, prompt positions + own positions]
    prompt_probs, own_probs = probs.split([prompt_positions, key.shape[-2]], dim=-1)
    out = prefix.to_rows(torch.matmul(prefix.to_grid(prompt_probs), prefix.values), group)
    out = out + torch.matmul(own_probs, value)  # [rows, kv_heads, group, value dim]
    return out.reshape(rows, 1, heads, value.shape[-1]), None


def ungroup_expanded_heads(model: nn.Module) -> int:
    """Make the attention modules that expand their keys and values to every query head (MLA, DeepSeek-V3's
    ``expand_kv``) say so: ``num_key_value_groups = 1``. Returns how many were changed.

    Such a module computes one key and one value head per query head whatever ``num_key_value_heads`` says, but
    Transformers sets ``num_key_value_groups = num_attention_heads / num_key_value_heads`` on it, and its SDPA and eager
    functions then repeat those keys that many times again: a config with fewer KV heads than query heads fails in
    Transformers' own forward ("The size of tensor a (8) must match the size of tensor b (16) at non-singleton
    dimension 1"). The weights do not depend on ``num_key_value_heads`` (``kv_b_proj`` has a block per query head), so
    this is the model those weights define.
    """
    changed = 0
    for module in model.modules():
        if callable(getattr(module, "expand_kv", None)) and getattr(module, "num_key_value_groups", 1) != 1:
            module.num_key_value_groups = 1
            changed += 1
    return changed


def _no_mask(*args: object, **kwargs: object) -> None:
    """The mask of :data:`SHARED_PREFIX`: none; the prompt padding is the prefix's bias, and a row's own tokens are all
    visible to its one query."""
    return None


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)
AttentionInterface.register(SHARED_PREFIX, shared_prefix_attention)
AttentionMaskInterface.register(SHARED_PREFIX, _no_mask)


@contextmanager
def attention_implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Inside the block the model runs attention implementation ``name``; the previous one is restored on the way out,
    whatever happens inside. (The implementation is read from the config at every forward.)"""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


@contextmanager
def grouped_query_sdpa(model: nn.Module) -> Iterator[None]:
    """Inside the block, a model whose attention is ``sdpa`` runs :func:`gqa_sdpa_attention`; others are untouched.

    The implementation is read from the config at every forward, so switching it is two attribute writes; the previous
    value is restored on the way out, whatever happens inside.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    with attention_implementation(model, GQA_SDPA):
        yield
