"""Next-token sampling from a batch of logits: temperature, top-k, top-p, and the log-prob the trainer needs.

The returned log-prob is that of the distribution the token was actually drawn from: log_softmax of the temperature-
scaled logits after top-k / top-p truncation (vLLM's "processed" log-probs); with no truncation that is the full
vocabulary at the temperature, and greedy decoding reports temperature 1. See :mod:`dapo.rollout.base`.

Randomness comes from one of two sources. A ``torch.Generator`` (or torch's global RNG) draws one uniform per row in
batch order, so a row's draws depend on which rows share its batch. The counter-based streams
(:func:`sample_stream_keys`, :func:`stream_uniforms`) give every row a uniform that is a pure function of (its
prompt's seed, its sample index, the decode step): the same prompt samples the same tokens whatever else is in the
batch, which is what makes a data-parallel run generate exactly what one process generates (docs/distributed.md).
"""

from __future__ import annotations

import torch


class NonFiniteLogitsError(FloatingPointError):
    """The next-token logits hold NaN or +inf (or a row is all -inf): there is no distribution to sample from."""


def check_finite_logits(scaled_logits: torch.Tensor) -> torch.Tensor:
    """Raise :class:`NonFiniteLogitsError` unless every row has a usable distribution; return the row maxima
    (``[batch, 1]``), which the draw needs anyway.

    One reduction covers every case: a row's maximum is NaN with a NaN, +inf with a +inf, -inf when every token is
    -inf; finite otherwise, however large the logits (-inf for a few masked tokens is fine). Without this check such
    rows reach the inverse-CDF draw as a NaN cumulative sum and come out as "index out of bounds".
    """
    row_max = scaled_logits.amax(dim=-1, keepdim=True)
    if not bool(torch.isfinite(row_max).all()):
        bad = (~torch.isfinite(row_max.squeeze(-1))).nonzero().flatten().tolist()
        raise NonFiniteLogitsError(
            f"phase generation: the policy produced non-finite next-token logits (NaN or inf) for "
            f"{len(bad)} of {row_max.shape[0]} sequences (first: {bad[:4]}). The weights are NaN/inf or overflow: "
            "check the model files, lower actor.optim.lr or set actor.grad_clip, and resume from the last checkpoint "
            "(a very low rollout.temperature can also overflow large logits)"
        )
    return row_max


def truncate_logits(scaled_logits: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (set to -inf) every token outside the top-k set and outside the top-p nucleus.

    Top-k keeps the ``top_k`` largest logits (ties at the k-th value are all kept); ``top_k`` <= 0 disables it.
    Top-p keeps the smallest set of most likely tokens whose probability mass reaches ``top_p``: a token is dropped when
    the mass of the tokens strictly more likely than it already reaches ``top_p``, so the most likely token always
    survives. Top-p is applied after top-k, on the renormalised top-k distribution. Returns a new tensor.

    Args:
        scaled_logits: ``[batch, vocab]`` float logits, already divided by the temperature.
        top_k: number of tokens to keep, or -1/0 for no top-k.
        top_p: nucleus mass in (0, 1]; 1 means no top-p.
    """
    logits = scaled_logits
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        # stable: among tied logits the lowest index comes first, so the kept set does not depend on the sort kernel
        sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True, stable=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, sorted_index, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


# SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014; the constants are
# Vigna's, as in java.util.SplittableRandom), written in int64 torch ops so that a whole batch of rows advances in a
# few vectorised operations on any device. int64 arithmetic wraps modulo 2**64 in torch, which is the uint64
# arithmetic SplitMix64 is defined in; right shifts are made logical by masking the sign extension away.
def _int64(value: int) -> int:
    """The int64 with the bit pattern of the uint64 ``value``."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN_GAMMA = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 ``x``."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64_mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function (a bijection of the 64-bit words)."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def sample_stream_keys(prompt_seeds: torch.Tensor, sample_index: torch.Tensor) -> torch.Tensor:
    """The 64-bit key of each row's random stream, from its prompt's seed and its sample index (int64 tensors).

    Rows of different prompts, or different samples of one prompt, get unrelated keys; nothing else enters, so a
    row's stream does not depend on the batch it is decoded in.
    """
    seeds = prompt_seeds.to(torch.int64)
    return _splitmix64_mix(_splitmix64_mix(seeds + _GOLDEN_GAMMA) ^ sample_index.to(torch.int64))


def stream_uniforms(keys: torch.Tensor, counter: int) -> torch.Tensor:
    """The ``counter``-th uniform in [0, 1) of each key's stream, float64: SplitMix64's output number ``counter`` from
    state ``key`` (the top 53 bits of the word, so every value is an exact multiple of 2**-53)."""
    z = _splitmix64_mix(keys + _int64(_GOLDEN_GAMMA * (counter + 1)))
    return _shift_right(z, 11).to(torch.float64) * (2.0**-53)


# Width of the vocabulary blocks of the two-level inverse-CDF draw: 49,152 tokens make 192 blocks of 256.
_DRAW_BLOCK = 256


def _block_sums(weights: torch.Tensor, block: int) -> torch.Tensor:
    """Sums of consecutive ``block``-wide column blocks of contiguous ``weights`` [batch, vocab] (the last block may be
    narrower), without copying ``weights``."""
    rows, vocab = weights.shape
    full = vocab // block
    sums = weights.as_strided((rows, full, block), (vocab, block, 1)).sum(dim=-1)
    if full * block < vocab:
        sums = torch.cat([sums, weights[:, full * block :].sum(dim=-1, keepdim=True)], dim=-1)
    return sums


def draw_from(
    probs: torch.Tensor, generator: torch.Generator | None = None, *, uniforms: torch.Tensor | None = None
) -> torch.Tensor:
    """Draw one index per row of ``probs`` ([batch, vocab], non-negative, any positive row total) by inverse-CDF
    sampling.

    One uniform per row, located in the row's cumulative mass, in two levels: the row's 256-token block sums
    (float32 sums of the block, accumulated in float64) pick the block, then a float64 cumulative sum of that one
    block picks the token. Exact in distribution up to the float32 rounding of a block's sum (~1e-7 of the block's
    mass, below the rounding of the probabilities themselves), never a zero-probability index, and it reads the row
    once instead of converting and cumulating all of it: a 64 x 49,152 draw went from ~9 ms to ~1 ms on 2 CPU cores
    (``torch.multinomial`` was slower still, a third of the whole decode step in benchmarks/bench_rollout.py).

    ``uniforms`` ([batch] in [0, 1), e.g. :func:`stream_uniforms`) are used instead of drawing from ``generator``. A
    row's draw depends on its own weights and uniform only, never on the other rows.
    """
    return _draw_with_total(probs, generator, uniforms)[0]


def _draw_with_total(
    probs: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`draw_from`, also returning each row's total mass ([batch] float64), which it sums on the way."""
    probs = probs.contiguous()
    rows, vocab = probs.shape
    block_cdf = _block_sums(probs, _DRAW_BLOCK).to(torch.float64).cumsum(dim=-1)
    total = block_cdf[:, -1:].contiguous()
    if uniforms is not None:
        if uniforms.shape != total.shape[:-1]:
            raise ValueError(f"draw_from: {tuple(uniforms.shape)} uniforms for {tuple(total.shape[:-1])} rows")
        uniform = uniforms.to(device=probs.device, dtype=torch.float64).unsqueeze(-1)
    else:
        uniform = torch.rand(total.shape, generator=generator, device=probs.device, dtype=torch.float64)
    target = uniform * total
    # The block holding the target: the first whose cumulative mass exceeds it (so never an empty block); uniform *
    # total can round up to total itself, so clamp to the last block with mass (the first one reaching the total).
    block = torch.minimum(
        torch.searchsorted(block_cdf, target, right=True), torch.searchsorted(block_cdf, total, right=False)
    )
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)
    columns = block * _DRAW_BLOCK + torch.arange(_DRAW_BLOCK, device=probs.device)
    inside = columns < vocab  # the last block may be narrower
    within = torch.where(inside, probs.gather(-1, columns.clamp(max=vocab - 1)), 0.0).to(torch.float64).cumsum(-1)
    # The same two rules inside the block; the float32 block sum and this float64 sum can differ in the last bits,
    # which the clamp to the block's last non-zero token absorbs.
    offset = torch.minimum(
        torch.searchsorted(within, target - before, right=True),
        torch.searchsorted(within, within[:, -1:].contiguous(), right=False),
    )
    return (columns.gather(-1, offset)).squeeze(-1), total.squeeze(-1)


def sample_next_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return ``(token_ids [batch] int64, logprobs [batch] float32)``.

    ``temperature == 0`` is greedy argmax, with the log-prob taken at temperature 1 over the full vocabulary. Otherwise
    the token is drawn from softmax(truncate(logits / temperature)) and its log-prob is read from that same
    distribution, log_softmax(truncate(logits / temperature)): the behaviour policy's probability, which is what an
    importance weight against the actor needs.

    Args:
        logits: ``[batch, vocab]`` next-token logits (any float dtype; computed in float32).
        temperature: >= 0.
        top_k: -1/0 for off.
        top_p: in (0, 1].
        generator: source of randomness; None uses torch's global RNG for the logits' device.
        uniforms: one uniform per row to draw with instead (see :func:`draw_from`); ``generator`` is then unused.
        scratch: an optional float32 buffer shaped like ``logits`` that the unnormalised probabilities are written
            into (a decode loop lends the same one every step); its contents are overwritten. ``logits`` is never
            modified.
    """
    if logits.dim() != 2:
        raise ValueError(f"sample_next_tokens expects [batch, vocab] logits, got shape {tuple(logits.shape)}")
    logits = logits.float()
    if temperature == 0:
        check_finite_logits(logits)
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens, logprobs
    scaled = logits if temperature == 1.0 else logits / temperature
    row_max = check_finite_logits(scaled)  # after the division: a finite logit over a small temperature can overflow
    if 0 < top_k < logits.shape[-1] or top_p < 1.0:
        scaled = truncate_logits(scaled, top_k=top_k, top_p=top_p)  # keeps every row's maximum
    # exp(x - max): the unnormalised distribution, in one buffer (``scratch`` when the caller lends one: allocating
    # a fresh 12 MB tensor per decode step cost more than the arithmetic, page faults included).
    if scratch is not None and scratch.shape == scaled.shape and scratch.dtype == scaled.dtype:
        weights = torch.sub(scaled, row_max, out=scratch)
    else:
        weights = scaled - row_max
    tokens, total = _draw_with_total(weights.exp_(), generator, uniforms)
    # log_softmax(x)[token] = x[token] - max - log(sum exp(x - max)), with the sum the draw already took
    picked = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    logprobs = (picked - row_max.squeeze(-1)) - total.log().to(torch.float32)
    return tokens, logprobs
