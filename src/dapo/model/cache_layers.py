"""What a Transformers KV cache holds per layer, for every layer kind dapo meets, so that the rollout engine and the
actor can copy a prompt's cache to its samples whatever the model family.

A cache layer is one of two kinds:

* an attention layer (``CacheLayerMixin``: full, sliding window, MLA): ``keys``/``values`` along positions. For MLA
  (DeepSeek-V3) these are the compressed latents the attention expands after reading the cache; they are copied the
  same way.
* a linear-attention layer (``LinearAttentionCacheLayerMixin``: Gated DeltaNet in Qwen3.5, Mamba-like layers): a
  convolution state (the last ``kernel`` inputs of its causal conv) and a recurrent state (the running
  ``[heads, k_dim, v_dim]`` matrix). They summarise the whole prefix: a sample decoding after a prompt starts from the
  prompt's two states, so fanning a prompt out to n samples repeats those states, like the keys of an attention layer.

Transformers' ``Cache.batch_select_indices`` only knows the first kind (a linear layer has no such method);
:func:`select_cache_rows` does both. Layers that hold both kinds at once (``LinearAttentionAndFullAttentionLayer``)
and other exotic layers are refused by :func:`layer_states` with a message naming the layer kind.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin, LinearAttentionLayer

__all__ = [
    "ForkedLinearLayer",
    "is_linear_layer",
    "layer_states",
    "load_linear_states",
    "select_cache_rows",
    "select_layer_rows",
]


def is_linear_layer(layer: object) -> bool:
    """A linear-attention (recurrent-state) layer only, without per-token keys and values."""
    return isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, CacheLayerMixin)


def _select_linear(layer: LinearAttentionCacheLayerMixin, indices: torch.Tensor) -> None:
    for state in range(layer.number_of_states):
        if layer.is_conv_states_initialized[state]:
            layer.conv_states[state] = layer.conv_states[state].index_select(0, indices.to(layer.device))
        if layer.is_recurrent_states_initialized[state]:
            layer.recurrent_states[state] = layer.recurrent_states[state].index_select(0, indices.to(layer.device))


def select_layer_rows(layer: object, indices: torch.Tensor) -> None:
    """Keep rows ``indices`` of one cache layer, in that order (repeats allowed: that is the fan-out of a prompt to
    its samples); an attention layer through its own ``batch_select_indices``, a linear-attention layer by indexing
    its convolution and recurrent states (a layer holding both gets both)."""
    if isinstance(layer, LinearAttentionCacheLayerMixin):
        _select_linear(layer, indices)
    if isinstance(layer, CacheLayerMixin):
        layer.batch_select_indices(indices)


def select_cache_rows(cache: Cache, indices: torch.Tensor) -> None:
    """:func:`select_layer_rows` on every layer of ``cache``."""
    for layer in cache.layers:
        select_layer_rows(layer, indices)


def layer_states(layer: object, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors that carry a prompt's layer ``index`` to what follows it: keys and values of an attention
    layer, the convolution and recurrent state of a linear-attention layer (one state pair)."""
    if is_linear_layer(layer):
        if layer.number_of_states != 1 or not (
            layer.is_conv_states_initialized[0] and layer.is_recurrent_states_initialized[0]
        ):
            raise TypeError(
                f"cache layer {index} ({type(layer).__name__}) holds {layer.number_of_states} state "
                "pairs or an incomplete one; dapo carries exactly one convolution and one recurrent state"
            )
        return layer.conv_states[0], layer.recurrent_states[0]
    if isinstance(layer, CacheLayerMixin) and not isinstance(layer, LinearAttentionCacheLayerMixin):
        return layer.keys, layer.values
    raise TypeError(
        f"cache layer {index} is a {type(layer).__name__}, which mixes linear-attention states with keys "
        "and values; dapo's shared-prompt passes do not carry that layer kind (use actor.layout=padded)"
    )


class ForkedLinearLayer(LinearAttentionLayer):
    """A linear-attention cache layer that starts from given states and never writes into them.

    Transformers' layer copies every new state into its buffers in place (a static address for CUDA graphs). Under
    autograd that breaks backward: the gated delta rule saved the initial state for its gradient, and the copy
    overwrites it. Here each update rebinds the state instead, so the prompt's states keep their history and the
    gradient of a sample's loss flows back into the prompt pass that made them.
    """

    def __init__(self, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        super().__init__(number_of_states=1)
        self.record_past = True  # the model's single-token path updates the conv state in place; this opts out
        self.dtype, self.device = conv_state.dtype, conv_state.device
        self.conv_states[0], self.recurrent_states[0] = conv_state, recurrent_state
        self.conv_kernel_size[0] = conv_state.shape[-1]
        self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
        self.has_previous_state[0] = True

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: object) -> torch.Tensor:
        full = torch.cat([self.conv_states[state_idx], conv_states], dim=-1)
        self.conv_states[state_idx] = full[..., -self.conv_kernel_size[state_idx] :]
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: object
    ) -> torch.Tensor:
        self.recurrent_states[state_idx] = recurrent_states
        return recurrent_states


def load_linear_states(cache: Cache, index: int, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
    """Make layer ``index`` of ``cache`` a :class:`ForkedLinearLayer` starting from these states."""
    cache.layers[index] = ForkedLinearLayer(conv_state, recurrent_state)
