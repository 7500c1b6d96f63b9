"""The actor update on a random-weight Qwen3-0.6B at 16K tokens per step, in the field's units (tokens/s, MFU,
s/step), beside prime-rl's committed one-H100 trainer baseline for the same model and length; then the HF engine's
generation tokens/s on the same weights. ``scripts/gpu_check.sh`` runs it on a lent GPU:

    python benchmarks/bench_qwen3_update.py --device cuda --dtype bf16          # 0.6B, 16K tokens a step
    python benchmarks/bench_qwen3_update.py --tiny --device cpu --dtype fp32 --tokens 64 --seq-len 32 \\
        --steps 1 --gen-prompts 2 --gen-tokens 4 --peak-tflops 1                # the CPU smoke run the tests use

The model is ``configs/models/qwen3-0.6b/config.json`` (Qwen3-0.6B's published config; no weights: they are random,
which does not change the work). A step is one dapo ``update_policy`` (one mini-batch, one optimizer step, on-policy:
no old-log-prob pass) over ``--tokens`` tokens in samples of ``--seq-len`` (prompt ``--prompt-len``, the rest
response); MFU counts 3 x the forward FLOPs of the step's tokens (``dapo.infra.perf``: matmuls and causal attention;
activation checkpointing's recomputation not counted, as MFU is defined) against the device's datasheet peak.
``--tiny`` shrinks the config to 2 layers of width 64 (a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "models" / "qwen3-0.6b"
# PrimeIntellect-ai/prime-rl benchmarks/baselines: Qwen3-0.6B, 16K tokens a step, one H100 (their trainer).
PRIME_RL_ONE_H100 = {"tokens_per_s": 11896.0, "mfu": 0.111, "s_per_step": 1.99}
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=1024,
    tie_word_embeddings=True,
)


def build_model(tiny: bool, device: torch.device) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(CONFIG)
    if tiny:
        for key, value in TINY.items():
            setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # fp32 master weights; bf16 autocast
    return model.to(device)


def make_batch(tokens: int, seq_len: int, prompt_len: int, vocab: int):
    """``tokens // seq_len`` samples of ``seq_len`` tokens, each its own group with advantage 1 (every token trains)."""
    from dapo.actor import TrainBatch

    if not 0 < prompt_len < seq_len <= tokens:
        raise SystemExit(f"need 0 < --prompt-len < --seq-len <= --tokens, got {prompt_len}, {seq_len}, {tokens}")
    g = torch.Generator().manual_seed(1)
    n = tokens // seq_len
    return TrainBatch(
        prompt_ids=[torch.randint(0, vocab, (prompt_len,), generator=g) for _ in range(n)],
        response_ids=[torch.randint(0, vocab, (seq_len - prompt_len,), generator=g) for _ in range(n)],
        advantages=torch.ones(n),
        sample_mask=torch.ones(n, dtype=torch.bool),
        group_index=torch.arange(n),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def actor_update(args: argparse.Namespace, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
    from dapo.actor import build_lr_scheduler, build_optimizer, update_policy
    from dapo.config import ActorConfig, OptimConfig
    from dapo.infra.perf import PeakFlops, mfu, peak_flops, sequence_forward_flops

    batch = make_batch(args.tokens, args.seq_len, args.prompt_len, model.config.vocab_size)
    cfg = ActorConfig(
        ppo_mini_batch_size=len(batch),
        ppo_epochs=1,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=args.seq_len,
        layout=args.layout,
        dtype=args.dtype,
        gradient_checkpointing=args.checkpointing,
        logprob_chunk_size=args.logprob_chunk,
    )
    optim = OptimConfig(lr=1e-6, lr_warmup_steps=0)
    optimizer = build_optimizer(model, optim)
    scheduler = build_lr_scheduler(optimizer, optim)
    seconds = []
    for step in range(args.warmup + args.steps):
        synchronize(device)
        start = time.perf_counter()
        update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0, on_policy=True)
        synchronize(device)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
    s_per_step = statistics.median(seconds)
    tokens = sum(batch.sequence_lengths)
    flops = 3 * sum(sequence_forward_flops(model.config, n) for n in batch.sequence_lengths)
    peak = (
        PeakFlops(args.peak_tflops * 1e12, args.dtype, "given: --peak-tflops")
        if args.peak_tflops
        else peak_flops(device, args.dtype)
    )
    return {
        "tokens_per_step": float(tokens),
        "s_per_step": s_per_step,
        "tokens_per_s": tokens / s_per_step,
        "mfu": mfu(flops / s_per_step, peak),
        "peak_source": peak.source,  # type: ignore[dict-item]
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0,
    }


def generation(args: argparse.Namespace, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
    """The HF engine's sampled tokens per second on the same weights, at the update's precision."""
    from dapo.rollout.base import SamplingParams
    from dapo.rollout.hf_engine import HFRolloutEngine

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    engine_model = copy.deepcopy(model).to(dtype).eval()
    engine = HFRolloutEngine(engine_model, eos_token_ids=[model.config.eos_token_id or 0], pad_token_id=0)
    g = torch.Generator().manual_seed(2)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.gen_prompts)]
    # no stop token: every row runs its max_tokens (random weights would stop at random)
    params = SamplingParams(n=args.gen_n, max_tokens=args.gen_tokens, temperature=1.0, seed=3)
    synchronize(device)
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    synchronize(device)
    seconds = time.perf_counter() - start
    generated = sum(len(r) for r in out.response_ids)
    return {"generated_tokens": float(generated), "seconds": seconds, "tokens_per_s": generated / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per step (prime-rl's baseline: 16K)")
    parser.add_argument("--seq-len", type=int, default=16384, help="tokens per sample")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--layout", default="auto", help="actor.layout")
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--logprob-chunk", type=int, default=2048, help="actor.logprob_chunk_size")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--gen-prompts", type=int, default=64)
    parser.add_argument("--gen-n", type=int, default=1)
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak instead of dapo's")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer width-64 Qwen3 (a smoke run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model = build_model(args.tiny, device)
    name = "tiny Qwen3 (--tiny)" if args.tiny else "Qwen3-0.6B (random weights)"
    print(f"model: {name}, {sum(p.numel() for p in model.parameters()):,} parameters, {args.dtype}, {device}")
    update = actor_update(args, model, device)
    base = PRIME_RL_ONE_H100
    print(
        f"actor update: {update['tokens_per_step']:.0f} tokens/step, {update['s_per_step']:.3f} s/step, "
        f"{update['tokens_per_s']:,.0f} tokens/s, MFU {100 * update['mfu']:.1f} % ({update['peak_source']}), "
        f"peak memory {update['peak_memory_gb']:.1f} GiB"
    )
    print(
        f"prime-rl one-H100 baseline (same model, 16K tokens/step): {base['s_per_step']:.2f} s/step, "
        f"{base['tokens_per_s']:,.0f} tokens/s, MFU {100 * base['mfu']:.1f} %"
    )
    gen = generation(args, model, device)
    print(
        f"HF engine generation: {gen['generated_tokens']:.0f} tokens in {gen['seconds']:.2f} s, "
        f"{gen['tokens_per_s']:,.0f} tokens/s ({args.gen_prompts} prompts x {args.gen_n}, {args.gen_tokens} tokens)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
