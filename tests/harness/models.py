"""The tiny random-weight Qwen2 of the tests, built from its config class (never downloaded), and the shapes the
suites build it at.

One factory, :func:`tiny_qwen2`; a suite picks a shape (a dict of ``Qwen2Config`` fields) for what it tests and
overrides a field or two where a test needs it. The model families beyond Qwen2 (Llama, Qwen3, Gemma 3, MoE, ...)
are tests/model/families.py's matrix.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

# The engine tests' model (rollout, weight sync): a 64-token vocabulary with EOS 1 and PAD 0, and a wide weight init
# (0.3) so that its next-token distributions are far from uniform and samples differ visibly between settings.
ENGINE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    initializer_range=0.3,
    attention_dropout=0.0,
    eos_token_id=1,
    pad_token_id=0,
)
# The actor tests' model: a 40-token vocabulary (tests.actor.actor_helpers.VOCAB, the random batches' tokens) and
# Transformers' default init, so log-probs are of the size a real model's are.
ACTOR = dict(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
# The checkpoint tests' model: a few thousand parameters, tied embeddings (saved once, loaded into both), and
# attention dropout on so that training draws from the RNG whose state a resume must restore.
CHECKPOINT = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    attention_dropout=0.1,
    tie_word_embeddings=True,
)


def tiny_qwen2(seed: int = 0, shape: Mapping[str, object] = ENGINE, **overrides: object) -> Qwen2ForCausalLM:
    """A Qwen2ForCausalLM of ``shape`` (``Qwen2Config`` fields; ``overrides`` replace some), fp32, in eval mode (as a
    loaded model is; a training test calls ``.train()``), with the same weights for the same ``seed``."""
    config = Qwen2Config(**{**shape, **overrides})
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float().eval()
