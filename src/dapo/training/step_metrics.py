"""Per-step training metrics, named as verl names them where verl has a name.

Batch metrics (critic/*, acc/mean, response_length/*) describe the training batch after dynamic sampling, as in verl;
rollout/acc/mean describes every response generated in the step, before the filter (the learning curve of the policy).
The current resident memory (perf/cpu_memory_used_gb) is logged with the batch metrics; peaks per phase
(perf/max_memory_rss_gb[/phase], and on CUDA perf/max_memory_{allocated,reserved}_gb[/phase]) come with the timings.
"""

from __future__ import annotations

import resource
from typing import Sequence

import torch

from dapo.reward.scored_groups import ScoredGroup


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _mean_max_min(name: str, values: Sequence[float]) -> dict[str, float]:
    """``name/mean``, ``name/max``, ``name/min`` of ``values`` (NaN when there are none)."""
    if not values:
        return {f"{name}/mean": float("nan"), f"{name}/max": float("nan"), f"{name}/min": float("nan")}
    return {f"{name}/mean": _mean(values), f"{name}/max": float(max(values)), f"{name}/min": float(min(values))}


def batch_metrics(
    groups: Sequence[ScoredGroup], advantages: torch.Tensor, *, max_response_length: int
) -> dict[str, float]:
    lengths = [len(r) for g in groups for r in g.response_ids]
    truncated = [t for g in groups for t in g.truncated]
    scores = [s for g in groups for s in g.scores]
    rewards = [r for g in groups for r in g.rewards]
    penalties = [p for g in groups for p in g.overlong_penalty]
    acc = [float(a) for g in groups for a in g.acc]
    prompt_lengths = [len(g.prompt.input_ids) for g in groups for _ in g.acc]  # per sample, as verl counts them
    return {
        **_mean_max_min("prompt_length", prompt_lengths),
        **_mean_max_min("response_length", lengths),
        "response_length/clip_ratio": _mean([float(t) for t in truncated]),
        **_mean_max_min("critic/score", scores),
        **_mean_max_min("critic/rewards", rewards),
        "critic/overlong_penalty/mean": _mean(penalties),
        "critic/advantages/mean": float(advantages.mean()) if advantages.numel() else float("nan"),
        "critic/advantages/max": float(advantages.max()) if advantages.numel() else float("nan"),
        "critic/advantages/min": float(advantages.min()) if advantages.numel() else float("nan"),
        "acc/mean": _mean(acc),
        "train/num_groups": float(len(groups)),
        "train/max_response_length": float(max_response_length),
        **memory_metrics(),
    }


def memory_metrics() -> dict[str, float]:
    """This process's resident memory now, in GB, as verl names it. Peaks (RSS per phase and on CUDA allocated /
    reserved) come from ``dapo.infra.timing.PhaseTimer`` with a ``PeakMemory``."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            rss_pages = int(f.read().split()[1])
        return {"perf/cpu_memory_used_gb": rss_pages * resource.getpagesize() / 1024**3}
    except (OSError, ValueError, IndexError):  # not Linux: the peak is what getrusage offers
        return {"perf/cpu_memory_used_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}


def policy_metrics(
    old_log_probs: Sequence[torch.Tensor],
    entropies: Sequence[torch.Tensor] | None,
    rollout_log_probs: Sequence[torch.Tensor],
) -> dict[str, float]:
    """Entropy and mean token probability of the sampled responses (the paper's Fig. 7c/7d), and the gap between the
    actor's recomputed log-probs and the rollout engine's (train/inference mismatch)."""
    old = torch.cat([lp.detach().float() for lp in old_log_probs])
    roll = torch.cat([lp.detach().float() for lp in rollout_log_probs])
    diff = (old - roll).abs()
    out = {
        "actor/mean_prob": float(old.exp().mean()),
        "rollout/log_prob_diff/mean": float(diff.mean()),
        "rollout/log_prob_diff/max": float(diff.max()),
        "rollout/probs_diff/mean": float((old.exp() - roll.exp()).abs().mean()),
    }
    if entropies is not None:
        out["actor/entropy"] = float(torch.cat([e.detach().float() for e in entropies]).mean())
    return out
