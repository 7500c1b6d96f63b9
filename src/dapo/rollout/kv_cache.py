"""The rollout engine's KV caches: a preallocated layer (no copy of the cache per step) and, for the n samples of a
prompt, a layer that keeps the prompt's keys and values once (:class:`dapo.model.attention.SharedPrefix`).

Both are Transformers ``DynamicLayer`` subclasses inside a ``DynamicCache``, so a model's own forward reads and
writes them unchanged.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from dapo.model.attention import SharedPrefix
from dapo.model.cache_layers import is_linear_layer, select_layer_rows

__all__ = ["PreallocatedLayer", "SharedPrefixLayer", "preallocated_cache", "shared_prompt_cache"]


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer that writes each step's keys and values into a buffer of ``capacity`` positions.

    ``DynamicLayer`` appends with ``torch.cat``, which copies the whole cache at every decode step (O(length^2) bytes
    over a response; 8% of SmolLM2's generation time in the profile of ``dapo.model.attention``). Here a step copies
    one position; ``keys``/``values`` are views of the filled part, so everything that reads a ``DynamicLayer``
    (sequence length, mask sizes) works unchanged. Dropping finished rows indexes the buffer (a copy, once per step
    that ends some rows). Writing past ``capacity`` grows the buffer (doubling), so a wrong guess costs time, not
    correctness.
    """

    # Keys stored position-last ([rows, kv_heads, head_dim, positions]) so that K^T, what one-query attention
    # multiplies by, is a plain slice: a batched product with a transposed K took 6x longer at decode shapes.
    keys_position_last = False

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new_keys = key_states.transpose(-1, -2) if self.keys_position_last else key_states
        key_dim = -1 if self.keys_position_last else -2
        if not self.is_initialized:
            self.dtype, self.device = key_states.dtype, key_states.device
            positions = max(self.capacity, key_states.shape[-2])
            key_shape = list(new_keys.shape)
            key_shape[key_dim] = positions
            self._key_buffer = key_states.new_empty(key_shape)
            self._value_buffer = value_states.new_empty((*value_states.shape[:2], positions, value_states.shape[-1]))
            self.is_initialized = True
        end = self.length + key_states.shape[-2]
        if end > self._value_buffer.shape[-2]:
            grown = max(end, 2 * self._value_buffer.shape[-2])
            self._key_buffer = self._grow(self._key_buffer, grown, key_dim)
            self._value_buffer = self._grow(self._value_buffer, grown, -2)
        self._key_buffer.narrow(key_dim, self.length, end - self.length).copy_(new_keys)
        self._value_buffer[:, :, self.length : end].copy_(value_states)
        self.length = end
        self._expose()
        return self.keys, self.values

    def _expose(self) -> None:
        """Point ``keys``/``values`` (``[rows, kv_heads, positions, head_dim]``, what readers expect) at the filled
        part of the buffers."""
        if self.keys_position_last:
            self.keys = self._key_buffer[..., : self.length].transpose(-1, -2)
        else:
            self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def _grow(self, buffer: torch.Tensor, positions: int, dim: int) -> torch.Tensor:
        shape = list(buffer.shape)
        shape[dim] = positions
        bigger = buffer.new_empty(shape)
        bigger.narrow(dim, 0, self.length).copy_(buffer.narrow(dim, 0, self.length))
        return bigger

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self._expose()


def preallocated_cache(config: object, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are :class:`PreallocatedLayer` of ``capacity``
    positions (sliding-window layers, which keep only their window, stay as Transformers makes them)."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class SharedPrefixLayer(PreallocatedLayer):
    """A decode-time layer: the prompts' keys and values once (``prefix``), each row's own tokens in a preallocated
    buffer (``keys``/``values``, what ``update`` returns), read together by
    :func:`dapo.model.attention.shared_prefix_attention`.

    Copying a prompt's cache to its n samples made every decode step read it n times; on SmolLM2 with ~80-token
    prompts and 64-token responses that was most of the bytes attention read. Dropping finished rows selects their own
    buffers and their places on the prefix's grid; the prompts stay.
    """

    keys_position_last = True

    def __init__(self, prefix: SharedPrefix, capacity: int) -> None:
        super().__init__(capacity)
        self.prefix = prefix

    def get_seq_length(self) -> int:
        """Positions a row attends over: the (left-padded) prompt width plus its own tokens."""
        return self.prefix.values.shape[-2] + self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self.prefix = self.prefix.select(indices)


def shared_prompt_cache(
    prefill: DynamicCache, prompt_mask: torch.Tensor, row_to_prompt: torch.Tensor, capacity: int
) -> DynamicCache | None:
    """The cache for rows decoding after the prompts of ``prefill`` (``row_to_prompt[row]``), each prompt kept once.

    ``prompt_mask`` is the prompts' padding mask (``[prompts, width]``, true at tokens); ``capacity`` the positions each
    row's own buffer starts with (it grows if exceeded). A linear-attention layer (Qwen3.5's Gated DeltaNet) has no
    keys to share: its fixed-size states are copied to every row (:func:`dapo.model.cache_layers.select_cache_rows`),
    as decoding updates them per row. None when an attention layer is not a full-attention
    :class:`PreallocatedLayer` (a sliding window keeps only its window) or no layer is one: the caller then copies the
    prompts instead.
    """
    attention = [layer for layer in prefill.layers if not is_linear_layer(layer)]
    if not attention or not all(type(layer) is PreallocatedLayer and layer.is_initialized for layer in attention):
        return None
    first = attention[0]
    placed = SharedPrefix.of_rows(first.keys, first.values, prompt_mask, row_to_prompt)  # the rows' places, once
    cache = DynamicCache()
    cache.layers = [
        layer if is_linear_layer(layer) else SharedPrefixLayer(placed.with_tensors(layer.keys, layer.values), capacity)
        for layer in prefill.layers
    ]
    for layer in cache.layers:
        if is_linear_layer(layer):
            select_layer_rows(layer, row_to_prompt)
    return cache
