"""Throughput of the actor: old-log-prob pass and full update on a randomly initialised Qwen2, packed vs padded.

    python benchmarks/bench_actor.py --hidden 256 --layers 4 --groups 8 --n 8 --max-response 256
    python benchmarks/bench_actor.py --device cuda --dtype bf16 --hidden 1024 --layers 12 --max-response 2048

"padded" is the reference a naive actor would run: one right-padded [B, T_max] forward with full-vocabulary logits.
Response lengths are drawn uniformly from [1, max_response], as RL responses vary widely in length.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dapo.actor import TrainBatch, build_lr_scheduler, build_optimizer, compute_log_probs_batch, update_policy
from dapo.config import ActorConfig, OptimConfig


def make_batch(groups: int, n: int, prompt_len: int, max_response: int, vocab: int, seed: int) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    size = groups * n
    lengths = torch.randint(1, max_response + 1, (size,), generator=g).tolist()
    return TrainBatch(
        prompt_ids=[torch.randint(0, vocab, (prompt_len,), generator=g) for _ in range(size)],
        response_ids=[torch.randint(0, vocab, (length,), generator=g) for length in lengths],
        advantages=torch.randn(size, generator=g),
        sample_mask=torch.ones(size, dtype=torch.bool),
        group_index=torch.arange(groups).repeat_interleave(n),
    )


@torch.no_grad()
def padded_forward(model: Qwen2ForCausalLM, batch: TrainBatch, device: torch.device) -> None:
    rows = [torch.cat([p, r]) for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    logits.float().log_softmax(-1)


def timed(fn: object, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-response", type=int, default=128)
    parser.add_argument("--token-budget", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 128),
        max_position_embeddings=args.prompt_len + args.max_response,
    )
    model = Qwen2ForCausalLM(config).to(device)
    batch = make_batch(args.groups, args.n, args.prompt_len, args.max_response, args.vocab, seed=0)
    cfg = ActorConfig(
        ppo_mini_batch_size=args.groups, ppo_max_token_len_per_gpu=args.token_budget,
        logprob_chunk_size=args.chunk, dtype=args.dtype, optim=OptimConfig(lr=1e-6),
    )
    tokens = sum(batch.sequence_lengths)
    print(f"{len(batch)} samples, {tokens} tokens, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")

    compute_log_probs_batch(model, batch, cfg, 1.0)  # warm-up
    packed = timed(lambda: compute_log_probs_batch(model, batch, cfg, 1.0), device)
    padded = timed(lambda: padded_forward(model, batch, device), device)
    print(f"old log-probs, packed : {packed:7.3f} s  ({tokens / packed:9.0f} tok/s)")
    print(f"old log-probs, padded : {padded:7.3f} s  ({tokens / padded:9.0f} tok/s)")

    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.optim)
    update = timed(lambda: update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0), device)
    print(f"update_policy (1 step): {update:7.3f} s  ({tokens / update:9.0f} tok/s)")
    if device.type == "cuda":
        print(f"peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
