"""Validation: sample k responses per held-out prompt at the evaluation setting and report mean@k and pass@k.

The paper evaluates AIME 2024 as avg@32 at temperature 1.0, top-p 0.7; `rollout.val_kwargs` holds those values.

Metrics come under two sets of names:

* ours, ``val/acc/mean@k`` (k = rollout.val_kwargs.n, mean over every sample) and ``val/acc/mean@k/ci95`` (the
  half-width of its 95% interval over prompts), ``val/pass@k``, ``val/score/mean@k``,
  ``val/response_length/mean``, and per data_source ``val/<data_source>/acc/mean@k`` when there are several;
  with multi-turn rollouts, ``val/tool/*`` (:func:`dapo.tools.metrics.tool_use_metrics`: the share of samples that
  called the tool, calls per sample, accuracy with and without a call, ...);
* verl's, computed as verl computes them: samples are grouped by problem (data_source and prompt), so the official
  AIME file (each problem 32 times) with n=1 gives N=32: ``val-core/<data_source>/acc/mean@N``, and
  ``val-aux/<data_source>/score/mean@N``, ``val-aux/<data_source>/acc/std@N`` (per-problem std, averaged),
  ``val-aux/<data_source>/acc/best@N/mean`` (share of problems solved at least once in N),
  ``val-aux/<data_source>/response_length/mean``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

from dapo.config import DapoConfig
from dapo.reward.scored_groups import ScoredGroup, score_rollout
from dapo.data.prompts import PromptItem
from dapo.evaluation.statistics import mean_std, val_acc_key_of
from dapo.rollout.base import RolloutEngine, SamplingParams
from dapo.tools.metrics import tool_use_metrics


def val_acc_key(metrics: dict[str, float]) -> str | None:
    """The ``val/acc/mean@k`` key among logged metrics (k is rollout.val_kwargs.n), or None."""
    return val_acc_key_of([metrics])


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
    # the 95% interval over prompts (each prompt's k samples are correlated: the prompt is the unit)
    ci95 = mean_std([sum(g.acc) / len(g.acc) for g in groups if g.acc]).ci95
    if ci95 is not None:  # undefined for a single prompt
        metrics[f"val/acc/mean@{k}/ci95"] = ci95
    metrics[f"val/pass@{k}"] = sum(any(g.acc) for g in groups) / len(groups)
    metrics[f"val/score/mean@{k}"] = sum(s for g in groups for s in g.scores) / len(samples)
    lengths = [len(r) for g in groups for r in g.response_ids]
    metrics["val/response_length/mean"] = sum(lengths) / len(lengths)
    if len(by_source) > 1:
        for source, gs in sorted(by_source.items()):
            accs = [a for g in gs for a in g.acc]
            metrics[f"val/{source}/acc/mean@{k}"] = sum(accs) / len(accs)
    metrics.update(verl_validation_metrics(groups))
    # multi-turn: how the held-out samples used the tool (val/tool/samples_with_call, val/tool/acc_with_call, ...)
    metrics.update(tool_use_metrics([sample for g in groups for sample in g.tool_use], prefix="val/tool/"))
    return metrics


def verl_validation_metrics(groups: Sequence[ScoredGroup]) -> dict[str, float]:
    """verl's val-core / val-aux metrics: samples grouped by problem (data_source, prompt), N = samples per problem."""
    problems: dict[tuple[str, tuple[int, ...]], list[tuple[float, float, int]]] = defaultdict(list)
    for g in groups:
        key = (g.prompt.data_source, tuple(g.prompt.input_ids))
        problems[key].extend((float(a), float(s), len(r)) for a, s, r in zip(g.acc, g.scores, g.response_ids))
    per_name: dict[str, list[float]] = defaultdict(list)
    for (source, _), samples in problems.items():
        n = len(samples)
        accs = [a for a, _, _ in samples]
        mean_acc = sum(accs) / n
        per_name[f"val-core/{source}/acc/mean@{n}"].append(mean_acc)
        per_name[f"val-aux/{source}/score/mean@{n}"].append(sum(s for _, s, _ in samples) / n)
        per_name[f"val-aux/{source}/acc/std@{n}"].append(math.sqrt(sum((a - mean_acc) ** 2 for a in accs) / n))
        per_name[f"val-aux/{source}/acc/best@{n}/mean"].append(max(accs))
        per_name[f"val-aux/{source}/response_length/mean"].append(sum(r for _, _, r in samples) / n)
    return {name: sum(values) / len(values) for name, values in sorted(per_name.items())}


def repeated_prompt_warning(prompts: Sequence[PromptItem], n: int) -> str | None:
    """A one-line warning when a validation set repeats its prompts and n > 1 (the official AIME file already holds
    each problem 32 times: n=32 on it samples 1,024 per problem); None otherwise."""
    if n <= 1 or not prompts:
        return None
    counts: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
    for p in prompts:
        counts[(p.data_source, tuple(p.input_ids))] += 1
    repeats = max(counts.values())
    if repeats <= 1:
        return None
    return (
        f"the validation set repeats its prompts (up to {repeats}x: {len(prompts)} rows, {len(counts)} distinct "
        f"prompts) and rollout.val_kwargs.n={n}: each problem is sampled up to {repeats * n} times. The published "
        f"recipe uses n=1 on the repeated AIME file (avg@{repeats}); set rollout.val_kwargs.n=1, or de-duplicate "
        "the file (dapo data prepare) and keep n"
    )


def validation_groups(
    engine: RolloutEngine,
    prompts: Sequence[PromptItem],
    tokenizer,
    cfg: DapoConfig,
    *,
    seed: int,
    prompt_seeds: Sequence[int] | None = None,
) -> list[ScoredGroup]:
    """Sample and score ``prompts`` at the validation setting (``summarize_validation`` turns the groups into the
    metrics); ``prompt_seeds`` (one per prompt, see ``SamplingParams.prompt_seeds``) make each prompt's samples
    independent of the others in the call, which the trainer uses so that validation shared among ranks equals one
    process's."""
    vk = cfg.rollout.val_kwargs
    params = SamplingParams(
        n=vk.n,
        temperature=vk.temperature,
        top_p=vk.top_p,
        top_k=vk.top_k,
        max_tokens=cfg.data.max_response_length,
        stop_token_ids=(),
        seed=seed,
        prompt_seeds=None if prompt_seeds is None else tuple(prompt_seeds),
    )
    rollout = engine.generate([p.input_ids for p in prompts], params)
    return score_rollout(prompts, rollout, tokenizer, cfg)
