"""Validation: sample k responses per held-out prompt at the evaluation setting and report mean@k and pass@k.

The paper evaluates AIME 2024 as avg@32 at temperature 1.0, top-p 0.7; `rollout.val_kwargs` holds those values.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from dapo.config import DapoConfig
from dapo.reward.scored_groups import ScoredGroup, score_rollout
from dapo.data.prompts import PromptItem
from dapo.rollout.base import RolloutEngine, SamplingParams


def val_acc_key(metrics: dict[str, float]) -> str | None:
    """The ``val/acc/mean@k`` key among logged metrics (k is rollout.val_kwargs.n), or None."""
    return next((k for k in metrics if k.startswith("val/acc/mean@")), None)


def summarize_validation(groups: Sequence[ScoredGroup], k: int) -> dict[str, float]:
    """mean@k: accuracy averaged over all k samples of all prompts; pass@k: share of prompts solved at least once."""
    if not groups:
        return {}
    metrics: dict[str, float] = {}
    by_source: dict[str, list[ScoredGroup]] = defaultdict(list)
    for g in groups:
        by_source[g.prompt.data_source].append(g)
    samples = [a for g in groups for a in g.acc]
    metrics[f"val/acc/mean@{k}"] = sum(samples) / len(samples)
    metrics[f"val/pass@{k}"] = sum(any(g.acc) for g in groups) / len(groups)
    metrics[f"val/score/mean@{k}"] = sum(s for g in groups for s in g.scores) / len(samples)
    lengths = [len(r) for g in groups for r in g.response_ids]
    metrics["val/response_length/mean"] = sum(lengths) / len(lengths)
    if len(by_source) > 1:
        for source, gs in sorted(by_source.items()):
            accs = [a for g in gs for a in g.acc]
            metrics[f"val/{source}/acc/mean@{k}"] = sum(accs) / len(accs)
    return metrics


def run_validation(
    engine: RolloutEngine, prompts: Sequence[PromptItem], tokenizer, cfg: DapoConfig, *, seed: int
) -> tuple[dict[str, float], list[ScoredGroup]]:
    vk = cfg.rollout.val_kwargs
    params = SamplingParams(
        n=vk.n, temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k,
        max_tokens=cfg.data.max_response_length, stop_token_ids=(), seed=seed,
    )
    rollout = engine.generate([p.input_ids for p in prompts], params)
    groups = score_rollout(prompts, rollout, tokenizer, cfg)
    return summarize_validation(groups, vk.n), groups
