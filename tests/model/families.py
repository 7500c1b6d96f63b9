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
The measurements below (the HF engine's greedy check and gaps, LoRA's targets, vLLM's greedy check and gap, R3's
agreement and gaps) are shared by tests/model/test_family_matrix.py, tests/model/test_router_replay.py and
scripts/model_matrix.py (which records them for docs/models.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

TINY_VOCAB = 601  # the embedded tiny-qwen2 tokenizer's vocabulary
_COMMON: dict[str, object] = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    initializer_range=0.2,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=0,
)
_MOE: dict[str, object] = dict(num_experts=4, num_experts_per_tok=2)


@dataclass(frozen=True)
class TinyFamily:
    """One model family: the Transformers config class that builds it and what it tests.

    ``cache_kinds``: the KV-cache layer kinds its decoder uses (``full``, ``sliding``, ``linear``, ``mla``), for the
    support table. ``moe``: it routes tokens to experts.
    """

    name: str
    config_class: str
    kwargs: dict[str, object]
    cache_kinds: tuple[str, ...]
    moe: bool = False

    def config(self) -> object:
        import transformers

        cls = getattr(transformers, self.config_class)
        return cls(**{**_COMMON, **self.kwargs})


FAMILIES: dict[str, TinyFamily] = {
    f.name: f
    for f in (
        TinyFamily(
            "llama3",
            "LlamaConfig",
            dict(
                intermediate_size=128,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
            ("full",),
        ),
        TinyFamily("qwen2", "Qwen2Config", dict(intermediate_size=128), ("full",)),
        TinyFamily("qwen3", "Qwen3Config", dict(intermediate_size=128, head_dim=16), ("full",)),
        TinyFamily(
            "qwen3_moe",
            "Qwen3MoeConfig",
            dict(intermediate_size=128, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True, **_MOE),
            ("full",),
            moe=True,
        ),
        TinyFamily(
            "qwen3_5",
            "Qwen3_5TextConfig",
            dict(
                intermediate_size=128,
                head_dim=16,
                layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
            ),
            ("linear", "full"),
        ),
        TinyFamily(
            "qwen3_5_moe",
            "Qwen3_5MoeTextConfig",
            dict(
                head_dim=16,
                layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
                **_MOE,
            ),
            ("linear", "full"),
            moe=True,
        ),
        TinyFamily(
            "gemma3",
            "Gemma3TextConfig",
            dict(
                intermediate_size=128,
                head_dim=16,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=4,
                query_pre_attn_scalar=16,
            ),
            ("sliding", "full"),
        ),
        TinyFamily(
            "gpt_oss",
            "GptOssConfig",
            dict(
                intermediate_size=32,
                head_dim=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=4,
            ),
            ("sliding", "full"),
            moe=True,
        ),
        TinyFamily(
            "deepseek_v3",
            "DeepseekV3Config",
            dict(
                intermediate_size=128,
                moe_intermediate_size=32,
                num_key_value_heads=4,
                n_routed_experts=4,
                num_experts_per_tok=2,
                n_shared_experts=1,
                n_group=1,
                topk_group=1,
                first_k_dense_replace=1,
                kv_lora_rank=16,
                q_lora_rank=None,
                qk_rope_head_dim=4,
                qk_nope_head_dim=8,
                v_head_dim=8,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
            ("mla",),
            moe=True,
        ),
    )
}


def build_tiny_model(
    family: str, seed: int = 0, *, attn_implementation: str | None = None, **overrides: object
) -> torch.nn.Module:
    """The family's tiny causal LM with random weights (fp32, eval mode), the same for the same ``seed``; attention
    is what Transformers picks for it when ``attn_implementation`` is None (sdpa, or eager where sdpa is not
    supported), as when ``dapo`` loads it from a folder. ``overrides`` replace config fields."""
    from transformers import AutoModelForCausalLM

    if family not in FAMILIES:
        raise KeyError(f"no tiny family {family!r}; known: {', '.join(FAMILIES)}")
    config = FAMILIES[family].config()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    return model.eval()


def save_tiny_model(
    family: str, folder: Path, seed: int = 0, *, eos_token_ids: Sequence[int] = (2,), **overrides: object
) -> Path:
    """Write the family's tiny model with the embedded model's tokenizer as a Hugging Face folder that
    ``model.path`` loads; returns the folder. ``eos_token_ids`` go to its generation config: a random model almost
    never samples the one EOS, and a training test needs responses of different lengths (different rewards)."""
    from transformers import AutoTokenizer, GenerationConfig

    from dapo.model.loading import EMBEDDED_MODEL_DIR

    folder.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(family, seed, **overrides)
    model.generation_config = GenerationConfig(eos_token_id=list(eos_token_ids), pad_token_id=0, bos_token_id=0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL_DIR)).save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------------ measurements
# The engine-vs-actor tolerance: both run fp32 on the same weights; what differs is the order of the sums (a KV
# cache and one query per step against one teacher-forced pass; Gated DeltaNet's recurrent step against its chunked
# form). Measured at most 1.7e-5 nats on every family (docs/models.md); 1e-4 leaves room for another BLAS.
GAP_TOLERANCE = 1e-4
PROMPT_LENGTHS = (11, 5, 8)  # longer than the sliding window (4) and of different lengths (left padding)
SAMPLES, MAX_TOKENS = 3, 10
# About one token in six ends a response, so the rows of a call stop at different steps and leave the batch (the
# engine drops finished rows from every cache layer); the same set for every family.
STOP_IDS = tuple(range(3, TINY_VOCAB, 6))


def prompts(seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY_VOCAB, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def engine_for(model: torch.nn.Module):
    from dapo.rollout.hf_engine import HFRolloutEngine

    return HFRolloutEngine(model, eos_token_ids=[2], pad_token_id=0)


def generate_reference(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    """``model.generate``'s greedy answer to ``prompt`` alone, cut after the first EOS (2) as the engines cut."""
    with torch.no_grad():
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=0
        )[0, len(prompt) :].tolist()
    if ids[-1:] != [2] and 2 in ids:
        ids = ids[: ids.index(2) + 1]
    return ids


def greedy_mismatches(model: torch.nn.Module, engine=None) -> list[int]:
    """The prompts whose greedy answer of ``engine`` (default the HF engine over ``model``; a left-padded batch, two
    samples each: the shared-prompt fan-out) differs from ``model.generate``'s on the prompt alone; empty when all
    agree."""
    from dapo.rollout.base import SamplingParams

    batch = prompts(1)
    engine = engine_for(model) if engine is None else engine
    out = engine.generate(batch, SamplingParams(n=2, max_tokens=MAX_TOKENS, temperature=0.0))
    wrong = []
    for index, prompt in enumerate(batch):
        ids = generate_reference(model, prompt)
        if any(out.response_ids[2 * index + j] != ids for j in range(2)):
            wrong.append(index)
    return wrong


def sampled_batch(model: torch.nn.Module, engine=None):
    """The samples of :func:`prompts` (n = 3, temperature 1, many stop ids) by ``engine`` (default the HF engine over
    ``model``) as a ``TrainBatch``, and the log-probs the engine reported for them; the batch carries the routes the
    engine recorded, inside :func:`dapo.model.router_replay.router_replay` with ``rollout_routes``."""
    from dapo.actor.batch import TrainBatch
    from dapo.rollout.base import SamplingParams

    batch = prompts(0)
    params = SamplingParams(
        n=SAMPLES,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        stop_token_ids=list(STOP_IDS),
        prompt_seeds=[11, 12, 13],
        seed=11,  # vLLM's engine draws from one seed per call (it ignores prompt_seeds)
    )
    out = (engine_for(model) if engine is None else engine).generate(batch, params)
    count = len(out.response_ids)
    train = TrainBatch(
        prompt_ids=[torch.tensor(batch[i]) for i in out.prompt_index],
        response_ids=[torch.tensor(r) for r in out.response_ids],
        advantages=torch.zeros(count),
        sample_mask=torch.ones(count, dtype=torch.bool),
        group_index=torch.tensor(out.prompt_index),
        routed_experts=out.routed_experts,
    )
    return train, out.logprobs


def engine_actor_gap(model: torch.nn.Module, layout: str, batch=None, engine_logprobs=None) -> float:
    """Largest |engine log-prob - actor log-prob| over every sampled token, the actor in ``layout`` (fp32, temperature
    1). Raises ``ValueError`` (naming why) where :func:`dapo.actor.log_probs.resolve_layout` refuses the layout."""
    from dapo.actor.log_probs import compute_response_log_probs, resolve_layout

    resolve_layout(layout, model)
    if batch is None:
        batch, engine_logprobs = sampled_batch(model)
    with torch.no_grad():
        actor, _ = compute_response_log_probs(
            model, batch, temperature=1.0, chunk_size=64, with_entropy=False, layout=layout
        )
    return max(float((a - torch.tensor(e)).abs().max()) for a, e in zip(actor, engine_logprobs, strict=True))


def lora_targets(model: torch.nn.Module) -> dict[str, list[str]]:
    """What ``model.target_modules=all-linear`` adapts, per decoder layer: the names of its LoRA-wrapped modules."""
    from peft.tuners.lora import LoraLayer

    from dapo.config import build_config
    from dapo.model.lora import apply_lora

    cfg = build_config({}, ["model.lora_rank=4"]).model
    peft_model = apply_lora(model, cfg)
    per_layer: dict[str, list[str]] = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and ".layers." in name:
            layer, _, rest = name.partition(".layers.")[2].partition(".")
            per_layer.setdefault(layer, []).append(rest)
    return per_layer


# vLLM's CPU attention has no head size 16 (its smallest is 32): the vLLM measurements build each family at head
# size 32, in both engines (head_dim 32 with hidden 64: the q/o projections widen; vLLM's Qwen2 reads no head_dim,
# so that one is twice as wide). DeepSeek-V3: its published config says topk_method "noaux_tc", without which vLLM
# builds no score-correction bias to load (Transformers always has one).
VLLM_OVERRIDES: dict[str, dict[str, object]] = {
    "qwen2": {"hidden_size": 128},
    "deepseek_v3": {
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "head_dim": 64,
        "qk_head_dim": 72,
    },
}


def vllm_measurements(family: str, folder: Path) -> dict:
    """vLLM against the actor on the family's tiny model (at :data:`VLLM_OVERRIDES`): whether vLLM's greedy answers
    equal ``model.generate``'s, and the largest gap between the log-probs vLLM reports for its samples and the
    actor's (padded layout, fp32). vLLM failing to load or run the family raises, with vLLM's own message."""
    from dapo.rollout.spec import EngineSpec, VLLMOptions
    from dapo.rollout.vllm_engine import VLLMRolloutEngine

    overrides = VLLM_OVERRIDES.get(family, {"head_dim": 32})
    model = build_tiny_model(family, **overrides)
    save_tiny_model(family, folder, **overrides)
    spec = EngineSpec(
        name="vllm", dtype="float32", seed=0, max_model_len=64, vllm=VLLMOptions(cpu_kvcache_space_gb=0.25)
    )
    engine = VLLMRolloutEngine(folder, spec, eos_token_ids=[2])
    try:
        greedy = greedy_mismatches(model, engine) == []
        batch, engine_logprobs = sampled_batch(model, engine)
    finally:
        engine.close()
    gap = engine_actor_gap(model, "padded", batch, engine_logprobs)
    return {"greedy_equals_generate": greedy, "gap": gap, "sampled_tokens": sum(len(r) for r in batch.response_ids)}


def r3_measurements(model: torch.nn.Module) -> dict:
    """R3 with the HF engine on a MoE family: the fraction of token x layer top-k sets the actor's live router chose
    as the engine recorded (padded layout), and the largest engine-actor log-prob gap with the rollout's routes
    replayed and with the actor routing live."""
    from dapo.model.router_replay import router_replay

    with router_replay(model, rollout_routes=True) as tape:
        batch, engine_logprobs = sampled_batch(model)
        replayed = engine_actor_gap(model, "padded", batch, engine_logprobs)
        agreement = tape.agreement()
    live = engine_actor_gap(model, "padded", batch.with_routed_experts(None), engine_logprobs)
    return {"routing_agreement": agreement, "gap_replayed": replayed, "gap_live": live}
