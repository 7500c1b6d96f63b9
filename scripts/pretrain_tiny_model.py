"""Build the embedded tiny model: tokenizer + Qwen2 SFT on synthetic word problems -> src/dapo/assets/tiny-qwen2/.

What it does, deterministically (fixed seeds, 2 threads, all data order drawn from seeded RNGs):
  1. generates training problems (seed --train-seed) and held-out validation problems (seed --val-seed) with
     dapo.data.synth under the default SynthConfig;
  2. trains a small byte-level BPE tokenizer on the chat-formatted corpus with Qwen2's pre-tokenizer: digits are
     isolated (one token each, as in Qwen/Llama) and every word of the fixed DAPO template becomes one token;
  3. supervised-fine-tunes a tiny Qwen2ForCausalLM from scratch on ChatML conversations (user = DAPO-templated
     problem, assistant = worked solution ending "Answer: N" + <|im_end|>), loss on assistant tokens only;
  4. evaluates on the validation set: greedy accuracy, pass@1 and pass@8 at temperature 1.0 with top-p 1.0 and 0.7;
  5. writes model (safetensors) + tokenizer (with chat template) + generation_config + pretrain_report.json
     atomically (build in a temp dir next to the target, then swap it in with os.replace).

The model is under-trained on purpose: at temperature 1.0 it solves some problems but not most, while 8 samples
solve most prompts at least once, so DAPO's dynamic sampling keeps many groups and RL has signal to sharpen.

Usage:  python scripts/pretrain_tiny_model.py [--steps N] [--out DIR] [--eval-every K]
"""

from __future__ import annotations

import os

# Threads that wait for each other must not spin: on a shared CPU a spinning OpenMP barrier makes a 2-thread torch
# step ~20x slower as soon as another process holds a core (measured here: 0.23 s -> 5.3 s per step). Must be set
# before torch (and its OpenMP runtime) is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import dataclasses
import inspect
import json
import math
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from dapo.data.synth import SynthProblem, default_synth_config, generate_synth_problems
from dapo.data.template import apply_dapo_template

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "src" / "dapo" / "assets" / "tiny-qwen2"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen2-style ChatML without a default system message (keeps prompts short for a tiny model).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (replaced atomically)")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (the under-training knob)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--num-train", type=int, default=20000, help="training problems (cycled in seeded order)")
    p.add_argument("--num-val", type=int, default=200, help="held-out validation problems")
    p.add_argument("--train-seed", type=int, default=0)
    p.add_argument("--val-seed", type=int, default=1)
    p.add_argument("--torch-seed", type=int, default=0)
    p.add_argument(
        "--vocab-size",
        type=int,
        default=1024,
        help="BPE vocabulary upper bound (the corpus runs out of merges at ~600)",
    )
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--intermediate-size", type=int, default=512)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--samples", type=int, default=8, help="samples per validation prompt for pass@k")
    p.add_argument("--eval-every", type=int, default=0, help="quick validation every K steps (0 = only at the end)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--unrewarded-format-fraction",
        type=float,
        default=0.6,
        help="share of SFT solutions whose last line is 'The answer is N.' instead of 'Answer: N'",
    )
    return p.parse_args(argv)


# --- data ---------------------------------------------------------------------------------------------------------


# The Qwen2 pre-tokenizer regex. AutoTokenizer (transformers 5) always rebuilds a qwen2 model's tokenizer as
# Qwen2Tokenizer with exactly this pre-tokenizer, whatever tokenizer.json says; training the BPE with the same one
# keeps every loader (transformers 4/5, vLLM, llama.cpp) in agreement. It isolates each digit (\p{N}).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def train_tokenizer(problems: Sequence[SynthProblem], vocab_size: int) -> Tokenizer:
    """Byte-level BPE, Qwen2-style (NFC, Qwen2 split regex, digits one token each), trained on the chat corpus.

    The corpus uses few distinct words, so a small vocabulary turns every template word into a single token.
    Training sees the text between special tokens (ChatML segments), never the special tokens themselves.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def segments() -> Any:
        for p in problems:
            yield "user\n" + apply_dapo_template(p.problem)
            yield "\n"
            yield "assistant\n" + p.solution

    tok.train_from_iterator(segments(), trainer=trainer, length=3 * len(problems))
    return tok


def save_tokenizer(tok: Tokenizer, folder: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json (Qwen2Tokenizer, ChatML template, eos/pad) into `folder`."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    cfg = json.loads(config_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    for loader_only_key in ("is_local", "local_files_only"):
        cfg.pop(loader_only_key, None)
    config_path.write_text(json.dumps(cfg, indent=2) + "\n")


def load_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """Load the tokenizer exactly as users will (AutoTokenizer), so training sees the same token ids."""
    return AutoTokenizer.from_pretrained(folder)


def prompt_ids(tokenizer: PreTrainedTokenizerFast, problem: SynthProblem) -> list[int]:
    messages = [{"role": "user", "content": apply_dapo_template(problem.problem)}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def encode_example(tokenizer: PreTrainedTokenizerFast, problem: SynthProblem) -> tuple[list[int], list[int]]:
    """(input_ids, labels): labels are -100 on the prompt, the response tokens + <|im_end|> on the answer."""
    p = prompt_ids(tokenizer, problem)
    r = tokenizer.encode(problem.solution, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(IM_END)]
    return p + r, [-100] * len(p) + r


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix shared by all sequences (the fixed start of the DAPO template)."""
    first = sequences[0]
    n = min(len(x) for x in sequences)
    for seq in sequences[1:]:
        while n and list(seq[:n]) != list(first[:n]):
            n -= 1
    return n


def collate_suffixes(
    examples: Sequence[tuple[list[int], list[int]]], prefix_len: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """Right-padded tensors of everything after the shared prefix: input_ids, labels (-100 = no loss), mask."""
    rows = [(ids[prefix_len:], lab[prefix_len:]) for ids, lab in examples]
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, lab) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(lab)] = torch.tensor(lab)
        attention[row, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def cache_kwarg(model: Qwen2ForCausalLM) -> str:
    """Name of forward()'s KV-cache argument: `cache` in transformers >= 5.2x, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward pass returned (`cache` in transformers >= 5.2x, `past_key_values` before)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def sft_loss(model: Qwen2ForCausalLM, prefix: list[int], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token loss on the labelled (assistant) tokens, with the shared prompt prefix computed once.

    Every training sequence starts with the same template tokens, whose keys/values are therefore identical across
    the batch: running them once at batch size 1 and repeating the cache gives the same loss and gradients as
    running the full sequences (tested), at ~40% less compute. The prefix carries no labels.
    """
    if not prefix:
        return model(**batch).loss
    cache = output_cache(model(input_ids=torch.tensor([prefix]), use_cache=True))
    cache.batch_repeat_interleave(batch["input_ids"].shape[0])
    prefix_mask = torch.ones((batch["input_ids"].shape[0], len(prefix)), dtype=torch.long)
    return model(
        input_ids=batch["input_ids"],
        attention_mask=torch.cat([prefix_mask, batch["attention_mask"]], dim=1),
        labels=batch["labels"],
        use_cache=True,
        **{cache_kwarg(model): cache},
    ).loss


# --- evaluation ---------------------------------------------------------------------------------------------------

_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)\s*$")


def is_correct(response: str, answer: int) -> bool:
    """Exact check of the last "Answer:" line (the reward's rule, simplified to integers)."""
    lines = [ln for ln in response.strip().splitlines() if ln.strip()]
    if not lines:
        return False
    m = _ANSWER_RE.search(lines[-1].strip())
    return m is not None and int(m.group(1)) == answer


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose mass reaches top_p (always >= 1 token)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


@torch.no_grad()
def sample_responses(
    model: Qwen2ForCausalLM,
    prompts: Sequence[list[int]],
    *,
    num_samples: int,
    greedy: bool,
    top_p: float,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator,
    max_new_tokens: int = 64,
) -> list[list[int]]:
    """Generate `num_samples` responses per prompt (temperature 1.0, or greedy); each stops after eos.

    The prompts are prefilled once and their KV cache repeated per sample (cheaper than generate()'s
    num_return_sequences, which prefills every copy). Returns response token ids, eos included when reached.
    """
    model.eval()
    width = max(len(x) for x in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(x)) + list(x) for x in prompts])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts])
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = output_cache(out)
    cache.batch_repeat_interleave(num_samples)
    logits = out.logits[:, -1].repeat_interleave(num_samples, dim=0)
    mask = mask.repeat_interleave(num_samples, dim=0)
    position = positions[:, -1:].repeat_interleave(num_samples, dim=0)
    finished = torch.zeros(logits.shape[0], dtype=torch.bool)
    tokens: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        if greedy:
            next_token = logits.argmax(dim=-1)
        else:
            probs = top_p_filter(logits.float(), top_p).softmax(dim=-1)
            next_token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        next_token = torch.where(finished, torch.full_like(next_token, pad_id), next_token)
        tokens.append(next_token)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position = position + 1
        out = model(
            input_ids=next_token[:, None],
            attention_mask=mask,
            position_ids=position,
            use_cache=True,
            **{cache_kwarg(model): cache},
        )
        logits = out.logits[:, -1]
    generated = torch.stack(tokens, dim=1).tolist()
    responses: list[list[int]] = []
    for row in generated:
        response: list[int] = []
        for tok in row:
            response.append(tok)
            if tok == eos_id:
                break
        responses.append(response)
    return responses


def sample_correctness(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[SynthProblem],
    *,
    num_samples: int,
    greedy: bool,
    top_p: float,
    seed: int,
    chunk: int = 64,
) -> list[list[bool]]:
    """Per problem, whether each of `num_samples` responses ends with the right "Answer:" line."""
    generator = torch.Generator().manual_seed(seed)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    results: list[list[bool]] = []
    for start in range(0, len(problems), chunk):
        batch = problems[start : start + chunk]
        responses = sample_responses(
            model,
            [prompt_ids(tokenizer, p) for p in batch],
            num_samples=num_samples,
            greedy=greedy,
            top_p=top_p,
            eos_id=eos_id,
            pad_id=tokenizer.pad_token_id,
            generator=generator,
        )
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        for i, p in enumerate(batch):
            results.append([is_correct(t, p.answer) for t in texts[i * num_samples : (i + 1) * num_samples]])
    return results


def evaluate(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[SynthProblem],
    samples: int,
    seed: int,
) -> dict[str, float]:
    """greedy accuracy; pass@1 (mean over samples) and pass@k (any correct) at T=1.0 for top-p 1.0 and 0.7."""
    metrics: dict[str, float] = {}
    greedy = sample_correctness(model, tokenizer, problems, num_samples=1, greedy=True, top_p=1.0, seed=seed)
    metrics["greedy_acc"] = sum(r[0] for r in greedy) / len(greedy)
    for top_p in (1.0, 0.7):
        res = sample_correctness(model, tokenizer, problems, num_samples=samples, greedy=False, top_p=top_p, seed=seed)
        metrics[f"pass@1_topp{top_p}"] = sum(sum(r) / len(r) for r in res) / len(res)
        metrics[f"pass@{samples}_topp{top_p}"] = sum(any(r) for r in res) / len(res)
    return {k: round(v, 4) for k, v in metrics.items()}


# --- output -------------------------------------------------------------------------------------------------------


def write_atomically(out: Path, write: Any) -> None:
    """Build the folder in a temp dir beside `out`, then swap it in (old folder moved aside, then deleted)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.torch_seed)
    random.seed(args.torch_seed)  # nothing here uses the global RNG; pinned anyway for libraries that might

    synth_config = default_synth_config()
    train_problems = generate_synth_problems(args.num_train, args.train_seed, synth_config)
    val_problems = generate_synth_problems(args.num_val, args.val_seed, synth_config)
    # The SFT data teaches two ways to state the result, and only the DAPO one ("Answer: N") is rewarded. The model
    # thus starts out stating its (mostly right) result in the rewarded format only some of the time: a behaviour that
    # RL with the rule-based reward must discover, as real DAPO runs first learn the answer format.
    format_rng = random.Random(args.train_seed + 7)
    train_problems = [
        dataclasses.replace(p, solution=p.solution.rsplit("\n", 1)[0] + f"\nThe answer is {p.answer}.")
        if format_rng.random() < args.unrewarded_format_fraction
        else p
        for p in train_problems
    ]
    train_texts = {p.problem for p in train_problems}
    print(
        f"[data] {len(train_problems)} train / {len(val_problems)} val problems "
        f"({sum(p.problem in train_texts for p in val_problems)} val statements also in train)",
        flush=True,
    )

    tokenizer_dir = Path(tempfile.mkdtemp(prefix="dapo-tiny-tokenizer-"))
    try:
        save_tokenizer(train_tokenizer(train_problems, args.vocab_size), tokenizer_dir)
        tokenizer = load_tokenizer(tokenizer_dir)
    finally:
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
    examples = [encode_example(tokenizer, p) for p in train_problems]
    lens = [len(ids) for ids, _ in examples]
    resp = [sum(1 for x in lab if x != -100) for _, lab in examples]
    prefix_len = common_prefix_length([ids for ids, _ in examples])
    prefix = examples[0][0][:prefix_len]
    print(
        f"[tokenizer] vocab {len(tokenizer)}; sequence length mean {sum(lens) / len(lens):.1f} max {max(lens)} "
        f"(shared template prefix {prefix_len}); response tokens mean {sum(resp) / len(resp):.1f} max {max(resp)}",
        flush=True,
    )

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"[model] Qwen2ForCausalLM {num_params / 1e6:.2f}M params", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < args.warmup_steps:
            return args.lr * (step + 1) / args.warmup_steps
        frac = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    order_rng = random.Random(args.train_seed + 1_000_003)
    order: list[int] = []
    history: list[dict[str, Any]] = []
    quick_val = val_problems[: min(64, len(val_problems))]
    model.train()
    t_train = time.time()
    for step in range(args.steps):
        if len(order) < args.batch_size:
            epoch = list(range(len(examples)))
            order_rng.shuffle(epoch)
            order.extend(epoch)
        idx, order = order[: args.batch_size], order[args.batch_size :]
        batch = collate_suffixes([examples[i] for i in idx], prefix_len, tokenizer.pad_token_id)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = sft_loss(model, prefix, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            print(
                f"[train] step {step + 1}/{args.steps} loss {loss.item():.4f} lr {lr_at(step):.2e} "
                f"{el:.0f}s elapsed, eta {el / (step + 1) * (args.steps - step - 1):.0f}s",
                flush=True,
            )
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            m = evaluate(model, tokenizer, quick_val, args.samples, seed=args.val_seed)
            history.append({"step": step + 1, "loss": round(loss.item(), 4), **m})
            print(f"[quick-eval] step {step + 1} {json.dumps(m)}", flush=True)
            model.train()
    train_seconds = time.time() - t_train

    print("[eval] validating ...", flush=True)
    metrics = evaluate(model, tokenizer, val_problems, args.samples, seed=args.val_seed)
    print(f"[eval] {json.dumps(metrics)}", flush=True)

    generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=64,
    )
    report = {
        "synth_config": synth_config.to_dict(),
        "train_seed": args.train_seed,
        "val_seed": args.val_seed,
        "torch_seed": args.torch_seed,
        "num_train_problems": args.num_train,
        "num_val_problems": args.num_val,
        "steps": args.steps,
        "unrewarded_format_fraction": args.unrewarded_format_fraction,
        "batch_size": args.batch_size,
        "problems_seen": args.steps * args.batch_size,
        "lr": args.lr,
        "num_params": num_params,
        "model": {
            k: getattr(config, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
            )
        },
        "final_train_loss": round(loss.item(), 4),
        "validation": {"temperature": 1.0, "samples_per_prompt": args.samples, **metrics},
        "history": history,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.time() - t0, 1),
        "torch_version": torch.__version__,
    }

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        tokenizer_config = folder / "tokenizer_config.json"
        cfg = json.loads(tokenizer_config.read_text())
        for loader_only_key in ("is_local", "local_files_only"):
            cfg.pop(loader_only_key, None)
        tokenizer_config.write_text(json.dumps(cfg, indent=2) + "\n")
        with open(folder / "pretrain_report.json", "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")

    write_atomically(args.out, write)
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    print(f"[done] wrote {args.out} ({size / 1e6:.2f} MB) in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
