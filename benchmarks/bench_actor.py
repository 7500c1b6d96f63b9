"""The actor's two micro-batch layouts side by side: old-log-prob pass and full update, packed vs padded.

    python benchmarks/bench_actor.py                                   # the default job's shape on the tiny model
    python benchmarks/bench_actor.py --profile                         # plus the top operators of each layout
    python benchmarks/bench_actor.py --hidden 576 --layers 30 --vocab 49152 --groups 8 --n 8   # SmolLM2-135M's shape
    python benchmarks/bench_actor.py --device cuda --dtype bf16 --hidden 1024 --layers 12 --max-response 2048

The model is the embedded tiny Qwen2 unless a shape is given (then a randomly initialised Qwen2 of that shape). The
batch has the default job's shape: ``groups x n`` samples, prompts of ``--prompt-len`` tokens, response lengths drawn
uniformly from [1, max_response]. Both layouts run the same batch with the same token budget, interleaved over
``--reps`` repetitions (medians reported); each update starts from the same weights and optimizer state. ``packed``
is one padding-free row per micro-batch (attention over a block-diagonal mask unless flash-attention's varlen kernels
run); ``padded`` is a right-padded row per sample in length-sorted micro-batches (what ``actor.layout=auto`` picks
without flash-attention).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dapo.actor import TrainBatch, build_lr_scheduler, build_optimizer, compute_log_probs_batch, update_policy
from dapo.config import ActorConfig, ModelConfig, OptimConfig
from dapo.model.loading import load_policy


def make_batch(groups: int, n: int, prompt_len: int, max_response: int, vocab: int, seed: int) -> TrainBatch:
    """``groups`` prompts of ``prompt_len`` +- 20% tokens, each with ``n`` responses of uniform length in
    [1, max_response]: the samples of a group share their prompt, as in every RL batch."""
    g = torch.Generator().manual_seed(seed)
    size = groups * n
    lengths = torch.randint(1, max_response + 1, (size,), generator=g).tolist()
    low, high = max(1, round(prompt_len * 0.8)), max(1, round(prompt_len * 1.2))
    prompts = [
        torch.randint(0, vocab, (int(torch.randint(low, high + 1, (), generator=g)),), generator=g)
        for _ in range(groups)
    ]
    return TrainBatch(
        prompt_ids=[prompts[i // n] for i in range(size)],
        response_ids=[torch.randint(0, vocab, (length,), generator=g) for length in lengths],
        advantages=torch.randn(size, generator=g),
        sample_mask=torch.ones(size, dtype=torch.bool),
        group_index=torch.arange(groups).repeat_interleave(n),
    )


def timed(fn: object, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    if args.model is not None:
        return load_policy(ModelConfig(path=args.model)).model
    if args.hidden is None:
        return load_policy(ModelConfig()).model
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or 4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 192),
        max_position_embeddings=args.prompt_len + args.max_response,
    )
    return Qwen2ForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a Hugging Face model folder (default: the tiny model)")
    parser.add_argument("--layouts", default="packed,padded,shared_prompt", help="comma-separated actor.layout values")
    parser.add_argument("--hidden", type=int, default=None, help="random Qwen2 of this width (default: tiny model)")
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=45)
    parser.add_argument("--max-response", type=int, default=64)
    parser.add_argument("--mini-batch", type=int, default=8, help="prompt groups per optimizer step")
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print the top operators of one update per layout")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    base_model = build_model(args).to(device)
    vocab = base_model.get_input_embeddings().num_embeddings
    batch = make_batch(args.groups, args.n, args.prompt_len, args.max_response, vocab, seed=0)
    tokens = sum(batch.sequence_lengths)
    params = sum(p.numel() for p in base_model.parameters()) / 1e6
    print(
        f"{len(batch)} samples, {tokens} tokens, {params:.1f}M params, budget {args.token_budget} tokens, "
        f"{torch.get_num_threads()} threads"
    )

    def config(layout: str) -> ActorConfig:
        return ActorConfig(
            layout=layout,
            ppo_mini_batch_size=args.mini_batch,
            ppo_max_token_len_per_gpu=args.token_budget,
            logprob_chunk_size=args.chunk,
            dtype=args.dtype,
            optim=OptimConfig(lr=1e-6),
        )

    layouts = tuple(args.layouts.split(","))
    seconds: dict[tuple[str, str], list[float]] = {(lay, ph): [] for lay in layouts for ph in ("old_lp", "update")}
    for layout in layouts:  # warm-up: first calls pay one-time kernel selection
        compute_log_probs_batch(base_model, batch.select(range(min(8, len(batch)))), config(layout), 1.0)
    for _ in range(args.reps):
        for layout in layouts:  # interleaved, so slow drifts of the machine hit both alike
            cfg = config(layout)
            model = copy.deepcopy(base_model)
            seconds[(layout, "old_lp")].append(timed(lambda: compute_log_probs_batch(model, batch, cfg, 1.0), device))
            optimizer = build_optimizer(model, cfg.optim)
            scheduler = build_lr_scheduler(optimizer, cfg.optim)
            seconds[(layout, "update")].append(
                timed(lambda: update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0), device)
            )

    first = layouts[0]
    print(
        f"{'phase':<10}"
        + "".join(f"{lay + ' s':>16}" for lay in layouts)
        + "".join(f"{lay + ':' + first:>26}" for lay in layouts[1:])
    )
    for phase in ("old_lp", "update"):
        medians = [statistics.median(seconds[(lay, phase)]) for lay in layouts]
        print(
            f"{phase:<10}"
            + "".join(f"{m:>16.3f}" for m in medians)
            + "".join(f"{m / medians[0]:>26.2f}" for m in medians[1:])
        )
    if device.type == "cuda":
        print(f"peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for layout in layouts:
            cfg = config(layout)
            model = copy.deepcopy(base_model)
            optimizer = build_optimizer(model, cfg.optim)
            scheduler = build_lr_scheduler(optimizer, cfg.optim)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0)
            print(f"\n== update_policy, layout={layout}: operators by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
