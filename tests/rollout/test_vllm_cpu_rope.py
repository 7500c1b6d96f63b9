"""dapo.rollout.vllm_cpu_rope: vLLM's CPU rotary kernel given [tokens, heads, head_size] tensors, as MLA hands them.

The kernel's own mistake is shown first (position 0, where every rotation is the identity, comes out changed), then
that the wrapped ``forward_cpu`` computes what vLLM's ``forward_native`` does on every layout a caller passes: flat,
by heads, and the strided ``q[..., nope:]`` view of multi-head latent attention, written back in place. The
end-to-end effect (the tiny DeepSeek-V3 under vLLM equal to Transformers) is in tests/model/test_family_matrix.py.
Skipped, naming why, without vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dapo.rollout.vllm_engine import _uses_latent_attention, vllm_available

TOKENS, HEADS, NOPE, ROPE = 6, 4, 8, 64  # the tiny DeepSeek-V3 at vLLM's sizes (tests/model/families.py)


@pytest.fixture(scope="module")
def rope_class():
    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from dapo.rollout.vllm_cpu_rope import flatten_heads_for_cpu_rotary_embedding

    flatten_heads_for_cpu_rotary_embedding()
    return RotaryEmbedding


def _rope(rope_class, is_neox: bool):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        return rope_class(ROPE, ROPE, 512, 10000.0, is_neox, torch.float32)


def test_the_cpu_kernel_reads_a_query_by_heads_with_one_head_per_token(rope_class) -> None:
    """Why the wrapper exists, hand-computed: one rotary pair (head size 2), the unit vector (1, 0) in every head of
    3 tokens, position t rotating by angle t / 2. Flat, the kernel rotates every head of token t by t / 2; by heads,
    vllm-cpu 0.32's kernel rotates head t of token 0 by t / 2 and leaves the rest. (A later vLLM that computes both
    alike is left alone by flatten_heads_for_cpu_rotary_embedding, and this test says so.)"""
    from vllm import _custom_ops as ops

    from dapo.rollout.vllm_cpu_rope import kernel_mishandles_heads

    if not kernel_mishandles_heads():
        pytest.skip("this vLLM's CPU rotary kernel rotates [tokens, heads, head_size] as it does flat tensors")
    tokens, heads = 3, 4
    angle = torch.arange(8) / 2
    cache = torch.stack([angle.cos(), angle.sin()], dim=-1)  # [position, cos | sin]
    unit = torch.zeros(tokens, heads, 2)
    unit[..., 0] = 1.0

    def angles(query: torch.Tensor) -> torch.Tensor:
        query = query.view(tokens, heads, 2)
        return torch.atan2(query[..., 1], query[..., 0])

    flat, key = unit.reshape(tokens, -1).clone(), torch.zeros(tokens, 2)
    ops.rotary_embedding(torch.arange(tokens), flat, key, 2, cache, False)
    torch.testing.assert_close(angles(flat), (torch.arange(tokens) / 2)[:, None].expand(tokens, heads))
    by_heads = unit.clone()
    ops.rotary_embedding(torch.arange(tokens), by_heads, torch.zeros(tokens, 1, 2), 2, cache, False)
    wrong = torch.zeros(tokens, heads)
    wrong[0, :tokens] = torch.arange(tokens) / 2
    torch.testing.assert_close(angles(by_heads), wrong)


@pytest.mark.parametrize("is_neox", [False, True], ids=["gpt-j", "neox"])
def test_forward_cpu_equals_forward_native_on_every_layout(rope_class, is_neox: bool) -> None:
    rope = _rope(rope_class, is_neox)
    torch.manual_seed(0)
    positions = torch.arange(TOKENS)
    heads = torch.randn(TOKENS, HEADS, ROPE)
    key = torch.randn(TOKENS, 1, ROPE)
    want_q, want_k = rope.forward_native(positions, heads.clone(), key.clone())

    # flat: passed through to the kernel as vLLM's other models call it, in place
    flat_q, flat_k = heads.reshape(TOKENS, -1).clone(), key.reshape(TOKENS, -1).clone()
    out_q, out_k = rope.forward_cpu(positions, flat_q, flat_k)
    assert out_q is flat_q and out_k is flat_k
    torch.testing.assert_close(flat_q.view(TOKENS, HEADS, ROPE), want_q, rtol=0, atol=1e-5)

    # by heads, contiguous: rotated through a flat view of the same storage
    by_heads_q, by_heads_k = heads.clone(), key.clone()
    out_q, out_k = rope.forward_cpu(positions, by_heads_q, by_heads_k)
    assert out_q is by_heads_q and out_k is by_heads_k
    torch.testing.assert_close(by_heads_q, want_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(by_heads_k, want_k, rtol=0, atol=1e-5)

    # MLA's query: the rope part of [tokens, heads, nope + rope], a strided view; the nope part is left as it was
    full = torch.cat([torch.randn(TOKENS, HEADS, NOPE), heads], dim=-1)
    before = full.clone()
    view, mla_k = full[..., NOPE:], key.clone()
    assert not view.is_contiguous()
    out_q, out_k = rope.forward_cpu(positions, view, mla_k)
    torch.testing.assert_close(full[..., NOPE:], want_q, rtol=0, atol=1e-5)  # written back into the caller's tensor
    torch.testing.assert_close(out_q, want_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(mla_k, want_k, rtol=0, atol=1e-5)
    assert torch.equal(full[..., :NOPE], before[..., :NOPE])


def test_the_fix_is_applied_once(rope_class) -> None:
    from dapo.rollout.vllm_cpu_rope import flatten_heads_for_cpu_rotary_embedding, kernel_mishandles_heads

    wrapped = rope_class.forward_cpu
    assert flatten_heads_for_cpu_rotary_embedding() == kernel_mishandles_heads()
    assert rope_class.forward_cpu is wrapped  # not wrapped twice


def test_latent_attention_is_read_from_the_config(tmp_path: Path) -> None:
    def folder(name: str, config: dict) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return tmp_path / name

    assert _uses_latent_attention(folder("mla", {"model_type": "deepseek_v3", "kv_lora_rank": 512}))
    assert not _uses_latent_attention(folder("q_lora_only", {"model_type": "deepseek_v3", "kv_lora_rank": None}))
    assert not _uses_latent_attention(folder("gqa", {"model_type": "qwen3", "num_key_value_heads": 2}))
    assert _uses_latent_attention(folder("vl", {"model_type": "kimi_vl", "text_config": {"kv_lora_rank": 512}}))
    assert not _uses_latent_attention(tmp_path / "missing")  # vLLM names what is wrong with the folder
