"""Top-k / top-p truncation and next-token sampling, with hand-computed cases and property tests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.rollout import draw_from, sample_next_tokens, truncate_logits
from dapo.rollout.sampler import sample_stream_keys, stream_uniforms

PROBS = [0.5, 0.3, 0.15, 0.05]


def _kept(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero().squeeze(-1).tolist()


def test_no_truncation_returns_the_logits_unchanged() -> None:
    logits = torch.tensor([[0.3, -1.0, 2.0]])
    assert torch.equal(truncate_logits(logits, top_k=-1, top_p=1.0), logits)
    assert torch.equal(truncate_logits(logits, top_k=0, top_p=1.0), logits)
    assert torch.equal(truncate_logits(logits, top_k=3, top_p=1.0), logits)


@pytest.mark.parametrize(
    ("top_k", "top_p", "expected"),
    [
        (2, 1.0, [0, 1]),
        (1, 1.0, [0]),
        (-1, 0.7, [0, 1]),  # mass before token 2 is 0.8 >= 0.7 -> dropped
        (-1, 0.85, [0, 1, 2]),  # mass before token 3 is 0.95 >= 0.85 -> dropped
        (-1, 0.99, [0, 1, 2, 3]),
        (-1, 0.01, [0]),  # the most likely token always survives
        (3, 0.7, [0, 1]),
        (2, 0.99, [0, 1]),
    ],
)
def test_hand_computed_truncation(top_k: int, top_p: float, expected: list[int]) -> None:
    logits = torch.tensor([PROBS]).log()
    assert _kept(truncate_logits(logits, top_k=top_k, top_p=top_p)) == expected


def test_top_p_after_top_k_uses_the_renormalised_top_k_mass() -> None:
    # top-k=2 leaves {0.5, 0.3} -> renormalised {0.625, 0.375}; top_p=0.6 keeps only token 0.
    logits = torch.tensor([PROBS]).log()
    assert _kept(truncate_logits(logits, top_k=2, top_p=0.6)) == [0]


def test_truncation_is_per_row() -> None:
    logits = torch.tensor([PROBS, PROBS[::-1]]).log()
    kept = torch.isfinite(truncate_logits(logits, top_k=-1, top_p=0.7))
    assert kept.tolist() == [[True, True, False, False], [False, False, True, True]]


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8, allow_nan=False), min_size=2, max_size=24),
    top_p=st.floats(0.01, 1.0),
    top_k=st.integers(-1, 30),
)
def test_truncation_keeps_argmax_reaches_top_p_and_is_minimal(logits: list[float], top_p: float, top_k: int) -> None:
    row = torch.tensor([logits], dtype=torch.float64)
    kept = torch.isfinite(truncate_logits(row, top_k=top_k, top_p=top_p))[0]
    assert kept[row[0].argmax()]
    after_top_k = torch.isfinite(truncate_logits(row, top_k=top_k, top_p=1.0))[0]
    assert not (kept & ~after_top_k).any(), "top-p must only remove tokens that top-k kept"
    probs = torch.softmax(row[0].masked_fill(~after_top_k, -math.inf), dim=-1)
    kept_mass = probs[kept].sum().item()
    assert kept_mass >= min(top_p, 1.0) - 1e-9 or kept.sum() == after_top_k.sum()
    # Minimal: without its least likely token the kept set would fall short of top_p (ties aside).
    if kept.sum() > 1 and top_p < 1.0:
        smallest = probs[kept].min().item()
        if (probs[kept] == smallest).sum() == 1:
            assert kept_mass - smallest < top_p + 1e-9


def test_sampled_logprob_is_that_of_the_distribution_sampled_from() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 10) * 3
    generator = torch.Generator().manual_seed(0)
    for temperature, top_k, top_p in [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 3, 0.5)]:
        tokens, logprobs = sample_next_tokens(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
        processed = truncate_logits(logits / temperature, top_k=top_k, top_p=top_p)
        expected = torch.log_softmax(processed, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(logprobs, expected)
        if top_k == -1 and top_p == 1.0:  # no truncation: the full vocabulary at the temperature
            full = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            # the same quantity, with the normaliser summed by the draw (float64) instead of inside log_softmax
            torch.testing.assert_close(logprobs, full, rtol=0, atol=4e-6)
        assert tokens.dtype == torch.int64 and logprobs.dtype == torch.float32


def test_greedy_is_argmax_with_temperature_one_logprob() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
    tokens, logprobs = sample_next_tokens(logits, temperature=0.0)
    assert tokens.tolist() == [1, 2]
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1)[[0, 1], [1, 2]])


def test_samples_stay_inside_the_truncated_set_and_follow_its_distribution() -> None:
    logits = torch.tensor([PROBS]).log().expand(20000, 4)
    generator = torch.Generator().manual_seed(1)
    tokens, _ = sample_next_tokens(logits, temperature=1.0, top_k=3, top_p=1.0, generator=generator)
    counts = torch.bincount(tokens, minlength=4).double() / tokens.numel()
    assert counts[3] == 0
    expected = torch.tensor([0.5, 0.3, 0.15], dtype=torch.float64) / 0.95
    assert torch.allclose(counts[:3], expected, atol=0.015)


def test_same_generator_seed_same_tokens() -> None:
    logits = torch.randn(8, 50)
    first, _ = sample_next_tokens(logits, temperature=1.0, generator=torch.Generator().manual_seed(5))
    second, _ = sample_next_tokens(logits, temperature=1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, second)


def test_rejects_non_2d_logits() -> None:
    with pytest.raises(ValueError, match=r"\[batch, vocab\]"):
        sample_next_tokens(torch.zeros(3), temperature=1.0)


def test_draw_from_follows_the_distribution_including_rare_tokens() -> None:
    probs = torch.tensor([[0.6, 0.0, 0.3, 0.09, 0.01, 0.0]]).expand(40000, 6)
    draws = draw_from(probs, torch.Generator().manual_seed(2))
    frequencies = torch.bincount(draws, minlength=6).double() / draws.numel()
    assert frequencies[1] == 0 and frequencies[5] == 0
    torch.testing.assert_close(frequencies, probs[0].double(), atol=0.01, rtol=0)
    assert frequencies[4] > 0.005


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 1e-9, 1e-3, 0.2, 1.0, 7.0]), min_size=1, max_size=16).filter(
        lambda w: sum(w) > 0
    ),
    seed=st.integers(0, 2**31),
)
def test_draw_from_never_returns_a_zero_probability_index(weights: list[float], seed: int) -> None:
    probs = torch.tensor([weights]).expand(64, len(weights))
    probs = probs / probs.sum(dim=-1, keepdim=True)
    draws = draw_from(probs, torch.Generator().manual_seed(seed))
    assert draws.shape == (64,)
    assert bool((probs[0][draws] > 0).all())


def _splitmix64_reference(state: int, count: int) -> list[int]:
    """SplitMix64 in Python's unbounded ints (Steele, Lea & Flood 2014), the first ``count`` outputs from ``state``."""
    mask, out = (1 << 64) - 1, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(z ^ (z >> 31))
    return out


def test_stream_uniforms_are_splitmix64_words() -> None:
    assert _splitmix64_reference(0, 1) == [0xE220A8397B1DCDAF]  # the published first output from state 0
    keys = [0, 1234567, (1 << 63) - 1, -5]  # int64 keys: every bit pattern, the sign bit included
    for counter, words in enumerate(zip(*(_splitmix64_reference(k & ((1 << 64) - 1), 4) for k in keys))):
        got = stream_uniforms(torch.tensor(keys), counter)
        assert got.dtype == torch.float64
        assert got.tolist() == [(w >> 11) * 2.0**-53 for w in words]


def test_stream_keys_depend_on_prompt_seed_and_sample_only() -> None:
    seeds = torch.tensor([7, 7, 8, 8])
    keys = sample_stream_keys(seeds, torch.tensor([0, 1, 0, 1]))
    assert len(set(keys.tolist())) == 4
    # the same (seed, sample) pair gives the same key wherever it sits in the batch
    assert torch.equal(sample_stream_keys(seeds.flip(0), torch.tensor([1, 0, 1, 0])), keys.flip(0))


def test_stream_uniforms_are_uniform_and_drive_draw_from() -> None:
    keys = sample_stream_keys(torch.arange(20000), torch.zeros(20000, dtype=torch.int64))
    u = torch.cat([stream_uniforms(keys, t) for t in range(3)])
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    histogram = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    torch.testing.assert_close(histogram, torch.full((10,), 0.1, dtype=torch.float64), atol=0.01, rtol=0)
    probs = torch.tensor([[0.6, 0.0, 0.3, 0.1]]).expand(20000, 4)
    draws = draw_from(probs, uniforms=stream_uniforms(keys, 0))
    torch.testing.assert_close(
        torch.bincount(draws, minlength=4).double() / 20000, probs[0].double(), atol=0.01, rtol=0
    )
    assert torch.equal(draws, draw_from(probs, uniforms=stream_uniforms(keys, 0)))
    with pytest.raises(ValueError, match="uniforms"):
        draw_from(probs, uniforms=torch.zeros(3, dtype=torch.float64))


def test_draw_from_crosses_blocks_and_a_narrow_last_block() -> None:
    # 1000 tokens = three 256-token blocks and a 232-token one; the mass sits on block edges and in the last block
    weights = torch.zeros(1000)
    support = [3, 255, 256, 511, 999]
    weights[support] = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5])
    draws = draw_from(weights.expand(100000, 1000), torch.Generator().manual_seed(0))
    assert set(draws.tolist()) <= set(support)
    frequencies = torch.bincount(draws, minlength=1000).double()[support] / draws.numel()
    torch.testing.assert_close(frequencies, (weights / weights.sum())[support].double(), atol=0.005, rtol=0)


def test_draw_from_at_the_ends_of_the_unit_interval() -> None:
    # uniform 0 takes the first token with mass; a uniform just below 1 the last one, never the zero tail after it
    weights = torch.zeros(2, 600)
    weights[:, 1], weights[:, 300], weights[:, 520] = 0.25, 0.5, 0.25
    uniforms = torch.tensor([0.0, 1.0 - 2.0**-53], dtype=torch.float64)
    assert draw_from(weights, uniforms=uniforms).tolist() == [1, 520]


def test_a_rows_draw_and_log_prob_do_not_depend_on_the_other_rows() -> None:
    logits = torch.randn(6, 3000, generator=torch.Generator().manual_seed(3)) * 4
    uniforms = stream_uniforms(sample_stream_keys(torch.arange(6), torch.zeros(6, dtype=torch.int64)), 0)
    tokens, logprobs = sample_next_tokens(logits, temperature=0.8, uniforms=uniforms)
    for row in range(6):
        alone, alone_logprob = sample_next_tokens(
            logits[row : row + 1], temperature=0.8, uniforms=uniforms[row : row + 1]
        )
        assert alone.item() == tokens[row].item() and alone_logprob.item() == logprobs[row].item()


def test_scratch_buffer_gives_the_same_draw_and_leaves_the_logits_alone() -> None:
    logits = torch.randn(5, 700, generator=torch.Generator().manual_seed(4))
    before = logits.clone()
    uniforms = torch.rand(5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    plain = sample_next_tokens(logits, temperature=1.0, uniforms=uniforms)
    scratch = torch.full_like(logits, float("nan"))
    lent = sample_next_tokens(logits, temperature=1.0, uniforms=uniforms, scratch=scratch)
    assert torch.equal(plain[0], lent[0]) and torch.equal(plain[1], lent[1])
    assert torch.equal(logits, before) and torch.isfinite(scratch).all()
