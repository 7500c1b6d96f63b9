"""The FLOP model of dapo.infra.perf: hand-computed on a tiny shape, checked against torch's own FLOP counter on the
real embedded model, and the peak table / probe cache."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from dapo.infra import perf
from dapo.infra.perf import (
    attention_flops_per_key,
    datasheet_peak,
    group_forward_flops,
    matmul_params,
    measure_matmul_flops,
    peak_flops,
    sequence_forward_flops,
)

TINY = Path(__file__).resolve().parents[2] / "src" / "dapo" / "assets" / "tiny-qwen2"


@dataclass
class Shape:
    hidden_size: int = 8
    intermediate_size: int = 16
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    vocab_size: int = 10
    head_dim: int | None = None


def test_matmul_params_by_hand() -> None:
    # head dim 8 / 2 = 4; per layer q 8x8 = 64, k 8x4 = 32, v 32, o 8x8 = 64 -> 192; MLP 3 x 8 x 16 = 384;
    # 2 layers x 576 = 1152, plus the LM head 10 x 8 = 80 (the embedding lookup is no matmul)
    assert matmul_params(Shape()) == 1232
    assert attention_flops_per_key(Shape()) == 4 * 2 * 2 * 4 == 64
    # an explicit head_dim (Qwen3-style) overrides hidden / heads: q 8x12, k and v 8x6 each, o 12x8
    assert matmul_params(Shape(head_dim=6, num_hidden_layers=1)) == 8 * 12 + 2 * 8 * 6 + 12 * 8 + 384 + 80


def test_group_forward_flops_by_hand() -> None:
    # prompt of 3 tokens once, responses of 2 and 1 tokens: 6 tokens through the linear layers;
    # causal query-key pairs: prompt 1+2+3 = 6, response 1 (positions 4, 5) 4+5 = 9, response 2 (position 4) 4 -> 19
    assert group_forward_flops(Shape(), 3, [2, 1]) == 2 * 1232 * 6 + 64 * 19 == 16000
    # one sequence of 5 tokens: 2 N s + 4 L H d s(s+1)/2 = 2*1232*5 + 64*15
    assert sequence_forward_flops(Shape(), 5) == 12320 + 960
    # sharing the prompt saves exactly its repeated forward: two samples each with their own copy cost more by one
    # prompt's worth (2 N 3 + 64 * 6)
    separate = sequence_forward_flops(Shape(), 5) + sequence_forward_flops(Shape(), 4)
    assert separate - group_forward_flops(Shape(), 3, [2, 1]) == 2 * 1232 * 3 + 64 * 6


@pytest.fixture(scope="module")
def tiny_eager():
    return AutoModelForCausalLM.from_pretrained(TINY, attn_implementation="eager")


def test_linear_flops_match_torchs_counter_on_the_real_model(tiny_eager) -> None:
    """torch's FLOP counter on the embedded Qwen2 (eager attention: explicit matmuls) gives 2 N s for the linear layers
    plus the full s x s score matrix (4 L H d s^2, masked half included); backward doubles the forward."""
    s = 10
    ids = torch.arange(1, s + 1).unsqueeze(0)
    n = matmul_params(tiny_eager.config)
    full_square = attention_flops_per_key(tiny_eager.config) * s * s
    with FlopCounterMode(display=False) as forward:
        tiny_eager(ids)
    assert forward.get_total_flops() == 2 * n * s + full_square
    with FlopCounterMode(display=False) as both:
        tiny_eager(ids).logits.sum().backward()
    assert both.get_total_flops() == 3 * (2 * n * s + full_square)
    # the causal count is the part of that square a causal model needs: s(s+1)/2 of s^2 pairs
    assert sequence_forward_flops(tiny_eager.config, s) == 2 * n * s + full_square * (s + 1) // (2 * s)


def test_datasheet_names() -> None:
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "bf16").flops_per_s == pytest.approx(989.4e12)
    assert datasheet_peak("NVIDIA H100 PCIe", "bf16").flops_per_s == pytest.approx(756e12)
    assert datasheet_peak("NVIDIA H200", "fp32").flops_per_s == pytest.approx(66.9e12)
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "fp32").flops_per_s == pytest.approx(19.5e12)
    assert datasheet_peak("NVIDIA A10G", "bf16").flops_per_s == pytest.approx(70e12)  # not the A10's 125
    assert datasheet_peak("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 there: measured instead
    assert datasheet_peak("AMD EPYC 7B13", "fp32") is None


def test_cpu_peak_is_probed_once_and_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(perf, "_cpu_busy", lambda: False)  # this shared machine's load decides nothing here
    cache = tmp_path / "peak.json"
    first = peak_flops(torch.device("cpu"), "fp32", cache=cache)
    assert first.flops_per_s > 0 and first.source.startswith("measured: fp32 matmul probe")
    table = json.loads(cache.read_text())
    (key,) = table
    assert table[key] == first.flops_per_s
    table[key] = 1234.0  # a second call reads the cache instead of probing again
    cache.write_text(json.dumps(table))
    assert peak_flops(torch.device("cpu"), "fp32", cache=cache).flops_per_s == 1234.0


def test_a_probe_on_a_busy_cpu_is_not_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(perf, "_cpu_busy", lambda: True)
    cache = tmp_path / "peak.json"
    peak = peak_flops(torch.device("cpu"), "fp32", cache=cache)
    assert peak.flops_per_s > 0 and "not cached: the CPU was busy" in peak.source
    assert not cache.exists()


def test_probe_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert measure_matmul_flops(torch.device("cpu"), "fp32", size=64, repeats=1) > 0
    assert torch.equal(torch.rand(3), expected)


def test_mfu_above_one_is_clamped_with_one_warning(monkeypatch, caplog) -> None:
    import dapo.infra.perf as perf

    monkeypatch.setattr(perf, "_warned_mfu_above_one", False)
    peak = perf.PeakFlops(1e9, "fp32", "measured: fake probe")
    with caplog.at_level("WARNING", logger="dapo.infra.perf"):
        assert perf.mfu(5e8, peak) == 0.5  # below the peak: the plain ratio
        assert perf.mfu(2.8e9, peak) == 1.0  # 280 %: clamped
        assert perf.mfu(1.5e9, peak) == 1.0
    warnings = [r for r in caplog.records if "above 100%" in r.getMessage()]
    assert len(warnings) == 1 and "280%" in warnings[0].getMessage() and "fake probe" in warnings[0].getMessage()


def test_probe_keeps_the_fastest_of_its_repeats(monkeypatch) -> None:
    import dapo.infra.perf as perf

    # perf_counter pairs (start, stop) per timed repeat: 0.5 s, 0.1 s (a quiet moment), 0.3 s
    ticks = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])
    monkeypatch.setattr(perf.time, "perf_counter", lambda: next(ticks))
    assert perf.measure_matmul_flops(torch.device("cpu"), "fp32", size=8, repeats=3) == pytest.approx(2 * 8**3 / 0.1)
