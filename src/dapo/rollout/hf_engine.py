"""A hand-written, KV-cached, batch-shrinking sampler over a Hugging Face causal LM (CPU or one GPU).

Why not ``model.generate``: it keeps finished sequences in the batch (padding them until the longest one ends), so a
group where most answers are short still pays for the longest one on every row, and it runs a stack of generic logits
processors and stopping criteria per step. RL rollouts have wildly varying lengths, so this engine instead

1. left-pads the prompts (attention mask + explicit position ids, so padding changes nothing),
2. prefills each *distinct* prompt once and decodes its ``n`` samples on that one copy of its keys and values
   (:class:`dapo.rollout.kv_cache.SharedPrefixLayer`; a copy per sample where the model does not run SDPA),
3. decodes one token per step for the rows still running, and
4. drops finished rows from the batch and from the KV cache (every layer kind: keys and values, or a linear-attention
   layer's states; :func:`dapo.model.cache_layers.select_cache_rows`) once an eighth of the batch has emitted a stop
   token, so compute shrinks with the number of unfinished sequences.

The engine shares the actor's ``nn.Module``: the actor's optimizer step *is* the weight update, so
:meth:`HFRolloutEngine.update_weights` has nothing to do when handed the module's own tensors (it copies in any other
tensors, e.g. from a separate training copy). Generation runs under ``torch.inference_mode`` with the module in eval
mode (dropout off); its previous train/eval state is restored afterwards.

Log-prob semantics are those of :mod:`dapo.rollout.base`: full-vocabulary log_softmax(logits / temperature).

Randomness: with ``SamplingParams.prompt_seeds`` every row draws its token at decode step ``t`` with uniform number
``t`` of its own counter-based stream, keyed by (its prompt's seed, its sample index)
(:func:`dapo.rollout.sampler.sample_stream_keys`), so a response does not depend on the other rows of the call, on
``max_batch_size`` chunking, nor on rows finishing and leaving the batch. Without them, ``SamplingParams.seed`` seeds
one ``torch.Generator`` for the call, which draws a uniform per live row per step in batch order.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, PreTrainedModel

from dapo.model.attention import (
    GQA_SDPA,
    SHARED_PREFIX,
    SHARED_PREFIX_CACHE,
    attention_implementation,
    grouped_query_sdpa,
)
from dapo.model.batch_invariant import PositionKV, forward_at, invariance_of, token_log_probs
from dapo.model.cache_layers import select_cache_rows
from dapo.model.left_padding import left_pad
from dapo.model.router_replay import ROUTE_DTYPE, tape_of
from dapo.rollout.base import RolloutOutput, SamplingParams, StepCallback
from dapo.rollout.kv_cache import preallocated_cache, shared_prompt_cache
from dapo.rollout.sampler import sample_next_tokens, sample_stream_keys, stream_uniforms
from dapo.rollout.spec import EngineSpec

if TYPE_CHECKING:
    from dapo.model.loading import Policy


# Finished rows leave the batch once they are at least 1 / this of it.
_DROP_WHEN_FINISHED = 8


class HFRolloutEngine:
    """Rollout engine over a (shared) Hugging Face causal LM. Implements :class:`dapo.rollout.base.RolloutEngine`.

    Inside :func:`dapo.model.batch_invariant.batch_invariant` on its model it decodes batch-invariantly
    (``rollout.true_on_policy``): its log-probs are then bitwise the actor's.

    Args:
        model: the causal LM (the actor's module; not copied, not moved).
        eos_token_ids: id(s) that end a response; ``SamplingParams.stop_token_ids`` are added per request.
        pad_token_id: id put in left-padding positions (masked out, so its value only has to be a valid id).
        device: where inputs go; must be the model's device (default: the device of its parameters).
        max_batch_size: most sequences (prompt x sample rows) decoded at once; larger requests run in chunks of this
            many rows, in order. None: one batch.
        drop_finished: drop finished rows from the batch and KV cache, once they are an eighth of it (default). False
            keeps them until the whole batch is done, like ``model.generate``; it exists to measure what shrinking
            buys (benchmarks/bench_rollout.py).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_ids: int | Sequence[int],
        pad_token_id: int,
        device: torch.device | str | None = None,
        max_batch_size: int | None = None,
        drop_finished: bool = True,
    ) -> None:
        self.model = model
        self.vocab_size = model.get_input_embeddings().num_embeddings
        eos = (eos_token_ids,) if isinstance(eos_token_ids, int) else tuple(eos_token_ids)
        for token_id in eos:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ValueError(f"HFRolloutEngine: eos_token_ids must be non-negative ints, got {eos_token_ids!r}")
        self.eos_token_ids: tuple[int, ...] = eos
        pad_ok = isinstance(pad_token_id, int) and not isinstance(pad_token_id, bool)
        if not pad_ok or not 0 <= pad_token_id < self.vocab_size:
            raise ValueError(
                f"HFRolloutEngine: pad_token_id must be an int in [0, {self.vocab_size}), got {pad_token_id!r}"
            )
        self.pad_token_id = pad_token_id
        model_device = next(model.parameters()).device
        if device is not None:
            wanted = torch.device(device)
            if wanted.type != model_device.type or (wanted.index is not None and wanted.index != model_device.index):
                raise ValueError(
                    f"HFRolloutEngine: device {wanted} differs from the model's device {model_device}; the engine "
                    "shares the actor's module and never moves it, so move the model instead"
                )
        self.device = model_device
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1
        ):
            raise ValueError(f"HFRolloutEngine: max_batch_size must be None or an int >= 1, got {max_batch_size!r}")
        self.max_batch_size = max_batch_size
        self.drop_finished = drop_finished
        # A PEFT (LoRA) model's forward passes its keyword arguments on to the wrapped model's: read that one's.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        forward_params = inspect.signature(inner.forward).parameters
        # transformers >= 5 names the KV cache argument `cache`; 4.x calls it `past_key_values`.
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in forward_params

    # ------------------------------------------------------------------------------------------------ public API
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses for each prompt; one entry per sample, each prompt's samples contiguous."""
        return self._generate(prompt_token_ids, params, None)

    def generate_streaming(
        self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams, on_step: StepCallback
    ) -> RolloutOutput:
        """:meth:`generate`, reporting every decode step to ``on_step``
        (:class:`dapo.rollout.base.TokenStreamingEngine`); it runs on this thread, between two forward passes."""
        return self._generate(prompt_token_ids, params, on_step)

    def _generate(
        self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams, on_step: StepCallback | None
    ) -> RolloutOutput:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"HFRolloutEngine.generate: params must be SamplingParams, got {type(params).__name__}")
        prompts = self._validate_prompts(prompt_token_ids)
        rows = [index for index in range(len(prompts)) for _ in range(params.n)]
        stop_ids = torch.tensor(sorted(set(self.eos_token_ids) | set(params.stop_token_ids)), device=self.device)
        generator = keys = None
        if params.prompt_seeds is not None:
            if len(params.prompt_seeds) != len(prompts):
                raise ValueError(
                    f"HFRolloutEngine.generate: {len(params.prompt_seeds)} prompt_seeds for {len(prompts)} prompts"
                )
            seeds = torch.tensor(params.prompt_seeds, dtype=torch.int64, device=self.device)
            sample_index = torch.arange(params.n, dtype=torch.int64, device=self.device).repeat(len(prompts))
            keys = sample_stream_keys(seeds.repeat_interleave(params.n), sample_index)  # row i * n + j
        elif params.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        chunk_size = self.max_batch_size or max(len(rows), 1)

        response_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        finish_reason: list[str] = []
        invariance = invariance_of(self.model)
        # R3 (actor.router_replay.mode): the routers' tape asks for every sample's routes, prompt and response
        tape = tape_of(self.model)
        routes: list[torch.Tensor] | None = [] if tape is not None and tape.rollout_routes else None
        if routes is not None and invariance is not None:
            raise ValueError("HFRolloutEngine: router replay does not record routes while decoding batch-invariantly")
        was_training = self.model.training
        self.model.eval()
        generate_rows = self._generate_rows if invariance is None else self._generate_rows_invariant
        precision = grouped_query_sdpa(self.model) if invariance is None else invariance.autocast(self.device)
        try:
            with torch.inference_mode(), precision, tape.recording() if routes is not None else nullcontext():
                cut = False
                for start in range(0, len(rows), chunk_size):
                    count = len(rows[start : start + chunk_size])
                    if cut:  # the caller ended the call: the rows not started yet answer with no tokens
                        response_ids += [[] for _ in range(count)]
                        logprobs += [[] for _ in range(count)]
                        finish_reason += ["length"] * count
                        if routes is not None:
                            routes += [self._no_routes(tape, prompts[p]) for p in rows[start : start + count]]
                        continue
                    ids, lps, reasons, cut = generate_rows(
                        prompts,
                        rows[start : start + chunk_size],
                        params,
                        stop_ids,
                        generator,
                        None if keys is None else keys[start : start + chunk_size],
                        on_step=on_step,
                        first_entry=start,
                        **({} if routes is None else {"routes": routes}),
                    )
                    response_ids += ids
                    logprobs += lps
                    finish_reason += reasons
        finally:
            self.model.train(was_training)
        return RolloutOutput(rows, response_ids, logprobs, finish_reason, routed_experts=routes)

    @staticmethod
    def _no_routes(tape, prompt: torch.Tensor) -> torch.Tensor:
        """The routes of a sample that was never generated: its prompt's, unknown (-1: the actor routes live)."""
        return torch.full((prompt.numel(), tape.num_layers, tape.top_k), -1, dtype=ROUTE_DTYPE)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the given tensors into the model's parameters/buffers of the same name.

        When the engine shares the actor's module (the normal case) every tensor *is* the parameter and this is a
        no-op; tensors living elsewhere (another copy of the weights) are copied in place.
        """
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(self.model.named_buffers(remove_duplicate=False))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in targets:
                    raise KeyError(f"HFRolloutEngine.update_weights: the model has no parameter or buffer {name!r}")
                target = targets[name]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"HFRolloutEngine.update_weights: {name!r} has shape {tuple(target.shape)} in the model but "
                        f"{tuple(tensor.shape)} was given"
                    )
                if target.data_ptr() == tensor.data_ptr() and target.device == tensor.device:
                    continue
                target.copy_(tensor)

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Teacher-forced log-probs of ``response_ids`` after the prompt (temperature 1, full vocabulary)."""
        prompt = self._validate_prompts([prompt_token_ids])[0]
        response = torch.as_tensor(list(response_ids), dtype=torch.long)
        if response.numel() == 0:
            return []
        ids = torch.cat([prompt, response]).to(self.device).unsqueeze(0)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                logits = self.model(input_ids=ids).logits[0, prompt.numel() - 1 : -1].float()
        finally:
            self.model.train(was_training)
        logprobs = torch.log_softmax(logits, dim=-1)
        return logprobs.gather(-1, response.to(self.device).unsqueeze(-1)).squeeze(-1).tolist()

    def close(self) -> None:
        """Nothing to release: the engine holds no process or memory of its own."""

    # ------------------------------------------------------------------------------------------------ internals
    def _validate_prompts(self, prompt_token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Turn prompts into 1-D int64 tensors, rejecting empty prompts, non-integers and out-of-vocab ids."""
        if isinstance(prompt_token_ids, torch.Tensor) or isinstance(prompt_token_ids, (str, bytes)):
            raise TypeError("HFRolloutEngine.generate: prompt_token_ids must be a sequence of token-id sequences")
        prompts = []
        for index, prompt in enumerate(prompt_token_ids):
            ids = torch.as_tensor(prompt)
            if ids.dim() != 1 or ids.numel() == 0:
                raise ValueError(f"HFRolloutEngine.generate: prompt {index} must be a non-empty 1-D token-id sequence")
            if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
                raise ValueError(f"HFRolloutEngine.generate: prompt {index} has non-integer token ids ({ids.dtype})")
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(
                    f"HFRolloutEngine.generate: prompt {index} has token id {bad} outside the vocabulary "
                    f"[0, {self.vocab_size})"
                )
            prompts.append(ids.to(dtype=torch.long))
        return prompts

    def _next_token_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        cache: DynamicCache,
        **attention_kwargs: object,
    ) -> torch.Tensor:
        """One forward pass appending to ``cache``; returns the logits at the last position, ``[batch, vocab]``.
        ``attention_kwargs`` go through the model to its attention functions."""
        kwargs = {self._cache_kwarg: cache, "use_cache": True, **attention_kwargs}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return output.logits[:, -1, :]

    def _generate_rows(
        self,
        prompts: list[torch.Tensor],
        rows: list[int],
        params: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator | None,
        keys: torch.Tensor | None = None,
        *,
        on_step: StepCallback | None = None,
        first_entry: int = 0,
        routes: list[torch.Tensor] | None = None,
    ) -> tuple[list[list[int]], list[list[float]], list[str], bool]:
        """Generate one response per entry of ``rows`` (a prompt index each) as one shrinking batch; ``keys`` (one
        stream key per row) replace ``generator`` as the source of randomness when given. ``on_step`` hears of every
        step's tokens (rows numbered from ``first_entry``); the last value returned: whether it ended the call.
        ``routes`` (R3, inside the model's tape's recording): each row's ``[prompt + response, layers, k]`` expert ids
        are appended; a response's last token is never fed to the model, so its routes are -1 (the actor's own)."""
        device = self.device
        tape = tape_of(self.model) if routes is not None else None
        # Prefill each distinct prompt once, left-padded; then give every row a copy of its prompt's cache.
        distinct, to_distinct = _distinct_prompts(rows, device)
        row_to_distinct = to_distinct if len(distinct) < len(rows) else None
        input_ids, attention_mask, position_ids = left_pad([prompts[p] for p in distinct], self.pad_token_id, device)
        width = input_ids.shape[1]
        padded = not bool(attention_mask.all())

        # The n samples of a prompt decode on one copy of its keys and values (SharedPrefix) when the model runs the
        # grouped-query SDPA of dapo.model.attention; otherwise each row gets its own copy of its prompt's cache.
        share = row_to_distinct is not None and self.model.config._attn_implementation == GQA_SDPA
        cache = preallocated_cache(self.model.config, capacity=width if share else width + params.max_tokens)
        logits = self._next_token_logits(input_ids, attention_mask if padded else None, position_ids, cache)
        if tape is not None:  # each distinct prompt's routes at its real (unpadded) positions
            prefill = tape.take().view(*input_ids.shape, tape.num_layers, tape.top_k).cpu()
            prompt_routes = [prefill[d, width - prompts[p].numel() :] for d, p in enumerate(distinct)]
            out_routes = torch.full((len(rows), params.max_tokens, tape.num_layers, tape.top_k), -1, dtype=ROUTE_DTYPE)
        next_position = position_ids[:, -1] + 1
        decode_kwargs: dict[str, object] = {}
        if row_to_distinct is not None:
            logits = logits[row_to_distinct]
            next_position = next_position[row_to_distinct]
            shared = (
                shared_prompt_cache(cache, attention_mask.bool(), row_to_distinct, params.max_tokens) if share else None
            )
            if shared is not None:
                cache, padded = shared, False  # the prompts' padding is the prefix's bias; own tokens are never padding
                decode_kwargs = {SHARED_PREFIX_CACHE: cache}
            else:
                select_cache_rows(cache, row_to_distinct)
                attention_mask = attention_mask[row_to_distinct]

        num_rows, max_tokens = len(rows), params.max_tokens
        steps_done, cut = 0, False
        out_tokens = torch.full((num_rows, max_tokens), self.pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((num_rows, max_tokens), dtype=torch.float32, device=device)
        alive = torch.arange(num_rows, device=device)  # batch position -> row, for the rows still decoding
        finished = torch.zeros(num_rows, dtype=torch.bool, device=device)  # batch positions past their stop token
        scratch = torch.empty((num_rows, logits.shape[-1]), dtype=torch.float32, device=device)  # the draw's buffer
        decode_attention = attention_implementation(self.model, SHARED_PREFIX) if decode_kwargs else nullcontext()
        with decode_attention:
            for step in range(max_tokens):
                # the live rows' uniforms for this step: a function of (row key, step) only, whoever else is alive
                uniforms = None if keys is None or params.greedy else stream_uniforms(keys[alive], step)
                tokens, token_logprobs = sample_next_tokens(
                    logits,
                    temperature=params.temperature,
                    top_k=params.top_k,
                    top_p=params.top_p,
                    generator=generator,
                    uniforms=uniforms,
                    scratch=scratch[: len(alive)],
                )
                out_tokens[alive, step] = tokens
                out_logprobs[alive, step] = token_logprobs
                steps_done = step + 1
                if on_step is not None:
                    running = (~finished).nonzero().squeeze(-1)  # rows past their stop token drew nothing of theirs
                    cut = bool(
                        on_step(
                            (alive[running] + first_entry).tolist(),
                            tokens[running].tolist(),
                            token_logprobs[running].tolist(),
                        )
                    )
                    if cut:
                        break
                if step == max_tokens - 1:
                    break
                finished |= torch.isin(tokens, stop_ids)
                num_finished = int(finished.sum())
                if num_finished == len(alive):
                    break
                # Drop the finished rows once they are an eighth of the batch: a drop copies every layer's cache, so
                # dropping each row the step it stops cost more than decoding a few rows a few steps too long (what
                # they generate past their stop token is cut off below).
                if self.drop_finished and num_finished * _DROP_WHEN_FINISHED >= len(alive):
                    keep = (~finished).nonzero().squeeze(-1)
                    alive, tokens, next_position = alive[keep], tokens[keep], next_position[keep]
                    finished = finished[keep]
                    select_cache_rows(cache, keep)
                    if padded:
                        attention_mask = attention_mask[keep]
                        padded = not bool(attention_mask.all())
                if padded:
                    attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(alive), 1)], dim=-1)
                logits = self._next_token_logits(
                    tokens.unsqueeze(-1),
                    attention_mask if padded else None,
                    next_position.unsqueeze(-1),
                    cache,
                    **decode_kwargs,
                )
                if tape is not None:  # the routes of response token `step`, fed in this forward
                    out_routes[alive.cpu(), step] = tape.take().cpu()
                next_position = next_position + 1

        responses = _responses(out_tokens[:, :steps_done], out_logprobs[:, :steps_done], stop_ids, steps_done)
        if routes is not None:
            routes += [
                torch.cat([prompt_routes[int(to_distinct[k])], out_routes[k, : len(ids)]])
                for k, ids in enumerate(responses[0])
            ]
        return (*responses, cut)

    def _generate_rows_invariant(
        self,
        prompts: list[torch.Tensor],
        rows: list[int],
        params: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator | None,
        keys: torch.Tensor | None = None,
        *,
        on_step: StepCallback | None = None,
        first_entry: int = 0,
    ) -> tuple[list[list[int]], list[list[float]], list[str], bool]:
        """:meth:`_generate_rows` in batch-invariant mode (``rollout.true_on_policy``,
        :mod:`dapo.model.batch_invariant`): every sequence's keys sit at their positions in a
        :class:`PositionKV`, each distinct prompt is prefilled once and its buffers copied to its samples (a copy is
        exact), and every step's log-probs are :func:`token_log_probs` of the logits, the actor's function. A row
        leaves the batch the step it stops: its buffers stay where they are, so leaving copies nothing."""
        device = self.device
        invariance = invariance_of(self.model)
        assert invariance is not None
        distinct, to_distinct = _distinct_prompts(rows, device)
        input_ids, attention_mask, position_ids = left_pad([prompts[p] for p in distinct], self.pad_token_id, device)
        longest = int(position_ids[:, -1].max()) + params.max_tokens
        if longest > invariance.max_length:
            raise ValueError(
                f"HFRolloutEngine: a prompt of {longest - params.max_tokens} tokens and max_tokens "
                f"{params.max_tokens} reach position {longest - 1}, past the batch-invariant buffer of "
                f"{invariance.max_length} positions (data.max_prompt_length + data.max_response_length)"
            )
        sequence = torch.arange(len(distinct), device=device)[:, None].expand_as(input_ids)
        kv = PositionKV(
            len(distinct), invariance.max_length, sequence, position_ids, attention_mask.bool(), in_place=True
        )
        logits = self._invariant_logits(kv, input_ids, position_ids)
        kv.select(to_distinct)
        logits, next_position = logits[to_distinct], position_ids[:, -1][to_distinct] + 1

        num_rows, max_tokens = len(rows), params.max_tokens
        steps_done, cut = 0, False
        out_tokens = torch.full((num_rows, max_tokens), self.pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((num_rows, max_tokens), dtype=torch.float32, device=device)
        alive = torch.arange(num_rows, device=device)  # batch position -> row (= its buffer row)
        for step in range(max_tokens):
            uniforms = None if keys is None or params.greedy else stream_uniforms(keys[alive], step)
            tokens, _ = sample_next_tokens(
                logits,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                generator=generator,
                uniforms=uniforms,
            )
            token_logprobs = token_log_probs(logits, tokens, params.temperature)
            out_tokens[alive, step] = tokens
            out_logprobs[alive, step] = token_logprobs
            steps_done = step + 1
            if on_step is not None:
                cut = bool(on_step((alive + first_entry).tolist(), tokens.tolist(), token_logprobs.tolist()))
                if cut:
                    break
            keep = (~torch.isin(tokens, stop_ids)).nonzero().squeeze(-1)
            if step == max_tokens - 1 or keep.numel() == 0:
                break
            alive, tokens, next_position = alive[keep], tokens[keep], next_position[keep]
            kv.at(alive[:, None], next_position[:, None])
            logits = self._invariant_logits(kv, tokens[:, None], next_position[:, None])
            next_position = next_position + 1
        return (*_responses(out_tokens[:, :steps_done], out_logprobs[:, :steps_done], stop_ids, steps_done), cut)

    def _invariant_logits(self, kv: PositionKV, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """The logits at the last position of each row of one batch-invariant forward, ``[batch, vocab]``."""
        extra = {"logits_to_keep": 1} if self._has_logits_to_keep else {}
        return forward_at(self.model, kv, input_ids, position_ids, **extra).logits[:, -1, :]


def _distinct_prompts(rows: list[int], device: torch.device) -> tuple[list[int], torch.Tensor]:
    """The distinct prompts of ``rows`` (prompt indices, in first-seen order) and each row's place among them."""
    position_of = {p: i for i, p in enumerate(dict.fromkeys(rows))}
    return list(position_of), torch.tensor([position_of[p] for p in rows], device=device)


def _responses(
    out_tokens: torch.Tensor, out_logprobs: torch.Tensor, stop_ids: torch.Tensor, steps_done: int
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Each row's response: up to its first stop token (kept) or all ``steps_done`` tokens (finish reason
    ``length``), and the log-probs of those tokens."""
    is_stop = torch.isin(out_tokens, stop_ids)
    stopped = is_stop.any(dim=-1)
    lengths = torch.where(stopped, is_stop.int().argmax(dim=-1) + 1, steps_done)
    token_lists = out_tokens.tolist()
    logprob_lists = out_logprobs.tolist()
    response_ids, logprobs, finish_reason = [], [], []
    for k, (length, was_stopped) in enumerate(zip(lengths.tolist(), stopped.tolist())):
        response_ids.append(token_lists[k][:length])
        logprobs.append(logprob_lists[k][:length])
        finish_reason.append("stop" if was_stopped else "length")
    return response_ids, logprobs, finish_reason


def build_hf_engine(spec: EngineSpec, policy: Policy, module: torch.nn.Module | None) -> HFRolloutEngine:
    """The registry's builder (``dapo.rollout.factory.ENGINES["hf"]``): an engine over the actor's own module, or over
    ``module``, the unsharded (or recast) copy of it that every push refreshes (``hf_engine_copy``)."""
    return HFRolloutEngine(
        policy.model if module is None else module,
        eos_token_ids=policy.eos_token_ids,
        pad_token_id=policy.pad_token_id,
        max_batch_size=spec.max_batch_size,
    )
