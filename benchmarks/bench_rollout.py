"""Rollout throughput: HFRolloutEngine vs ``model.generate`` on the same batch.

Same request for every contender: P random prompts (varied lengths, so left padding is exercised) x N samples each,
ancestral sampling at temperature 1 (no top-k/top-p), at most T new tokens, stop at EOS. Reported: generated tokens
(up to and including EOS; padding not counted) per second of wall time, best of R timed runs after one warm-up.

Contenders:
  engine           HFRolloutEngine (finished rows dropped from the batch and the KV cache)
  engine-no-drop   HFRolloutEngine(drop_finished=False): finished rows stay until the batch is done, like generate
  generate         model.generate(do_sample=True, num_return_sequences=N, ...)

Scenarios (built-in random Qwen2 only; a random model almost never samples EOS on its own):
  varied   an lm_head bias on EOS gives each step an EOS probability of 1/mean_len, so response lengths are
           geometric (mean ~48 by default, a few capped at T): the spread that RL rollouts have
  full     no bias: every response runs to T tokens (pure per-step efficiency; nothing to drop)

Prompts: random token ids of varied lengths (``--prompt-len``), or with ``--data FILE`` (and ``--model``) the first
``--prompts`` problems of a dapo data file, chat template applied by the model's tokenizer exactly as ``dapo train``
does: the batch of a training job's first rollout step (``benchmarks/vs_trl.py`` passes its job's file).

Usage:
  python benchmarks/bench_rollout.py                      # built-in model, both scenarios, CPU
  python benchmarks/bench_rollout.py --threads 1 --repeats 5
  python benchmarks/bench_rollout.py --model PATH --device cuda --dtype bfloat16   # a local HF checkpoint
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from dapo.rollout import HFRolloutEngine, SamplingParams


def build_bench_model(vocab_size: int, seed: int) -> Qwen2ForCausalLM:
    """A random ~10M-parameter Qwen2 (4 layers, hidden 256, GQA 8/2 heads): tiny, but not trivially so."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=1,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).eval()


def set_eos_hazard(model: PreTrainedModel, eos_token_id: int, mean_length: float | None) -> None:
    """Give lm_head a bias so that EOS has probability ~1/mean_length per step (random logits are ~uniform).

    ``None`` removes the bias (EOS then has the random model's ~1/vocab chance). Both contenders share the module.
    """
    head: torch.nn.Linear = model.lm_head
    if head.bias is None:
        head.bias = torch.nn.Parameter(torch.zeros_like(head.weight[:, 0]))
    with torch.no_grad():
        head.bias.zero_()
        if mean_length is not None:
            vocab = head.out_features
            head.bias[eos_token_id] = math.log((vocab - 1) / (mean_length - 1))


def random_prompts(count: int, vocab_size: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    return [torch.randint(2, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def data_prompts(path: str, model_dir: str, count: int) -> list[list[int]]:
    """The first ``count`` prompts of a dapo data file, tokenised as ``dapo train`` tokenises them."""
    from transformers import AutoTokenizer

    from dapo.data.loaders import load_records
    from dapo.data.prompts import encode_prompts

    records = load_records(path)[:count]
    if len(records) < count:
        raise SystemExit(f"{path}: {len(records)} problems, fewer than --prompts {count}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = encode_prompts(records, tokenizer, max_prompt_length=1 << 30, where=path)
    return [list(item.input_ids) for item in encoded.items]


def generated_tokens_of_generate(sequences: torch.Tensor, prompt_width: int, eos_token_id: int) -> int:
    """Tokens generate actually produced per row: up to and including the first EOS (the rest is padding)."""
    new = sequences[:, prompt_width:]
    is_eos = new == eos_token_id
    has_eos = is_eos.any(dim=-1)
    lengths = torch.where(has_eos, is_eos.int().argmax(dim=-1) + 1, new.shape[1])
    return int(lengths.sum())


def run_generate(
    model: PreTrainedModel, prompts: list[list[int]], n: int, max_tokens: int, eos: int, pad: int, seed: int
) -> int:
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt) :] = 1
    torch.manual_seed(seed)
    with torch.inference_mode():
        sequences = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=max_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    return generated_tokens_of_generate(sequences.cpu(), width, eos)


def run_engine(engine: HFRolloutEngine, prompts: list[list[int]], n: int, max_tokens: int, seed: int) -> int:
    output = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=seed))
    return sum(len(ids) for ids in output.response_ids)


def measure(
    contenders: dict[str, Callable[[int], int]], repeats: int, device: torch.device
) -> dict[str, tuple[float, float]]:
    """Warm each contender up once, then time ``repeats`` rounds, the contenders interleaved within each round so that
    load from other processes hits them alike. Returns name -> (best tokens/s, mean generated tokens per run)."""
    for run in contenders.values():
        run(repeats)  # warm-up, with a seed the timed runs do not use
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    tokens: dict[str, list[int]] = {name: [] for name in contenders}
    for r in range(repeats):
        for name, run in contenders.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            produced = run(r)
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates[name].append(produced / (time.perf_counter() - start))
            tokens[name].append(produced)
    return {name: (max(rates[name]), statistics.mean(tokens[name])) for name in contenders}


def first_set(*values: object) -> object:
    """The first value that is not None (token id 0 is a valid id, so `or` will not do)."""
    return next((value for value in values if value is not None), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="local HF checkpoint dir (default: built-in random Qwen2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64), metavar=("MIN", "MAX"))
    parser.add_argument(
        "--data",
        default=None,
        help="dapo data file (parquet/jsonl) to take the prompts from; needs --model (its tokenizer and chat template)",
    )
    parser.add_argument("--mean-len", type=float, default=48.0, help="mean response length in the 'varied' scenario")
    parser.add_argument("--vocab", type=int, default=8192, help="vocabulary of the built-in model")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.model is None:
        model = build_bench_model(args.vocab, args.seed).to(device=device, dtype=dtype)
        eos, pad = 1, 0
        scenarios: list[tuple[str, float | None]] = [("varied", args.mean_len), ("full", None)]
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
        eos_ids = first_set(model.generation_config.eos_token_id, model.config.eos_token_id)
        if eos_ids is None:
            raise SystemExit(f"{args.model}: neither generation_config nor config names an eos_token_id")
        eos = eos_ids[0] if isinstance(eos_ids, list) else eos_ids
        pad = first_set(model.generation_config.pad_token_id, model.config.pad_token_id, eos)
        scenarios = [("model", None)]
    vocab = model.get_input_embeddings().num_embeddings
    if args.data is not None:
        if args.model is None:
            raise SystemExit("--data needs --model: the prompts are tokenised with that model's tokenizer")
        prompts = data_prompts(args.data, args.model, args.prompts)
        source = f"prompts of {args.data}"
    else:
        prompts = random_prompts(args.prompts, vocab, *args.prompt_len, seed=args.seed)
        source = "random prompts"
    lengths = sorted(map(len, prompts))
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"model: {args.model or 'random Qwen2'} ({params_m:.1f}M params, {args.dtype}, {device}), threads "
        f"{torch.get_num_threads()}; {len(prompts)} {source} x {args.n} samples, max_tokens {args.max_tokens}, "
        f"prompt lengths {lengths[0]}-{lengths[-1]} tokens, best of {args.repeats}"
    )
    engine = HFRolloutEngine(model, eos_token_ids=eos, pad_token_id=pad)
    engine_no_drop = HFRolloutEngine(model, eos_token_ids=eos, pad_token_id=pad, drop_finished=False)
    for scenario, mean_length in scenarios:
        if args.model is None:
            set_eos_hazard(model, eos, mean_length)
        contenders: dict[str, Callable[[int], int]] = {
            "engine": lambda r: run_engine(engine, prompts, args.n, args.max_tokens, args.seed + r),
            "engine-no-drop": lambda r: run_engine(engine_no_drop, prompts, args.n, args.max_tokens, args.seed + r),
            "generate": lambda r: run_generate(model, prompts, args.n, args.max_tokens, eos, pad, args.seed + r),
        }
        results = measure(contenders, args.repeats, device)
        base = results["generate"][0]
        print(f"\nscenario: {scenario}")
        print(f"  {'contender':<16}{'tokens/s':>10}{'tokens/run':>12}{'vs generate':>13}")
        for name, (rate, tokens) in results.items():
            print(f"  {name:<16}{rate:>10.0f}{tokens:>12.0f}{rate / base:>12.2f}x")


if __name__ == "__main__":
    main()
