"""A fake engine and tokenizer for fast, deterministic evaluation tests (characters are tokens)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from dapo.rollout.base import RolloutOutput, SamplingParams


class CharTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [ord(c) % 5000 for c in messages[-1]["content"]]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class FakeEngine:
    """Answers "Answer: k" with k drawn from one RNG per call (seeded by params.seed), like a batched sampler."""

    def __init__(self, max_answer: int = 3, long_every: int = 0) -> None:
        self.calls = 0
        self.rows = 0
        self.max_answer = max_answer

    def generate(self, prompt_token_ids, params: SamplingParams) -> RolloutOutput:
        self.calls += 1
        rng = random.Random(params.seed)
        index, ids, lps, reasons = [], [], [], []
        for i, _ in enumerate(prompt_token_ids):
            for _ in range(params.n):
                k = 0 if params.temperature == 0 else rng.randint(0, self.max_answer)
                text = f"work\nAnswer: {k}"[: params.max_tokens]
                index.append(i)
                ids.append([ord(c) for c in text])
                lps.append([-0.1] * len(text))
                reasons.append("length" if len(text) == params.max_tokens else "stop")
                self.rows += 1
        return RolloutOutput(index, ids, lps, reasons)

    def update_weights(self, named_tensors):
        pass

    def log_probs_of(self, prompt_token_ids, response_ids):
        return [0.0] * len(response_ids)

    def close(self):
        pass


def dapo_row(problem: str, answer: str, source: str = "math_dapo", index: int | None = None) -> dict:
    row = {"data_source": source, "prompt": [{"role": "user", "content": problem}], "ability": "math",
           "reward_model": {"ground_truth": answer, "style": "rule"}}
    if index is not None:
        row["extra_info"] = {"index": index}
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
