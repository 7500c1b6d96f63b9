"""Per-token log-probabilities (and entropies) of the response tokens of a micro-batch, from one forward pass.

Two layouts of a micro-batch's samples (``actor.layout``), equal in value and in gradient:

* packed: the prompt+response tokens of every sample are concatenated into ONE row, with ``position_ids`` restarting
  at 0 at each sample and no attention mask. Transformers (>= 4.56; verified for 5.x sdpa and eager by
  ``tests/actor/test_log_probs.py``) detects the restarts; flash-attention's variable-length kernels derive the
  segments from ``position_ids`` and spend nothing on padding. Without them (CPU, sdpa, eager) the same restarts
  become a dense block-diagonal mask over the whole row, so attention costs (row length)^2: profiled on the tiny
  model's default job, attention was 42% of the update's time (docs/performance.md).
* padded: one right-padded row per sample with an attention mask; attention costs sum(width^2) per micro-batch and
  the padding is kept small by cutting length-sorted micro-batches (``dapo.actor.micro_batching``).

``auto`` picks packed exactly when the model runs a flash-attention implementation, padded otherwise.

Memory: the decoder returns the final hidden states ``[total_tokens, H]``; only the rows that predict a response token
are kept, and the LM head + log-softmax run on ``chunk_size`` rows at a time, so the ``[tokens, vocab]`` logits are
never materialised for the whole micro-batch. When gradients are needed each chunk runs under
``torch.utils.checkpoint`` (non-reentrant): forward keeps only the chunk's outputs, backward recomputes that one
chunk's logits, so the logits memory of backward is also bounded by one chunk (at the cost of one extra LM-head
matmul per chunk).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from dapo.actor.batch import TrainBatch
from dapo.actor.micro_batching import plan_micro_batches, response_chunks, warn_oversized
from dapo.actor.precision import autocast_context
from dapo.core.kl import entropy_from_logits
from dapo.distributed.data_parallel import is_sharded
from dapo.model.batch_invariant import PositionKV, forward_at, gathered_log_probs, invariance_of
from dapo.model.cache_layers import is_linear_layer, layer_states, load_linear_states
from dapo.model.left_padding import left_pad
from dapo.model.loading import unsupported_logits
from dapo.model.router_aux_loss import aux_loss_of
from dapo.model.router_replay import ROUTE_DTYPE, RouterTape, tape_of

if TYPE_CHECKING:
    from dapo.config import ActorConfig

__all__ = [
    "LAYOUTS",
    "SequenceRows",
    "compute_log_probs_batch",
    "compute_top_log_probs_batch",
    "compute_response_log_probs",
    "decoder_and_lm_head",
    "pack_sequences",
    "pad_sequences",
    "resolve_layout",
    "share_prompt_sequences",
    "uses_activation_checkpointing",
]

LAYOUTS: tuple[str, ...] = ("packed", "padded", "shared_prompt")

# Config attributes of model families whose logits are NOT simply lm_head(hidden): computing lm_head ourselves would
# silently give wrong log-probs for them, so they are refused.
# Families whose decoder builds its attention mask without the position ids, so that outside flash-attention's varlen
# kernels (which read the restarts from the position ids themselves) packed samples attend to each other. Measured
# by tests/model/test_family_matrix.py: GPT-OSS packed log-probs were off by up to 4.6 nats.
_UNPACKED_MASKS = {
    "gpt_oss": "GPT-OSS's forward builds its attention mask without the position ids, so outside "
    "flash-attention kernels the packed samples would attend to each other"
}
_LOGIT_TRANSFORM_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


@dataclass(frozen=True)
class SequenceRows:
    """The model inputs of a micro-batch in one layout, and where its response tokens are predicted.

    Attributes:
        input_ids: ``[rows, width]``; packed: one row prompt_0 + response_0 + prompt_1 + ...; padded: one
            right-padded row per sample.
        position_ids: ``[rows, width]``, restarting at 0 at every sample.
        attention_mask: ``[rows, width]`` (1 = real token) for the padded layout, None when packed.
        predictor_index: ``[N]`` flat positions (into ``rows * width``) whose hidden state predicts a response token
            (N = all response tokens, sample after sample).
        targets: ``[N]`` the response tokens, in order.
        response_lengths: tokens per response, to split the ``[N]`` results back per sample.
    """

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor | None
    predictor_index: Tensor
    targets: Tensor
    response_lengths: list[int]


def uses_activation_checkpointing(model: nn.Module) -> bool:
    """Whether Hugging Face gradient (activation) checkpointing is on, under either transformers name."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def resolve_layout(requested: str, model: nn.Module) -> str:
    """``actor.layout`` made concrete for ``model``.

    ``auto``: packed where flash-attention's varlen kernels run or the model computes batch-invariantly
    (``rollout.true_on_policy``); otherwise shared_prompt, unless the model is sharded
    (FSDP2 runs each layer's all-gather/reduce-scatter once per forward, and shared_prompt forwards twice), runs
    Hugging Face's activation checkpointing (its checkpointed layers drop the KV cache that carries the prompt to the
    responses; :func:`dapo.actor.update.configure_model_for_training` leaves it off for this layout, which checkpoints
    its own passes), has sliding-window layers or adds the router's auxiliary loss: padded then. A model with linear-attention
    layers is never packed (their state does not restart at a sample boundary). An explicit layout that cannot run is refused, naming why.
    """
    if requested not in (*LAYOUTS, "auto"):
        raise ValueError(f"actor.layout must be 'auto', 'packed', 'padded' or 'shared_prompt', got {requested!r}")
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "hf_model"):  # the FSDP2 wrapper
        config = getattr(model.hf_model, "config", None)
    implementation = str(getattr(config, "_attn_implementation", "") or "")
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
    obstacle = (
        "the actor is sharded (FSDP2)"
        if is_sharded(model)
        else "activation checkpointing is on"
        if uses_activation_checkpointing(model)
        # the router's aux loss is over one forward's tokens (dapo.model.router_aux_loss)
        else "the router's auxiliary loss is on (actor.router_aux_loss_coef)"
        if aux_loss_of(model) is not None
        # a sliding-window layer's cache keeps only the window, not every prompt token
        else "the model has sliding-window attention layers"
        if sliding
        else None
    )
    if requested == "shared_prompt" and obstacle is not None:
        raise ValueError(f"actor.layout=shared_prompt cannot run here: {obstacle}; use auto, padded or packed")
    # A linear-attention layer (Gated DeltaNet) sees no position ids: its recurrent state would run from one packed
    # sample into the next, so every packed sample after the first would be conditioned on the ones before it.
    linear = "linear_attention" in (getattr(config, "layer_types", None) or ())
    if requested == "packed" and linear:
        raise ValueError(
            "actor.layout=packed cannot run here: the model has linear-attention layers, whose recurrent "
            "state would carry from one packed sample into the next; use auto, padded or shared_prompt"
        )
    model_type = str(getattr(config, "model_type", "") or "")
    if requested == "packed" and model_type in _UNPACKED_MASKS and not implementation.startswith("flash_attention"):
        raise ValueError(
            f"actor.layout=packed cannot run here: {_UNPACKED_MASKS[model_type]}; use auto, padded or shared_prompt"
        )
    if requested != "auto":
        return requested
    if invariance_of(model) is not None:  # its attention reads each sample's own keys: packing costs no mask
        return "packed"
    if implementation.startswith("flash_attention") and not linear:
        return "packed"
    return "padded" if obstacle is not None else "shared_prompt"


def _check_prompts(prompt_ids: Sequence[Tensor]) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("no samples in the micro-batch")
    if any(int(p.numel()) < 1 for p in prompt_ids):
        raise ValueError("every prompt needs >= 1 token (it predicts the first response token)")


def _token_numbers(micro_batch: TrainBatch) -> tuple[list[Tensor], list[Tensor], int]:
    """Every token of the micro-batch numbered 1.. (sample after sample, prompt then response; 0 is left for
    padding): each sample's prompt numbers, its response numbers, and one past the last number."""
    prompts, responses, start = [], [], 1
    for prompt, response in zip(micro_batch.prompt_ids, micro_batch.response_ids, strict=True):
        p, r = int(prompt.numel()), int(response.numel())
        prompts.append(torch.arange(start, start + p))
        responses.append(torch.arange(start + p, start + p + r))
        start += p + r
    return prompts, responses, start


def _route_table(tape: RouterTape, micro_batch: TrainBatch) -> Tensor | None:
    """The micro-batch's replayed routes indexed by token number (:func:`_token_numbers`; row 0, padding: -1, live),
    or None when it replays none."""
    if micro_batch.routed_experts is None:
        return None
    none = torch.full((1, tape.num_layers, tape.top_k), -1, dtype=ROUTE_DTYPE)
    return torch.cat([none, *(r.to(ROUTE_DTYPE) for r in micro_batch.routed_experts)])


@contextlib.contextmanager
def _routes_laid_out(
    tape: RouterTape | None, build: Callable[..., SequenceRows], micro_batch: TrainBatch, device: torch.device
) -> Iterator[None]:
    """Around the one forward of a packed or padded micro-batch under router replay: every token numbered 1..
    (sample after sample, prompt then response) and laid out by ``build`` as the tokens are, so the number at each
    place of the forward's input says whose routes go there (0: padding, routed live and never counted). The
    micro-batch's ``routed_experts`` are replayed; inside the tape's recording, the routes the forward took are left
    per sample in ``tape.samples``."""
    if tape is None:
        yield
        return
    prompts, responses, start = _token_numbers(micro_batch)
    laid = build(prompts, responses).input_ids.reshape(-1)
    table = _route_table(tape, micro_batch)
    with tape.replaying(None if table is None else table[laid].to(device), (laid > 0).to(device)):
        yield
    if tape.recording_now:
        taken = tape.take().cpu()
        flat = torch.full((start, tape.num_layers, tape.top_k), -1, dtype=ROUTE_DTYPE)
        flat[laid] = taken
        tape.samples = list(flat[1:].split(micro_batch.sequence_lengths))


class _SharedPromptRoutes:
    """Router replay over the passes of the shared-prompt layout, its tokens numbered by :func:`_token_numbers` as
    :func:`_routes_laid_out` numbers one forward's (0: padding, routed live and never counted).
    Pass 0 feeds each distinct prompt once, as its first sample's prompt (the samples of a row have equal prompt
    routes: :func:`share_prompt_sequences` keys the rows by them); each response pass feeds its samples' responses
    but their last token (which predicts nothing). Each pass replays and counts its tokens; inside the tape's
    recording, the routes it took go to its tokens, a row's prompt routes to every sample of the row, and a
    response's last token, never fed, has none (-1), as in the engine."""

    def __init__(self, tape: RouterTape, rows: SharedPromptRows, micro_batch: TrainBatch, device: torch.device) -> None:
        self.tape, self.device = tape, device
        prompts, responses, start = _token_numbers(micro_batch)
        sample_prompt = rows.sample_prompt.tolist()
        first = {row: i for i, row in reversed(list(enumerate(sample_prompt)))}  # row -> its first sample
        self.copies = [(prompts[i], prompts[first[row]]) for i, row in enumerate(sample_prompt) if first[row] != i]
        width = rows.prompt_input_ids.shape[1]
        prompt_laid = torch.zeros(rows.prompt_input_ids.shape, dtype=torch.long)
        for row, i in first.items():
            prompt_laid[row, width - prompts[i].numel() :] = prompts[i]
        self.laid = [prompt_laid.reshape(-1)]
        for chunk in rows.chunks:
            laid = torch.zeros(chunk.input_ids.shape, dtype=torch.long)
            for row, i in enumerate(chunk.samples.tolist()):
                laid[row, : responses[i].numel() - 1] = responses[i][:-1]
            self.laid.append(laid.reshape(-1))
        self.table = _route_table(tape, micro_batch)
        recorded = torch.full((start, tape.num_layers, tape.top_k), -1, dtype=ROUTE_DTYPE)
        self.taken = recorded if tape.recording_now else None
        self.lengths = micro_batch.sequence_lengths

    def routed_pass(self, index: int, fn: Callable[..., object]) -> Callable[..., object]:
        """``fn`` (pass ``index``) under its plan. A second call is the pass's recomputation in the backward
        (the layout's reentrant checkpoint): it replays the same routes and counts nothing again."""
        laid, tape, calls = self.laid[index], self.tape, []
        replay = None if self.table is None else self.table[laid].to(self.device)
        counted = (laid > 0).to(self.device)

        def run(*args: object) -> object:
            again = bool(calls)
            calls.append(index)
            with tape.replaying(replay, None if again else counted):
                out = fn(*args)
            if self.taken is not None and not again:
                self.taken[laid] = tape.take().cpu()
            return out

        return run

    def finish(self) -> None:
        """Inside the tape's recording: each sample's routes, in ``tape.samples``."""
        if self.taken is None:
            return
        for mine, shared in self.copies:
            self.taken[mine] = self.taken[shared]
        self.taken[0] = -1
        self.tape.samples = list(self.taken[1:].split(self.lengths))


def pack_sequences(
    prompt_ids: Sequence[Tensor], response_ids: Sequence[Tensor], device: torch.device | str = "cpu"
) -> SequenceRows:
    """Concatenate (prompt, response) pairs into one row.

    Response token ``j`` of a sample starting at ``start`` with a ``P``-token prompt sits at ``start + P + j`` and is
    predicted by the hidden state at ``start + P + j - 1``.
    """
    _check_prompts(prompt_ids)
    pieces: list[Tensor] = []
    positions: list[Tensor] = []
    predictors: list[Tensor] = []
    offset = 0
    for prompt, response in zip(prompt_ids, response_ids, strict=True):
        p, r = int(prompt.numel()), int(response.numel())
        pieces += [prompt, response]
        positions.append(torch.arange(p + r))
        predictors.append(torch.arange(offset + p - 1, offset + p + r - 1))
        offset += p + r
    return SequenceRows(
        input_ids=torch.cat(pieces).to(device=device, dtype=torch.long).unsqueeze(0),
        position_ids=torch.cat(positions).to(device).unsqueeze(0),
        attention_mask=None,
        predictor_index=torch.cat(predictors).to(device),
        targets=torch.cat(list(response_ids)).to(device=device, dtype=torch.long),
        response_lengths=[int(r.numel()) for r in response_ids],
    )


def pad_sequences(
    prompt_ids: Sequence[Tensor], response_ids: Sequence[Tensor], device: torch.device | str = "cpu"
) -> SequenceRows:
    """One right-padded row per (prompt, response) pair, all as wide as the longest pair.

    Response token ``j`` of row ``i`` with a ``P``-token prompt sits at column ``P + j`` and is predicted by the hidden
    state at flat position ``i * width + P + j - 1``. Padding holds token 0 under a zero attention mask: no real
    token attends to it, and what the padding positions compute is never read.
    """
    _check_prompts(prompt_ids)
    pairs = list(zip(prompt_ids, response_ids, strict=True))
    width = max(int(p.numel() + r.numel()) for p, r in pairs)
    input_ids = torch.zeros(len(pairs), width, dtype=torch.long)
    attention_mask = torch.zeros(len(pairs), width, dtype=torch.long)
    predictors: list[Tensor] = []
    for row, (prompt, response) in enumerate(pairs):
        p, r = int(prompt.numel()), int(response.numel())
        input_ids[row, : p + r] = torch.cat([prompt, response])
        attention_mask[row, : p + r] = 1
        predictors.append(torch.arange(row * width + p - 1, row * width + p + r - 1))
    return SequenceRows(
        input_ids=input_ids.to(device),
        position_ids=torch.arange(width).expand(len(pairs), width).to(device),
        attention_mask=attention_mask.to(device),
        predictor_index=torch.cat(predictors).to(device),
        targets=torch.cat(list(response_ids)).to(device=device, dtype=torch.long),
        response_lengths=[int(r.numel()) for r in response_ids],
    )


@dataclass(frozen=True)
class ResponseChunk:
    """Responses of similar length run in one pass after their prompts' KV cache (see :class:`SharedPromptRows`).

    Attributes:
        samples: ``[C]`` the micro-batch samples of the chunk's rows.
        input_ids: ``[C, V]`` each response but its last token (which predicts nothing), right-padded.
        attention_mask: ``[C, W + V]``, the row's prompt mask followed by its response mask.
        position_ids: ``[C, V]``, continuing from the prompt's length.
    """

    samples: Tensor
    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor


@dataclass(frozen=True)
class SharedPromptRows:
    """The model inputs of a micro-batch whose samples share prompts: each distinct prompt once, then the responses.

    Pass 1 runs the ``D`` distinct prompts, left-padded (so every row ends with its prompt's last token), and fills a
    KV cache. Then each response chunk (responses of similar length, :func:`response_chunks`) runs on a copy of its
    rows' prompt caches. The hidden state of a prompt's last token predicts the first response token of each of its
    samples; response token ``j`` predicts token ``j + 1``.

    Attributes:
        prompt_input_ids: ``[D, W]`` the distinct prompts, left-padded with token 0.
        prompt_attention_mask: ``[D, W]`` (1 = real token).
        prompt_position_ids: ``[D, W]``, 0 at each prompt's first real token.
        sample_prompt: ``[S]`` the distinct-prompt row of each sample.
        chunks: the response passes; samples with a one-token response are in none.
        predictor_index: ``[N]`` flat positions into ``cat(last prompt hidden [D], chunk hidden [C_k * V_k] ...)``
            whose hidden state predicts a response token, sample after sample.
        targets: ``[N]`` the response tokens, in order.
        response_lengths: tokens per response.
    """

    prompt_input_ids: Tensor
    prompt_attention_mask: Tensor
    prompt_position_ids: Tensor
    sample_prompt: Tensor
    chunks: list[ResponseChunk]
    predictor_index: Tensor
    targets: Tensor
    response_lengths: list[int]


def share_prompt_sequences(
    prompt_ids: Sequence[Tensor],
    response_ids: Sequence[Tensor],
    device: torch.device | str = "cpu",
    max_chunk_tokens: int | None = None,
    prompt_routes: Sequence[Tensor] | None = None,
) -> SharedPromptRows:
    """The shared-prompt layout of (prompt, response) pairs: samples with equal prompt tokens share one prompt row
    (and equal routes of their prompt tokens, when ``prompt_routes`` are replayed: one pass routes a row one way);
    a response chunk holds at most ``max_chunk_tokens`` (rows x width) unless one row alone is longer."""
    _check_prompts(prompt_ids)
    row_of: dict[tuple[tuple[int, ...], bytes], int] = {}
    keys = [
        (tuple(p.tolist()), b"" if prompt_routes is None else prompt_routes[i].to(ROUTE_DTYPE).numpy().tobytes())
        for i, p in enumerate(prompt_ids)
    ]
    sample_prompt = [row_of.setdefault(key, len(row_of)) for key in keys]
    distinct = [torch.as_tensor(tokens, dtype=torch.long) for tokens, _ in row_of]
    prompt_input_ids, prompt_mask, prompt_position_ids = left_pad(distinct)

    lengths = [int(r.numel()) for r in response_ids]
    # Flat position of the hidden state predicting response token j of sample i (j >= 1): its chunk's offset plus
    # its row in the chunk times the chunk's width plus j - 1. Token 0 is predicted by the prompt's last hidden state.
    offset_of: dict[int, tuple[int, int]] = {}
    chunks: list[ResponseChunk] = []
    offset = len(distinct)
    for members in response_chunks([n - 1 for n in lengths], max_chunk_tokens):
        fed = lengths[members[0]] - 1  # the longest of the chunk
        ids = torch.zeros(len(members), fed, dtype=torch.long)
        mask = torch.zeros(len(members), fed, dtype=torch.long)
        for row, i in enumerate(members):
            ids[row, : lengths[i] - 1] = response_ids[i][: lengths[i] - 1]
            mask[row, : lengths[i] - 1] = 1
            offset_of[i] = (offset + row * fed, fed)
        rows_prompt = torch.tensor([sample_prompt[i] for i in members])
        chunks.append(
            ResponseChunk(
                samples=torch.tensor(members).to(device),
                input_ids=ids.to(device),
                attention_mask=torch.cat([prompt_mask[rows_prompt], mask], dim=-1).to(device),
                position_ids=(prompt_mask.sum(dim=-1)[rows_prompt].unsqueeze(-1) + torch.arange(fed)).to(device),
            )
        )
        offset += len(members) * fed
    predictors: list[Tensor] = []
    for i, r in enumerate(lengths):
        if r > 0:
            predictors.append(torch.tensor([sample_prompt[i]]))
        if r > 1:
            start = offset_of[i][0]
            predictors.append(torch.arange(start, start + r - 1))
    return SharedPromptRows(
        prompt_input_ids=prompt_input_ids.to(device),
        prompt_attention_mask=prompt_mask.to(device),
        prompt_position_ids=prompt_position_ids.to(device),
        sample_prompt=torch.tensor(sample_prompt, dtype=torch.long).to(device),
        chunks=chunks,
        predictor_index=(torch.cat(predictors) if predictors else torch.zeros(0, dtype=torch.long)).to(device),
        targets=torch.cat(list(response_ids)).to(device=device, dtype=torch.long),
        response_lengths=lengths,
    )


def _cache_kwarg(decoder: nn.Module) -> str:
    # transformers >= 5 names the KV cache argument `cache` in some models; most call it `past_key_values`.
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def _last_hidden(out: object) -> Tensor:
    """The final hidden states of a decoder's output (a ``BaseModelOutput`` or a plain tuple)."""
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # type: ignore[index,attr-defined]


def _prompt_pass(decoder: nn.Module, cache_kwarg: str, rows: SharedPromptRows, embeds: Tensor) -> tuple[Tensor, ...]:
    """Pass 1: the last hidden state of each distinct prompt, then every layer's first and then every layer's second
    carried tensor (keys and values, or a linear-attention layer's convolution and recurrent states)."""
    cache = DynamicCache(config=getattr(decoder, "config", None))
    mask = rows.prompt_attention_mask
    hidden = _last_hidden(
        decoder(
            inputs_embeds=embeds,
            position_ids=rows.prompt_position_ids,
            attention_mask=None if bool(mask.all()) else mask,
            use_cache=True,
            **{cache_kwarg: cache},
        )
    )
    states = [layer_states(layer, index) for index, layer in enumerate(cache.layers)]
    return (hidden[:, -1], *(first for first, _ in states), *(second for _, second in states))


def _chunk_pass(
    decoder: nn.Module, cache_kwarg: str, chunk: ResponseChunk, prompt_rows: Tensor, embeds: Tensor, *prompt_kv: Tensor
) -> Tensor:
    """Pass 2 for one response chunk: ``[rows * width, H]`` hidden states, on a copy of its prompts' carried tensors
    (a linear-attention layer continues from its prompt's states; :class:`dapo.model.cache_layers.ForkedLinearLayer`)."""
    cache = DynamicCache(config=getattr(decoder, "config", None))
    num_layers = len(prompt_kv) // 2
    for index in range(num_layers):
        first = prompt_kv[index].index_select(0, prompt_rows)
        second = prompt_kv[num_layers + index].index_select(0, prompt_rows)
        if index < len(cache.layers) and is_linear_layer(cache.layers[index]):
            load_linear_states(cache, index, first, second)
        else:
            cache.update(first, second, index)
    hidden = _last_hidden(
        decoder(
            inputs_embeds=embeds,
            position_ids=chunk.position_ids,
            attention_mask=chunk.attention_mask,
            use_cache=True,
            **{cache_kwarg: cache},
        )
    )
    return hidden.reshape(-1, hidden.shape[-1])


def _shared_prompt_hidden(
    decoder: nn.Module, rows: SharedPromptRows, *, recompute: bool = False, routes: _SharedPromptRoutes | None = None
) -> Tensor:
    """``[N, H]`` hidden states predicting every response token, from the passes of :class:`SharedPromptRows`.

    Causal attention makes this exact: a prompt token's keys and values do not depend on what follows it, so each
    response sees the same keys and values it would see in its own row. The keys and values keep their autograd
    history (indexing and ``torch.cat`` are differentiable), so the gradient of every sample's loss flows back into
    the one prompt pass.

    ``recompute`` is this layout's activation checkpointing (``actor.gradient_checkpointing``): the prompt pass and
    each response chunk run under ``torch.utils.checkpoint``, keeping only their outputs (hidden states, and the
    prompts' keys and values) and recomputing one pass at a time in backward. Transformers' own per-layer
    checkpointing cannot be used here: its checkpointed layers drop the KV cache.

    ``routes`` (router replay): each pass runs under its own plan (:class:`_SharedPromptRoutes`), a recomputation
    too.

    The checkpoint is the *reentrant* one, so that each pass's backward runs by itself and adds its weight gradients
    to ``.grad`` when it is done. Every pass uses every weight; under non-reentrant checkpointing (one backward graph)
    the autograd engine sums a weight's gradients from all the passes in its input buffer and hands them to ``.grad``
    only after the last one: a second full copy of the gradients for the whole backward (0.54 GB on SmolLM2-135M,
    found with the profiler's memory timeline). The token embeddings are looked up outside the passes, which gives
    every pass an input that requires grad (what the reentrant checkpoint needs to run a backward at all).

    They are looked up once for all the passes: the embedding's backward builds a dense vocabulary x hidden gradient
    (zero-filled, then added into ``.grad``), and one lookup per pass did that once per pass, 30 times an update in
    the SmolLM2 job (49,152 x 576 floats each; docs/performance.md, the step's profile). The passes' embeddings are
    views of the one lookup, whose backward runs once, after the last pass's.
    """
    prompt_rows = [rows.sample_prompt.index_select(0, chunk.samples) for chunk in rows.chunks]
    kwarg = _cache_kwarg(decoder)  # once per micro-batch, not once per pass
    ids = [rows.prompt_input_ids, *(chunk.input_ids for chunk in rows.chunks)]
    embeds = decoder.get_input_embeddings()(torch.cat([i.reshape(-1) for i in ids]))
    if recompute and not embeds.requires_grad:  # frozen embeddings: the checkpoint still needs a grad input
        embeds = embeds.detach().requires_grad_()
    prompt_embeds, *chunk_embeds = [
        piece.view(*i.shape, -1) for piece, i in zip(embeds.split([i.numel() for i in ids]), ids, strict=True)
    ]

    def run(fn: object, *args: object) -> object:
        return checkpoint(fn, *args, use_reentrant=True) if recompute else fn(*args)  # type: ignore[operator]

    def routed(index: int, fn: Callable[..., object]) -> Callable[..., object]:
        return fn if routes is None else routes.routed_pass(index, fn)

    prompt_out = run(routed(0, _prompt_pass), decoder, kwarg, rows, prompt_embeds)
    parts = [prompt_out[0]] + [
        run(routed(1 + c, _chunk_pass), decoder, kwarg, chunk, index, chunk_embed, *prompt_out[1:])
        for c, (chunk, index, chunk_embed) in enumerate(zip(rows.chunks, prompt_rows, chunk_embeds, strict=True))
    ]
    return torch.cat(parts).index_select(0, rows.predictor_index)


def _position_kv(rows: SequenceRows, max_length: int) -> PositionKV:
    """Where each token of a packed or padded micro-batch goes in the batch-invariant buffers: sample ``i`` is
    sequence ``i`` (packed: a new sample starts where the position restarts at 0)."""
    positions = rows.position_ids
    if rows.attention_mask is None:  # packed: one row
        sequence = torch.cumsum((positions == 0).long(), dim=-1) - 1
        valid = torch.ones_like(positions, dtype=torch.bool)
    else:
        sequence = torch.arange(positions.shape[0], device=positions.device)[:, None].expand_as(positions)
        valid = rows.attention_mask.bool()
    if int(positions[valid].max()) >= max_length:
        raise ValueError(
            f"a sample of {int(positions[valid].max()) + 1} tokens is longer than the batch-invariant "
            f"buffer of {max_length} positions (data.max_prompt_length + data.max_response_length)"
        )
    return PositionKV(len(rows.response_lengths), max_length, sequence, positions, valid)


def decoder_and_lm_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The base decoder (returns hidden states) and the LM head of a Hugging Face causal LM (Qwen2, Llama, ...)."""
    name = type(model).__name__
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else getattr(model, "lm_head", None)
    if not isinstance(decoder, nn.Module) or not isinstance(head, nn.Module):
        raise TypeError(
            f"{name} is not a supported causal LM: the actor needs the decoder (model.get_decoder() or model.model) "
            "and the LM head (model.get_output_embeddings() or model.lm_head)"
        )
    problem = unsupported_logits(getattr(model, "config", None))
    if problem is not None:
        raise TypeError(f"{name} {problem}")
    return decoder, head


def _chunk_log_probs(
    lm_head: nn.Module,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    invariant: bool,
    hidden: Tensor,
    targets: Tensor,
) -> tuple[Tensor, Tensor]:
    """log softmax(lm_head(hidden) / T)[target] and, if asked, the entropy of that distribution, in fp32.

    ``targets`` ``[N]``: one token per row; ``[N, 1 + k]``: the log-probs of each of those ids (the sampled token
    and k more, e.g. a distillation teacher's top-k), ``[N, 1 + k]`` out. ``invariant`` (batch-invariant mode): the
    log-probs are :func:`dapo.model.batch_invariant.gathered_log_probs`, the engine's function.
    Without ``entropy_grad`` the entropy is a detached metric: computed under no_grad it saves nothing for backward,
    and a checkpointed chunk's recomputation stops before it (three logits-sized tensors per chunk fewer)."""
    logits = lm_head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if invariant:
        log_probs = gathered_log_probs(logits, targets)
    elif targets.dim() == 2:
        log_probs = logits.gather(-1, targets) - torch.logsumexp(logits, dim=-1, keepdim=True)
    else:
        log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if not with_entropy:
        return log_probs, logits.new_zeros(0)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return log_probs, entropy_from_logits(logits)


def compute_response_log_probs(
    model: nn.Module,
    micro_batch: TrainBatch,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    layout: str = "packed",
    checkpoint_passes: bool = False,
    max_chunk_tokens: int | None = None,
    entropy_grad: bool = True,
    gather_ids: Sequence[Tensor] | None = None,
) -> tuple[list[Tensor], list[Tensor] | None]:
    """Log-probs of every response token under ``model`` at ``temperature``, per response (and entropies if asked).

    ``layout`` is one of :data:`LAYOUTS` (see the module docstring; :func:`resolve_layout` turns ``auto`` into one).
    ``checkpoint_passes``: the shared-prompt layout recomputes its passes in backward (activation checkpointing);
    ``max_chunk_tokens`` caps its response passes, so that backward holds at most that many tokens' activations.
    ``entropy_grad`` False: the entropies are detached (a metric only, no loss term uses them).
    ``gather_ids``: per sample ``[len, k]`` more token ids per position; each sample's result is then ``[len, 1 + k]``,
    column 0 the sampled token's log-prob and the others those ids' (on-policy distillation's teacher top-k).
    Differentiable when autograd is enabled. Returns one fp32 1-D tensor per sample, as long as its response, on the
    model's device; entropies likewise or None.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size (logprob_chunk_size) must be >= 1, got {chunk_size}")
    decoder, lm_head = decoder_and_lm_head(model)
    device = lm_head.weight.device if isinstance(getattr(lm_head, "weight", None), Tensor) else torch.device("cpu")
    vocab = model.get_input_embeddings().num_embeddings if hasattr(model, "get_input_embeddings") else None
    if vocab is not None:
        largest = max(int(t.max()) for t in (*micro_batch.prompt_ids, *micro_batch.response_ids) if t.numel())
        if largest >= vocab:
            raise ValueError(f"token id {largest} in the micro-batch is outside the model's vocabulary of {vocab}")
    rows: SequenceRows | SharedPromptRows
    invariance = invariance_of(model)
    if invariance is not None:  # rollout.true_on_policy: the engine's arithmetic, token for token
        if layout == "shared_prompt":
            raise ValueError(
                "actor.layout=shared_prompt does not run batch-invariant (rollout.true_on_policy); use packed or padded"
            )
        rows = (pack_sequences if layout == "packed" else pad_sequences)(
            micro_batch.prompt_ids, micro_batch.response_ids, device
        )
        hidden = _last_hidden(
            forward_at(decoder, _position_kv(rows, invariance.max_length), rows.input_ids, rows.position_ids)
        )
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows.predictor_index)
    elif layout == "shared_prompt":
        tape = tape_of(model)
        replayed = micro_batch.routed_experts if tape is not None else None
        rows = share_prompt_sequences(
            micro_batch.prompt_ids,
            micro_batch.response_ids,
            device,
            max_chunk_tokens,
            None
            if replayed is None
            else [r[: p.numel()] for r, p in zip(replayed, micro_batch.prompt_ids, strict=True)],
        )
        routes = None if tape is None else _SharedPromptRoutes(tape, rows, micro_batch, device)
        hidden = _shared_prompt_hidden(
            decoder, rows, recompute=checkpoint_passes and torch.is_grad_enabled(), routes=routes
        )
        if routes is not None:
            routes.finish()
    else:
        build = pack_sequences if layout == "packed" else pad_sequences
        rows = build(micro_batch.prompt_ids, micro_batch.response_ids, device)
        with _routes_laid_out(tape_of(model), build, micro_batch, device):
            hidden = _last_hidden(
                decoder(
                    input_ids=rows.input_ids,
                    position_ids=rows.position_ids,
                    attention_mask=rows.attention_mask,
                    use_cache=False,
                )
            )
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows.predictor_index)

    run = functools.partial(_chunk_log_probs, lm_head, temperature, with_entropy, entropy_grad, invariance is not None)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    log_prob_chunks: list[Tensor] = []
    entropy_chunks: list[Tensor] = []
    targets = rows.targets
    if gather_ids is not None:  # rows are response tokens sample after sample, as the ids are listed
        extra = torch.cat([ids.to(device=targets.device, dtype=torch.long) for ids in gather_ids])
        if extra.shape[0] != targets.shape[0]:
            raise ValueError(f"gather_ids cover {extra.shape[0]} positions, the responses {targets.shape[0]}")
        targets = torch.cat([targets.unsqueeze(1), extra], dim=1)
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        log_probs, entropy = checkpoint(run, h, t, use_reentrant=False) if recompute else run(h, t)
        log_prob_chunks.append(log_probs)
        entropy_chunks.append(entropy)

    log_probs_flat = torch.cat(log_prob_chunks)
    per_sample = list(torch.split(log_probs_flat, rows.response_lengths))
    if not with_entropy:
        return per_sample, None
    return per_sample, list(torch.split(torch.cat(entropy_chunks), rows.response_lengths))


@torch.no_grad()
def compute_top_log_probs_batch(
    model: nn.Module, batch: TrainBatch, cfg: ActorConfig, k: int
) -> tuple[list[Tensor], list[Tensor]]:
    """The ``k`` most likely next tokens at every response position of ``batch`` and their log-probs (temperature 1),
    without gradients, micro-batched as :func:`compute_log_probs_batch`: per sample ``[len, k]`` log-probs and
    ``[len, k]`` ids, most likely first (an on-policy distillation teacher's top-k, ``forward_kl_topk``).

    The ids come from the same forward as the sampled tokens' log-probs: one pass gathers the full row of
    log-probs, which :func:`compute_response_log_probs` reduces to the top-k by asking for every vocabulary id."""
    if len(batch) == 0:
        return [], []
    decoder, lm_head = decoder_and_lm_head(model)
    vocab = lm_head.weight.shape[0]
    if not 1 <= k <= vocab:
        raise ValueError(f"top-k must be in [1, {vocab}], got {k}")
    everything = [torch.arange(vocab).expand(n, vocab) for n in batch.response_lengths]
    full = _batch_log_probs(model, batch, cfg, 1.0, with_entropy=False, gather_ids=everything)[0]
    values, ids = zip(*(lp[:, 1:].topk(k, dim=-1) for lp in full))
    return list(values), list(ids)


@torch.no_grad()
def compute_log_probs_and_entropy_batch(
    model: nn.Module, batch: TrainBatch, cfg: ActorConfig, temperature: float
) -> tuple[list[Tensor], list[Tensor]]:
    """Log-probs and per-token entropies of every response of ``batch``, without gradients.

    Micro-batches follow ``cfg`` (token budget or fixed size) and the forward runs in ``cfg.dtype`` exactly as in
    training. Returns fp32 1-D tensors per sample, in batch order, on the batch's device. The trainer uses this for
    the old log-probs (pi_theta_old) and for the generation entropy it monitors (the paper's Fig. 7c).
    """
    return _batch_log_probs(model, batch, cfg, temperature, with_entropy=True)  # type: ignore[return-value]


@torch.no_grad()
def compute_log_probs_batch(model: nn.Module, batch: TrainBatch, cfg: ActorConfig, temperature: float) -> list[Tensor]:
    """Log-probs of every response of ``batch`` (e.g. the old log-probs before an update), without gradients."""
    return _batch_log_probs(model, batch, cfg, temperature, with_entropy=False)[0]


def _batch_log_probs(
    model: nn.Module,
    batch: TrainBatch,
    cfg: ActorConfig,
    temperature: float,
    *,
    with_entropy: bool,
    gather_ids: Sequence[Tensor] | None = None,
) -> tuple[list[Tensor], list[Tensor] | None]:
    if len(batch) == 0:
        return [], ([] if with_entropy else None)
    device = next(model.parameters()).device
    layout = resolve_layout(cfg.layout, model)
    plan = plan_micro_batches(
        batch.sequence_lengths,
        use_dynamic_bsz=cfg.use_dynamic_bsz,
        max_token_len=cfg.ppo_max_token_len_per_gpu,
        micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
        layout=layout,
        prompt_lengths=batch.prompt_lengths,
        prompt_keys=batch.group_index.tolist(),
    )
    warn_oversized(plan.num_oversized, cfg.ppo_max_token_len_per_gpu, "compute_log_probs_batch")
    log_probs_out: list[Tensor | None] = [None] * len(batch)
    entropy_out: list[Tensor | None] = [None] * len(batch)
    tape = tape_of(model)
    routes_out: list[Tensor] = [torch.zeros(0)] * len(batch)  # inside a tape's recording: the routes taken (R2)
    with autocast_context(cfg.dtype, device):
        for indices in plan.micro_batches:  # ascending indices: each micro-batch keeps its groups contiguous
            log_probs, entropies = compute_response_log_probs(
                model,
                batch.select(indices),
                temperature=temperature,
                chunk_size=cfg.logprob_chunk_size,
                with_entropy=with_entropy,
                layout=layout,
                max_chunk_tokens=cfg.shared_prompt_chunk_tokens,
                **({} if gather_ids is None else {"gather_ids": [gather_ids[i] for i in indices]}),
            )
            for j, i in enumerate(indices):
                if tape is not None and tape.recording_now:
                    routes_out[i] = tape.samples[j]
                log_probs_out[i] = log_probs[j].to(batch.advantages.device)
                if entropies is not None:
                    entropy_out[i] = entropies[j].to(batch.advantages.device)
    if tape is not None and tape.recording_now:
        tape.samples = routes_out
    lps = [r for r in log_probs_out if r is not None]
    return lps, ([e for e in entropy_out if e is not None] if with_entropy else None)
