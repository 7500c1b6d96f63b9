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


def check_finite_logits(scaled_logits: torch.Tensor) -> None:
    """Raise :class:`NonFiniteLogitsError` unless every row has a usable distribution.

    One reduction covers every case: logsumexp is NaN with a NaN, +inf with a +inf, -inf when every token is -inf;
    finite otherwise, however large the logits (-inf for a few masked tokens is fine). Without this check such rows
    reach the inverse-CDF draw as a NaN cumulative sum and come out as "index out of bounds".
    """
    norm = torch.logsumexp(scaled_logits, dim=-1)
    if not bool(torch.isfinite(norm).all()):
        bad = (~torch.isfinite(norm)).nonzero().flatten().tolist()
        raise NonFiniteLogitsError(
            f"phase generation: the policy produced non-finite next-token logits (NaN or inf) for "
            f"{len(bad)} of {norm.numel()} sequences (first: {bad[:4]}). The weights are NaN/inf or overflow: check "
            "the model files, lower actor.optim.lr or set actor.grad_clip, and resume from the last checkpoint "
            "(a very low rollout.temperature can also overflow large logits)")


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
    return _shift_right(z, 11).to(torch.float64) * (2.0 ** -53)


def draw_from(probs: torch.Tensor, generator: torch.Generator | None = None, *,
              uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one index per row of ``probs`` ([batch, vocab], rows summing to ~1) by inverse-CDF sampling.

    One uniform per row, located in the row's cumulative sum: exact in distribution up to float64 rounding, never a
    zero-probability index, and ~7x faster on CPU than ``torch.multinomial`` at a 64 x 8192 batch (multinomial was a
    third of the whole decode step in benchmarks/bench_rollout.py). The cumulative sum is taken in float64 so that
    rounding over a 150k-token vocabulary cannot visibly shift the probability of rare tokens.

    ``uniforms`` ([batch] in [0, 1), e.g. :func:`stream_uniforms`) are used instead of drawing from ``generator``.
    """
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    total = cdf[..., -1:].contiguous()
    if uniforms is not None:
        if uniforms.shape != total.shape[:-1]:
            raise ValueError(f"draw_from: {tuple(uniforms.shape)} uniforms for {tuple(total.shape[:-1])} rows")
        uniform = uniforms.to(device=probs.device, dtype=torch.float64).unsqueeze(-1)
    else:
        uniform = torch.rand(total.shape, generator=generator, device=probs.device, dtype=torch.float64)
    tokens = torch.searchsorted(cdf, uniform * total, right=True)
    # uniform * total can round up to total itself; the first index reaching the total is the last non-zero one.
    last_nonzero = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(tokens, last_nonzero).squeeze(-1)


def sample_next_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
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
    """
    if logits.dim() != 2:
        raise ValueError(f"sample_next_tokens expects [batch, vocab] logits, got shape {tuple(logits.shape)}")
    logits = logits.float()
    if temperature == 0:
        check_finite_logits(logits)
        tokens = logits.argmax(dim=-1)
        full_logprobs = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / temperature
        check_finite_logits(scaled)  # after the division: a finite logit over a small temperature can overflow
        if 0 < top_k < logits.shape[-1] or top_p < 1.0:
            truncated = truncate_logits(scaled, top_k=top_k, top_p=top_p)
            probs = torch.softmax(truncated, dim=-1)
            full_logprobs = torch.log_softmax(truncated, dim=-1)
        else:
            full_logprobs = torch.log_softmax(scaled, dim=-1)
            probs = full_logprobs.exp()
        tokens = draw_from(probs, generator, uniforms=uniforms)
    logprobs = full_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, logprobs
