"""A scripted engine and data rows for fast, deterministic evaluation tests (characters are tokens)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from dapo.rollout.base import SamplingParams
from tests.harness.engines import ScriptedEngine
from tests.harness.tokenizers import CharTokenizer


def answering_engine(max_answer: int = 3) -> ScriptedEngine:
    """Answers "work\nAnswer: k" with k drawn from one RNG per call (seeded by params.seed; 0 when greedy), like a
    batched sampler; its tokenizer is :class:`tests.harness.tokenizers.CharTokenizer`."""

    def respond(prompts, params: SamplingParams) -> list[list[int]]:
        rng = random.Random(params.seed)
        return [
            CharTokenizer().encode(f"work\nAnswer: {0 if params.temperature == 0 else rng.randint(0, max_answer)}")
            for _ in prompts
            for _ in range(params.n)
        ]

    return ScriptedEngine(respond)


def dapo_row(problem: str, answer: str, source: str = "math_dapo", index: int | None = None) -> dict:
    row = {
        "data_source": source,
        "prompt": [{"role": "user", "content": problem}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
    }
    if index is not None:
        row["extra_info"] = {"index": index}
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
