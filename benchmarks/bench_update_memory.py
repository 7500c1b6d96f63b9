"""Peak resident memory of the actor's update, and (``--profile-memory``) what is alive at that peak.

    python benchmarks/bench_update_memory.py --config configs/smollm2_135m.yaml \
        --model ~/.cache/dapo/gguf/SmolLM2-135M-Instruct.Q4_1-*       # the SmolLM2 job's batch and actor preset
    python benchmarks/bench_update_memory.py --config configs/smollm2_135m.yaml --model DIR \
        --set actor.shared_prompt_chunk_tokens=128 --profile-memory

``update_policy`` runs ``--updates`` times (default 2) on one batch shaped like a job's rollout batch
(``--groups`` x ``--n`` samples, prompts of ``--prompt-len`` +- 20% tokens, responses of 1..``--max-response``), with
the ``actor`` section of ``--config`` and its overrides, all samples in one mini-batch (one optimizer step, as in
the SmolLM2 job of ``benchmarks/vs_trl.py``). Each update's peak RSS is the kernel's high-water mark reset at its start
(:class:`dapo.infra.memory.PeakMemory`, the ``perf/max_memory_rss_gb`` of training): the second update is the
steady state, AdamW's state held.

``--profile-memory`` profiles the last update with ``torch.profiler`` (``profile_memory``, Python stacks), replays its
allocations and frees, and prints the tensors alive at the moment the most memory made after the update's start was
alive, grouped by the operator and dapo/torch frames that allocated them: the table of docs/performance.md ("Memory
of the SmolLM2 job"). Memory held before the profile starts (weights, AdamW state) is not in that table.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_actor import make_batch  # noqa: E402

from dapo.actor import build_lr_scheduler, build_optimizer, update_policy  # noqa: E402
from dapo.config import ModelConfig, load_config  # noqa: E402
from dapo.infra.memory import PeakMemory  # noqa: E402
from dapo.model.loading import load_policy  # noqa: E402

FRAMES = ("dapo/", "torch/optim", "checkpoint.py", "Backward", "aten::", "autograd")


def allocating_frames(event: object, depth: int) -> tuple[str, ...]:
    """The nearest ``depth`` operator / dapo / autograd frames above an allocation event of the profiler's tree."""
    names: list[str] = []
    parent = event.parent  # type: ignore[attr-defined]
    while parent is not None and len(names) < depth:
        if any(mark in parent.name for mark in FRAMES) and parent.name not in names:
            names.append(parent.name)
        parent = parent.parent
    return tuple(names)


def live_at_peak(profiler: torch.profiler.profile, depth: int) -> tuple[int, Counter[tuple[str, ...]]]:
    """Bytes alive at the profile's peak (allocations made inside the profile) and who allocated them."""
    from torch._C._profiler import _EventType

    allocations = []
    stack = list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.typed[0] == _EventType.Allocation:
            allocations.append(event)
        stack.extend(event.children)
    allocations.sort(key=lambda e: e.start_time_ns)
    live: dict[int, tuple[int, object]] = {}
    current, peak, at_peak = 0, 0, {}
    for event in allocations:
        fields = event.typed[1]
        if fields.alloc_size > 0:
            live[fields.ptr] = (fields.alloc_size, event)
            current += fields.alloc_size
        elif fields.ptr in live:
            current -= live.pop(fields.ptr)[0]
        if current > peak:
            peak, at_peak = current, dict(live)
    owners: Counter[tuple[str, ...]] = Counter()
    for size, event in at_peak.values():
        owners[allocating_frames(event, depth)] += size
    return peak, owners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="dapo config whose actor section is used (default: defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--model", default=None, help="Hugging Face model folder (default: the config's model)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=80)
    parser.add_argument("--max-response", type=int, default=64)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile-memory", action="store_true", help="who holds the memory at the last update's peak")
    parser.add_argument("--top", type=int, default=12, help="rows of the --profile-memory table")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    cfg = load_config(
        args.config, [*args.set, f"data.train_batch_size={args.groups}", f"actor.ppo_mini_batch_size={args.groups}"]
    )
    model_cfg = ModelConfig(path=args.model) if args.model else cfg.model
    policy = load_policy(model_cfg).model
    vocab = policy.get_input_embeddings().num_embeddings
    batch = make_batch(args.groups, args.n, args.prompt_len, args.max_response, vocab, seed=0)
    actor = cfg.actor
    optimizer = build_optimizer(policy, actor.optim)
    scheduler = build_lr_scheduler(optimizer, actor.optim)
    print(
        f"model {model_cfg.path}: {sum(p.numel() for p in policy.parameters()) / 1e6:.1f}M params; "
        f"{args.groups} x {args.n} samples; actor layout {actor.layout}, micro-batch budget "
        f"{actor.ppo_max_token_len_per_gpu} tokens, passes capped at {actor.shared_prompt_chunk_tokens}, "
        f"log-prob chunks {actor.logprob_chunk_size}, checkpointing {actor.gradient_checkpointing}",
        flush=True,
    )
    peaks = PeakMemory()
    for update in range(args.updates):
        profile = args.profile_memory and update == args.updates - 1
        peaks.reset()
        start = time.perf_counter()
        if profile:
            activities = [torch.profiler.ProfilerActivity.CPU]
            with torch.profiler.profile(activities=activities, profile_memory=True, with_stack=True) as profiler:
                update_policy(policy, optimizer, scheduler, batch, actor, temperature=1.0)
        else:
            update_policy(policy, optimizer, scheduler, batch, actor, temperature=1.0)
        seconds = time.perf_counter() - start
        note = " (under the profiler)" if profile else ""
        print(f"update {update}: peak RSS {peaks.read()['rss'] / 1e9:.2f} GB, {seconds:.1f} s{note}", flush=True)
    if args.profile_memory:
        peak, owners = live_at_peak(profiler, depth=5)
        print(f"\nalive at the peak of the allocations made during the last update: {peak / 1e6:.0f} MB")
        for frames, size in owners.most_common(args.top):
            print(f"{size / 1e6:>8.0f} MB  {' <- '.join(frames)}")


if __name__ == "__main__":
    main()
