"""Batch-invariant forward passes: the same token, at the same position after the same tokens, gets bitwise the same
logits whether it is decoded one step at a time over a KV cache or scored in a teacher-forced pass, alone or among
any number of other sequences, in any layout (``actor_rollout_ref.rollout.true_on_policy``).

Why the default forward is not: a token's logits come out of kernels whose reduction order depends on the shape of
the call (a matrix product blocks its rows differently for 1, 7 or 2,400 rows; on this CPU fp32 ``F.linear`` rows
differ between call sizes below 12 rows), attention over a cache reduces over a different number of keys than
attention over the whole sequence, and an elementwise kernel computes the last ``numel mod (2 x vector width)``
elements of a tensor with scalar code, whose ``exp``/``sin`` may round differently from the vector code. Which of a
token's numbers fall where depends on the other tokens of the call, so the engine's sampling log-probs and the actor's
differ by ~4e-7 (docs/results.md) and every "on-policy" step is slightly off-policy.

What this module does instead, inside :func:`batch_invariant`, for every operation on the path:

* **Matrix products with a weight** (every ``nn.Linear``: projections, MLP, LM head, LoRA's A and B) run on tiles of
  exactly :data:`TILE_ROWS` rows, the last one zero-padded: every call of the kernel has one shape, and at a fixed
  shape a row's result does not depend on the other rows (checked for fp32 and bf16 by
  ``tests/model/test_batch_invariant.py``).
* **The MLP's activation** (SiLU) runs tile by tile as well, so it always sees a ``[TILE_ROWS, intermediate]`` tensor:
  with ``TILE_ROWS * intermediate`` a multiple of 64 every element goes through the same vector code.
* **Rotary embeddings** are read from one table computed once for positions ``0 .. max_length - 1`` (a gather is a
  copy, so both passes get the same ``cos``/``sin`` whatever the number of positions of the call).
* **Attention** (:func:`batch_invariant_attention`) keeps every sequence's keys and values in a buffer of
  ``max_length`` places indexed by position (:class:`PositionKV`): a query at position ``t`` takes one product with
  all ``max_length`` keys, places after ``t`` masked to ``-inf`` (their probabilities are exact zeros, and a zero
  times a finite value adds nothing), one softmax over ``max_length`` scores and one product with the values. The
  query rows of a sequence go in tiles of :data:`TILE_QUERIES`, so a decode step's one query and a teacher-forced
  pass's thousands run the same products of one shape against the same buffer. Left or right padding, packed rows
  and prompts shared between samples only change which buffer place a token is written to, never the arithmetic.
* **Norms, residuals, the temperature**: elementwise arithmetic that IEEE rounds exactly (add, multiply, divide,
  square root) and reductions over a row's last dimension, whose order depends on that dimension only.
* **Log-probs** (:func:`token_log_probs`): ``log_softmax`` over the vocabulary (a per-row kernel) and a gather, for
  the engine and the actor alike (``logsumexp`` would take ``exp`` over the whole ``[rows, vocab]`` tensor at once).

The price is the padding of small calls to a tile (a decode step of 3 rows computes 16) and a Python loop over
tiles; docs/performance.md has the measured step time. Families: decoders made of RMSNorm, rotary full attention
(grouped or not) and a gated MLP (Llama, Qwen2, Qwen3); :func:`unsupported_reason` names what stops the others.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from dapo.model.attention import attention_implementation

__all__ = [
    "BATCH_INVARIANT",
    "POSITION_KV",
    "TILE_QUERIES",
    "TILE_ROWS",
    "Invariance",
    "PositionKV",
    "batch_invariant",
    "batch_invariant_attention",
    "forward_at",
    "gathered_log_probs",
    "invariance_of",
    "tiled_linear",
    "token_log_probs",
    "unsupported_reason",
]

BATCH_INVARIANT = "dapo_batch_invariant"
# The keyword a forward passes on to its attention functions: the PositionKV of this call.
POSITION_KV = "dapo_position_kv"
# Rows of every weight product. 16: the smallest tile at which this CPU's fp32 GEMM takes its large-M path (rows of
# 1-11 take another); a decode step of fewer rows pays for 16.
TILE_ROWS = 16
# Query rows (query heads of a KV head x positions) of every attention product.
TILE_QUERIES = 8
# Tiles of one attention product call: bounds the gathered keys (tiles x kv heads x head dim x max_length).
_TILES_PER_CALL = 64
_SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot run batch-invariant, or None when it can."""
    config = getattr(model, "config", None)
    if config is None:
        return f"{type(model).__name__} has no config"
    kind = getattr(config, "model_type", "?")
    if kind not in _SUPPORTED_TYPES:
        return (
            f"model type {kind!r} is not one of {_SUPPORTED_TYPES}: its forward has pieces this mode does not make "
            "batch-invariant (mixture-of-experts routing sends a varying number of rows to each expert, linear "
            "attention scans its state in chunks, MLA and attention sinks take other attention paths)"
        )
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention is not part of the batch-invariant attention"
    rope = getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return f"rope type {rope.get('rope_type', rope.get('type'))!r} changes with the sequence length"
    intermediate = int(getattr(config, "intermediate_size", 0))
    if (TILE_ROWS * intermediate) % 64:
        return f"intermediate_size {intermediate} x {TILE_ROWS} rows is not a multiple of 64 (the activation's tail)"
    return None


def tiled_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` computed on tiles of exactly :data:`TILE_ROWS` rows (the last zero-padded): every row's result is
    the one a single tile gives it, whatever the number of rows of the call. The gradient is the ordinary one, in one
    product per operand (it is not part of the equality, and per-tile weight gradients made an actor pass with
    backward 2.5x slower: 12.3 s against 5.0 s on 64 samples of the tiny model)."""
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return _TiledLinear.apply(x, weight, bias)
    return _tiles(_LINEAR, x, weight, bias)


def _tiles(fn: object, x: Tensor, *args: object) -> Tensor:
    """``fn(rows, *args)`` on tiles of exactly :data:`TILE_ROWS` rows of ``x`` (zero-padded), put back together."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    padded = math.ceil(count / TILE_ROWS) * TILE_ROWS
    if padded != count:
        rows = torch.cat([rows, rows.new_zeros(padded - count, rows.shape[-1])])
    out = torch.cat([fn(tile, *args) for tile in rows.split(TILE_ROWS)])  # type: ignore[operator]
    return out[:count].reshape(*x.shape[:-1], out.shape[-1])


class _TiledLinear(torch.autograd.Function):
    """Forward: :func:`_tiles` of ``F.linear``; backward: the gradients of ``x @ W^T + b`` over all rows at once, in
    the precision autocast gave the forward (the output's dtype)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        with torch.no_grad():
            return _tiles(_LINEAR, x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        grad_x = (flat @ weight.to(grad.dtype)).to(x.dtype).reshape(x.shape) if ctx.needs_input_grad[0] else None
        grad_w = (
            (flat.t() @ x.reshape(-1, x.shape[-1]).to(grad.dtype)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        )
        grad_b = flat.sum(0).to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


_LINEAR = F.linear


def token_log_probs(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / temperature)[token] per row, in fp32; temperature 0 (greedy) reads temperature 1."""
    scaled = logits.float()
    if temperature not in (0.0, 1.0):
        scaled = scaled / temperature
    return gathered_log_probs(scaled, tokens)


def gathered_log_probs(scaled_logits: Tensor, targets: Tensor) -> Tensor:
    """log_softmax(scaled_logits)[target]: ``targets`` ``[N]`` (one id per row) or ``[N, k]`` (k ids per row), out
    in the same shape. ``log_softmax`` is a per-row kernel; ``logsumexp`` would take ``exp`` of the whole
    ``[rows, vocab]`` tensor at once, whose scalar tail falls on other elements for another number of rows."""
    picked = targets if targets.dim() == 2 else targets.unsqueeze(-1)
    log_probs = torch.log_softmax(scaled_logits, dim=-1).gather(-1, picked)
    return log_probs if targets.dim() == 2 else log_probs.squeeze(-1)


@dataclass
class PositionKV:
    """Every sequence's keys and values, per layer, at buffer place = position; and where this call's tokens go.

    ``rows[b, t]`` is the buffer row (the sequence) of token ``t`` of input row ``b``, ``positions[b, t]`` its
    position, ``valid[b, t]`` whether it is a token at all (padding is neither written nor attended to). Buffers are
    ``[sequences, max_length, kv_heads, head_dim]`` and start at zero. ``in_place``: writes go into the buffers (a
    decode loop, no autograd); otherwise each write makes a new buffer, so that gradients flow to the keys.
    """

    sequences: int
    max_length: int
    rows: Tensor
    positions: Tensor
    valid: Tensor
    in_place: bool = False
    keys: dict[int, Tensor] = field(default_factory=dict)
    values: dict[int, Tensor] = field(default_factory=dict)

    def at(self, rows: Tensor, positions: Tensor, valid: Tensor | None = None) -> PositionKV:
        """The same buffers, for a call whose tokens are at ``rows``/``positions``."""
        if int(positions.max()) >= self.max_length:
            raise ValueError(
                f"position {int(positions.max())} is past the batch-invariant max_length {self.max_length}"
            )
        self.rows, self.positions = rows, positions
        self.valid = torch.ones_like(positions, dtype=torch.bool) if valid is None else valid.bool()
        return self

    def select(self, index: Tensor) -> None:
        """Keep the buffer rows ``index``, in that order (a prompt's buffers copied to each of its samples)."""
        for store in (self.keys, self.values):
            for layer, buffer in store.items():
                store[layer] = buffer.index_select(0, index)
        self.sequences = int(index.numel())

    def write(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Put this call's ``[batch, kv_heads, tokens, dim]`` keys and values at their places; returns the layer's
        buffers."""
        valid = self.valid
        rows, positions = self.rows[valid], self.positions[valid]
        new_keys, new_values = key.transpose(1, 2)[valid], value.transpose(1, 2)[valid]  # [valid tokens, heads, dim]
        out = []
        for store, new in ((self.keys, new_keys), (self.values, new_values)):
            buffer = store.get(layer)
            if buffer is None or buffer.dtype != new.dtype:
                buffer = new.new_zeros(self.sequences, self.max_length, *new.shape[1:])
            if self.in_place:
                buffer[rows, positions] = new
            else:
                buffer = buffer.index_put((rows, positions), new)
            store[layer] = buffer
            out.append(buffer)
        return out[0], out[1]


def batch_invariant_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """softmax(q K^T * scale, keys after q's position masked) V with every product of one shape (module docstring).

    ``query`` ``[batch, heads, tokens, dim]``; ``key``/``value`` this call's tokens only (no cache: the
    :class:`PositionKV` passed as ``POSITION_KV`` holds the sequences). Returns ``[batch, tokens, heads, dim]``.
    """
    kv = kwargs.get(POSITION_KV)
    if kv is None:  # a plain forward (the weight-sync probe): each row one sequence from position 0, right-padded
        kv = _plain_rows(query.shape[0], query.shape[2], query.device)
    if not isinstance(kv, PositionKV):
        raise ValueError(f"batch_invariant_attention: {POSITION_KV} must be a PositionKV, got {type(kv).__name__}")
    if dropout and module.training:
        raise ValueError("batch-invariant attention does not take attention dropout (set it to 0)")
    keys, values = kv.write(module.layer_idx, key, value)  # type: ignore[arg-type]
    batch, heads, tokens, dim = query.shape
    kv_heads = keys.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    # query rows of a KV head: (token, query head of the group), for the valid tokens of every input row
    valid = kv.valid
    rows, positions = kv.rows[valid], kv.positions[valid]  # [N]
    grouped = query.view(batch, kv_heads, group, tokens, dim).permute(0, 3, 1, 2, 4)[valid]  # [N, kv_heads, group, d]
    # Tiles: consecutive valid tokens of one sequence; a new tile starts at a new sequence or every TILE_QUERIES
    # query rows. A tile slot holds (token, group member); empty slots read position 0 (finite) and are dropped.
    per_tile = max(TILE_QUERIES // group, 1)  # tokens per tile (1 when a group alone fills one or more)
    tiles_of_group = math.ceil(group / TILE_QUERIES)
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[1:] = rows[1:] != rows[:-1]
    seq_id = torch.cumsum(starts.long(), 0) - 1
    first = torch.nonzero(starts).squeeze(-1)
    rank = torch.arange(rows.numel(), device=rows.device) - first[seq_id]
    tile_in_seq = rank // per_tile
    seq_tiles = (torch.bincount(seq_id) + per_tile - 1) // per_tile  # tiles of each run of one sequence
    tile_base = torch.cumsum(seq_tiles, 0) - seq_tiles
    tile = tile_base[seq_id] + tile_in_seq  # [N]
    slot = rank % per_tile
    num_tiles = int(seq_tiles.sum())
    # [tiles, kv_heads, TILE_QUERIES, d] queries (slot = token slot x group), their positions, the tile's sequence
    slot_rows = (slot * group)[:, None] + torch.arange(group, device=rows.device)  # [N, group]
    q_tiles = _scatter_queries(
        query.new_zeros(num_tiles, kv_heads, tiles_of_group * TILE_QUERIES, dim), tile, slot_rows, grouped * scale
    )
    index = slot_rows.reshape(-1)
    q_positions = positions.new_zeros(num_tiles, tiles_of_group * TILE_QUERIES)
    q_positions[tile.repeat_interleave(group), index] = positions.repeat_interleave(group)
    tile_rows = rows.new_zeros(num_tiles)
    tile_rows[tile] = rows
    places = torch.arange(kv.max_length, device=rows.device)
    outs = []
    for start in range(0, num_tiles, _TILES_PER_CALL):
        part = slice(start, start + _TILES_PER_CALL)
        seq = tile_rows[part]
        k_t = keys.index_select(0, seq).permute(0, 2, 3, 1).contiguous()  # [tiles, kv_heads, d, max_length]
        v = values.index_select(0, seq).permute(0, 2, 1, 3).contiguous()  # [tiles, kv_heads, max_length, d]
        out = []
        for piece in range(tiles_of_group):
            cols = slice(piece * TILE_QUERIES, (piece + 1) * TILE_QUERIES)
            scores = torch.matmul(q_tiles[part, :, cols].contiguous(), k_t)  # [tiles, kv_heads, TILE_QUERIES, L]
            future = places > q_positions[part, cols, None]  # [tiles, TILE_QUERIES, L]
            scores = scores.masked_fill(future[:, None], float("-inf"))
            out.append(torch.matmul(torch.softmax(scores, dim=-1), v))
        outs.append(torch.cat(out, dim=2))
    tiled = torch.cat(outs)  # [tiles, kv_heads, slots, d]
    picked = tiled[tile[:, None], :, slot_rows]  # [N, group, kv_heads, d]
    result = picked.new_zeros(batch, tokens, heads, dim)
    result[valid] = picked.permute(0, 2, 1, 3).reshape(-1, heads, dim)
    return result, None


def _plain_rows(batch: int, tokens: int, device: torch.device) -> PositionKV:
    """The PositionKV of a forward over whole sequences, one per row, at positions 0 .. tokens - 1 (right padding is
    never attended to by an earlier token, so it changes nothing; left padding would)."""
    positions = torch.arange(tokens, device=device).expand(batch, tokens)
    rows = torch.arange(batch, device=device)[:, None].expand(batch, tokens)
    return PositionKV(batch, tokens, rows, positions, torch.ones_like(positions, dtype=torch.bool))


def _scatter_queries(q_tiles: Tensor, tile: Tensor, slot_rows: Tensor, grouped: Tensor) -> Tensor:
    """Place ``grouped`` ``[N, kv_heads, group, d]`` at ``q_tiles[tile[n], :, slot_rows[n, g]]`` (out of place, so
    that gradients reach the queries)."""
    n, kv_heads, group, dim = grouped.shape
    values = grouped.permute(0, 2, 1, 3).reshape(n * group, kv_heads, dim)
    flat = q_tiles.permute(0, 2, 1, 3)  # [tiles, slots, kv_heads, d]
    flat = flat.index_put((tile.repeat_interleave(group), slot_rows.reshape(-1)), values)
    return flat.permute(0, 2, 1, 3)


def _no_mask(*args: object, **kwargs: object) -> None:
    """The mask of :data:`BATCH_INVARIANT`: none; positions and validity come with the PositionKV."""
    return None


AttentionInterface.register(BATCH_INVARIANT, batch_invariant_attention)
AttentionMaskInterface.register(BATCH_INVARIANT, _no_mask)


def _rotary_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


def _mlp_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "down_proj") and isinstance(getattr(m, "act_fn", None), nn.Module)]


@dataclass(frozen=True)
class Invariance:
    """What a model in batch-invariant mode computes with: the buffer length (every position a sequence can reach:
    prompt + response) and the autocast dtype of every forward (None: as the weights are), the actor's precision,
    which the engine adopts so that both compute the same numbers."""

    max_length: int
    autocast_dtype: torch.dtype | None = None

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)


_MARK = "_dapo_invariance"


def invariance_of(model: nn.Module) -> Invariance | None:
    """The :class:`Invariance` ``model`` runs under (inside :func:`batch_invariant`), or None."""
    return getattr(_config_holder(model), _MARK, None)


@contextmanager
def batch_invariant(model: nn.Module, invariance: Invariance) -> Iterator[None]:
    """Inside the block ``model`` computes batch-invariantly (module docstring): the engine decodes and the actor
    scores through :class:`PositionKV` (:func:`invariance_of` tells them).

    Everything is put back on the way out: the attention implementation, the rotary forward, the MLP activations and
    ``F.linear``. ``F.linear`` is replaced in the process while the block runs (``nn.Linear`` and PEFT's LoRA layers
    read it at call time): the engine and the actor of one process run in this mode together or not at all."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"true_on_policy: {type(model).__name__} cannot run batch-invariant: {reason}")
    global _LINEAR
    holder = _config_holder(model)
    with ExitStack() as stack:
        stack.enter_context(attention_implementation(holder, BATCH_INVARIANT))
        setattr(holder, _MARK, invariance)
        stack.callback(delattr, holder, _MARK)
        max_length = invariance.max_length
        for rotary in _rotary_modules(model):
            stack.enter_context(_rotary_table(rotary, max_length))
        for mlp in _mlp_modules(model):
            stack.enter_context(_tiled_activation(mlp))
        if F.linear is not tiled_linear:
            _LINEAR = F.linear
            F.linear = tiled_linear  # type: ignore[assignment]
            stack.callback(_restore_linear)
        yield


def _restore_linear() -> None:
    F.linear = _LINEAR  # type: ignore[assignment]


def _config_holder(model: nn.Module) -> nn.Module:
    """The module whose ``config`` the forward reads its attention implementation from (the Hugging Face model inside
    the FSDP2 wrapper, a PEFT model's base)."""
    model = getattr(model, "hf_model", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def forward_at(model: nn.Module, kv: PositionKV, input_ids: Tensor, position_ids: Tensor, **kwargs: object) -> object:
    """``model``'s forward over ``input_ids`` at ``position_ids``, attending through ``kv`` (no cache, no mask)."""
    return model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **{POSITION_KV: kv}, **kwargs)


@contextmanager
def _rotary_table(rotary: nn.Module, max_length: int) -> Iterator[None]:
    original = rotary.forward
    probe = next(rotary.buffers(), torch.zeros(0))
    positions = torch.arange(max_length, device=probe.device)[None]
    cos, sin = original(torch.zeros(1, dtype=torch.float32, device=probe.device), positions)
    table_cos, table_sin = cos[0], sin[0]  # [max_length, dim], fp32

    def forward(x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        return table_cos[position_ids].to(x.dtype), table_sin[position_ids].to(x.dtype)

    rotary.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del rotary.forward


class _TiledActivation(nn.Module):
    """An MLP's activation applied to tiles of :data:`TILE_ROWS` rows: every element goes through the same vector
    code whatever the number of rows (module docstring)."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        return _tiles(self.activation, x)


@contextmanager
def _tiled_activation(mlp: nn.Module) -> Iterator[None]:
    original = mlp.act_fn
    mlp.act_fn = _TiledActivation(original)
    try:
        yield
    finally:
        mlp.act_fn = original
