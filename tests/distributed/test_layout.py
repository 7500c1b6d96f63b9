"""The step layout of `dapo explain` (dapo.distributed.layout): hand-computed numbers and every refusal, named."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from dapo.config import load_config
from dapo.distributed.layout import (
    KNOWN_MODELS,
    Assumptions,
    LayoutError,
    ModelShape,
    check_layout,
    compute_layout,
    known_model_shape,
)

REPO = Path(__file__).resolve().parents[2]
FULL = REPO / "configs" / "dapo_qwen2.5_32b.yaml"
EARLY = REPO / "configs" / "dapo_early_qwen2.5_32b.yaml"
SEVEN_B = REPO / "configs" / "dapo_qwen2.5_math_7b.yaml"
Q32 = KNOWN_MODELS["qwen2.5-32b"]
Q7 = KNOWN_MODELS["qwen2.5-math-7b"]


# ---- model sizes from config.json values ------------------------------------------------------------------------------
def test_qwen25_32b_parameter_count_by_hand():
    # per layer: q 5120*5120 + 5120, k and v 5120*1024 + 1024 each, o 5120*5120, MLP 3*5120*27648, norms 2*5120
    layer = (5120 * 5120 + 5120) + 2 * (5120 * 1024 + 1024) + 5120 * 5120 + 3 * 5120 * 27648 + 2 * 5120
    assert Q32.layer_parameters == layer == 487_605_248
    total = 64 * layer + 2 * 152064 * 5120 + 5120  # untied embedding and LM head, final norm
    assert Q32.num_parameters == total == 32_763_876_352
    assert abs(Q32.num_parameters - 32.8e9) / 32.8e9 < 0.02


def test_other_known_models_by_hand():
    assert Q7.num_parameters == 28 * 233_057_792 + 2 * 152064 * 3584 + 3584 == 7_615_616_512  # "7.61B"
    assert KNOWN_MODELS["qwen2.5-7b"].num_parameters == Q7.num_parameters
    smol = KNOWN_MODELS["smollm2-135m"]  # Llama: no q/k/v biases, tied head
    assert smol.num_parameters == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576) + 49152 * 576 + 576
    assert smol.num_parameters == 134_515_008


def test_tiny_model_table_entry_is_the_embedded_config_and_counts_its_weights():
    asset = REPO / "src" / "dapo" / "assets" / "tiny-qwen2"
    from_file = ModelShape.from_hf_config(
        json.loads((asset / "config.json").read_text()),
        name="tiny-qwen2 (embedded)",
        source=KNOWN_MODELS["tiny-qwen2"].source,
    )
    assert from_file == KNOWN_MODELS["tiny-qwen2"]
    raw = (asset / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    stored = sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    assert from_file.num_parameters == stored


@pytest.mark.parametrize(
    "name,key",
    [
        ("Qwen/Qwen2.5-32B", "qwen2.5-32b"),
        ("Qwen/Qwen2.5-32B-Instruct", "qwen2.5-32b"),
        ("/models/Qwen2.5-Math-7B/", "qwen2.5-math-7b"),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"),
    ],
)
def test_known_model_lookup(name, key):
    assert known_model_shape(name) is KNOWN_MODELS[key]


def test_unknown_model_is_none():
    assert known_model_shape("meta-llama/Llama-3.1-8B") is None


# ---- the paper's recipes ----------------------------------------------------------------------------------------------
def test_full_recipe_on_128_gpus_by_hand():
    lo = compute_layout(load_config(FULL), Q32, nnodes=16, nproc_per_node=8)
    assert lo.world_size == 128 and lo.optimizer_steps == 16  # 512 / 32
    assert (lo.prompts_per_step, lo.prompts_per_step * lo.n, lo.gen_batch_size) == (512, 8192, 1536)
    assert lo.expected_rounds == 1 and lo.max_num_gen_batches == 10  # ceil(512 / (1536 * 0.5))
    assert lo.min_fraction_one_round == pytest.approx(1 / 3) and lo.min_fraction_all_rounds == pytest.approx(1 / 30)
    assert lo.expected_generated_tokens == 1536 * 16 * 10240  # mean response = 20480 / 2
    assert (lo.rollout_engines, lo.prompts_per_engine_round) == (32, 48)  # TP 4
    assert lo.samples_per_rank_mini_batch == 4  # 32 * 16 / 128
    assert (lo.expected_micro_batches, lo.max_micro_batches, lo.token_bound) == (2, 4, 22528)
    mem = lo.memory
    assert mem.sharded_state_bytes == 16 * 32_763_876_352 // 128
    assert mem.unsharded_state_bytes == 16 * 32_763_876_352
    per_layer = 2 * (4 * 5120 + 3 * 5120 + 3 * 1024 + 4 * 27648)
    assert mem.act_no_ckpt_bytes == 64 * 22528 * per_layer
    assert mem.act_ckpt_bytes == 64 * 22528 * 5120 * 2 + 22528 * per_layer
    assert mem.logits_chunk_bytes == 1024 * 152064 * 14
    assert mem.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 // 4
    assert mem.vllm_weight_bytes == 32_763_876_352 * 2 // 4
    assert mem.kv_sequences == 768 and mem.kv_bytes == 768 * 22528 * 65536
    assert mem.actor_peak_bytes < mem.gpu_bytes and mem.kv_room_tokens > 22528
    # the only warning: 32 whole groups cannot feed 128 ranks with today's whole-group sharing
    assert len(lo.warnings) == 1 and "whole groups" in lo.warnings[0]


def test_early_recipe_one_round_no_dynamic_sampling():
    cfg = load_config(EARLY)
    assert cfg.actor.loss_agg_mode == "seq-mean-token-mean" and not cfg.algorithm.filter_groups.enable
    lo = compute_layout(cfg, Q32, nnodes=16, nproc_per_node=8)
    assert (lo.expected_rounds, lo.optimizer_steps, lo.gen_batch_size) == (1, 16, 512)


def test_7b_recipe_on_8_gpus_by_hand():
    lo = compute_layout(load_config(SEVEN_B), Q7, nnodes=1, nproc_per_node=8)
    assert lo.optimizer_steps == 16 and lo.rollout_engines == 8 and lo.prompts_per_engine_round == 192
    assert lo.samples_per_rank_mini_batch == 64  # 32 * 16 / 8
    assert (lo.expected_micro_batches, lo.max_micro_batches, lo.token_bound) == (32, 64, 4096)
    assert lo.memory.sharded_state_bytes == 16 * 7_615_616_512 // 8
    assert lo.memory.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert lo.warnings == []


def test_7b_recipe_on_one_gpu_warns_that_the_actor_does_not_fit():
    lo = compute_layout(load_config(SEVEN_B), Q7)
    assert lo.memory.actor_peak_bytes > 80 * 1024**3
    assert any("--gpu-memory-gib" in w for w in lo.warnings)


def test_assumptions_move_the_rounds_and_tokens():
    cfg = load_config(FULL)
    lo = compute_layout(
        cfg,
        Q32,
        nnodes=16,
        nproc_per_node=8,
        assumptions=Assumptions(informative_fraction=0.1, mean_response_tokens=4000),
    )
    assert lo.expected_rounds == 4  # ceil(512 / 153.6)
    assert lo.expected_generated_tokens == 4 * 1536 * 16 * 4000
    starved = compute_layout(cfg, Q32, nnodes=16, nproc_per_node=8, assumptions=Assumptions(informative_fraction=0.02))
    assert starved.expected_rounds == 10 and starved.rounds_needed == 17
    assert any("max_num_gen_batches" in w for w in starved.warnings)


def test_no_model_still_lays_out_the_step():
    lo = compute_layout(load_config(FULL), None, nnodes=16, nproc_per_node=8)
    assert lo.memory is None and lo.optimizer_steps == 16


# ---- refusals, each naming its keys -----------------------------------------------------------------------------------
def _errors(path: Path, overrides: list[str], world: int) -> list[str]:
    return check_layout(load_config(path, overrides), world)[0]


def test_batch_not_divisible_by_data_parallel_size():
    errors = _errors(SEVEN_B, [], 6)
    assert any(
        e.startswith("data.train_batch_size (512) must be divisible by the data-parallel size (6") for e in errors
    )


def test_tensor_parallel_must_divide_the_world():
    errors = _errors(FULL, [], 6)
    assert any(e.startswith("rollout.tensor_model_parallel_size (4) must divide the world size (6") for e in errors)


def test_gen_batch_not_divisible_by_engines():
    errors = _errors(SEVEN_B, ["data.gen_batch_size=1540"], 8)
    assert errors == [next(e for e in errors if e.startswith("data.gen_batch_size (1540)"))]


def test_mini_batch_larger_than_batch():
    cfg = load_config(SEVEN_B)
    cfg.actor.ppo_mini_batch_size = 1024  # the section accepts it; only the cross-section check would not
    errors = check_layout(cfg, 8)[0]
    assert any("actor.ppo_mini_batch_size (1024) is larger than data.train_batch_size (512)" in e for e in errors)


def test_mini_batch_not_dividing_batch():
    cfg = load_config(SEVEN_B)
    cfg.actor.ppo_mini_batch_size = 48
    assert any(
        "actor.ppo_mini_batch_size (48) must divide data.train_batch_size (512)" in e for e in check_layout(cfg, 8)[0]
    )


def test_mini_batch_samples_not_divisible_by_ranks():
    errors = _errors(SEVEN_B, ["rollout.n=3"], 64)
    assert errors == [
        "a mini-batch's samples (actor.ppo_mini_batch_size 32 x rollout.n 3 = 96) must be divisible by "
        "the number of ranks (64)"
    ]


def test_fixed_micro_batch_must_divide_the_rank_share():
    errors = _errors(SEVEN_B, ["actor.use_dynamic_bsz=false", "actor.ppo_micro_batch_size_per_gpu=5"], 8)
    assert any(e.startswith("actor.ppo_micro_batch_size_per_gpu (5) must divide") for e in errors)


def test_overlong_buffer_not_below_max_response():
    errors = _errors(SEVEN_B, ["reward_model.overlong_buffer.len=2048"], 8)
    assert any(
        e.startswith(
            "reward_model.overlong_buffer.len (L_cache = 2048) must be below data.max_response_length (L_max = 2048)"
        )
        for e in errors
    )


def test_max_model_len_below_prompt_plus_response():
    errors = _errors(SEVEN_B, ["rollout.max_model_len=3000"], 8)
    assert any(e.startswith("rollout.max_model_len (3000)") for e in errors)


def test_generation_rounds_can_never_fill_the_batch():
    errors = _errors(SEVEN_B, ["data.gen_batch_size=32", "algorithm.filter_groups.max_num_gen_batches=2"], 8)
    assert any(
        "algorithm.filter_groups.max_num_gen_batches" in e and "data.train_batch_size (512)" in e for e in errors
    )
    errors, warnings = check_layout(
        load_config(
            SEVEN_B,
            [
                "data.gen_batch_size=32",
                "algorithm.filter_groups.max_num_gen_batches=2",
                "algorithm.filter_groups.on_exhausted=train_on_partial",
            ],
        ),
        8,
    )
    assert errors == [] and any("train_on_partial" in w for w in warnings)


def test_token_budget_below_a_full_sample_is_a_warning():
    errors, warnings = check_layout(load_config(SEVEN_B, ["actor.ppo_max_token_len_per_gpu=3000"]), 8)
    assert errors == []
    assert any(
        w.startswith(
            "actor.ppo_max_token_len_per_gpu (3000) is smaller than data.max_prompt_length + "
            "data.max_response_length (4096)"
        )
        for w in warnings
    )
    lo = compute_layout(load_config(SEVEN_B, ["actor.ppo_max_token_len_per_gpu=3000"]), Q7, nnodes=1, nproc_per_node=8)
    assert lo.token_bound == 4096 and lo.max_micro_batches == 64


def test_compute_layout_raises_all_problems_at_once():
    with pytest.raises(LayoutError) as err:
        compute_layout(load_config(FULL, ["reward_model.overlong_buffer.len=20480"]), Q32, nnodes=1, nproc_per_node=6)
    keys = " ".join(err.value.problems)
    assert "rollout.tensor_model_parallel_size" in keys and "reward_model.overlong_buffer.len" in keys
