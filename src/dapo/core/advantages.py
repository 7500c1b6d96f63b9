"""Group-relative outcome advantages (GRPO / DAPO Eq. 9) and the advantage-estimator registry.

Every response of a prompt group shares one scalar reward; its advantage is that reward standardised within the group,
then the same value is given to each of its response tokens (``broadcast_advantage``).

Registry: a config string (``algorithm.adv_estimator``, verl's names) picks an estimator with
``get_adv_estimator(name)``: ``grpo``, ``rloo``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline`` and
``grpo_passk``. Dr. GRPO (no division by the group std) is the ``norm_adv_by_std=False`` flag of ``grpo``, not a
separate name, so a config has one switch for it rather than two that could disagree.
"""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor


class AdvantageEstimator(Protocol):
    """What a registered estimator looks like: per-sample scores and group ids in, per-sample advantages out.

    ``token_counts[i]`` is the number of tokens of response i that enter the loss: its action tokens (a multi-turn
    response's tool output is context, not an action). Only the estimators that normalise over tokens read it."""

    def __call__(
        self,
        scores: Tensor,
        group_index: Tensor,
        *,
        norm_adv_by_std: bool = True,
        eps: float = 1e-6,
        token_counts: Tensor | None = None,
    ) -> Tensor: ...


ADV_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_adv_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator registering an advantage estimator under ``name``; a second, different function for it is an error."""

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        existing = ADV_ESTIMATORS.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered to {existing!r}")
        ADV_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered under ``name``; ``KeyError`` listing the registered names otherwise."""
    try:
        return ADV_ESTIMATORS[name]
    except KeyError:
        allowed = ", ".join(sorted(ADV_ESTIMATORS))
        raise KeyError(f"unknown advantage estimator {name!r}; registered estimators: {allowed}") from None


@register_adv_estimator("grpo")
def compute_grpo_outcome_advantage(
    scores: Tensor,
    group_index: Tensor,
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
    token_counts: Tensor | None = None,
) -> Tensor:
    """Group-normalised outcome advantage, DAPO Eq. 9: ``A_i = (R_i - mean(R_group)) / (std(R_group) + eps)``.

    ``std`` is the unbiased (Bessel-corrected, ``n - 1``) standard deviation of the group, as in ``torch.std``.
    With ``norm_adv_by_std=False`` (Dr. GRPO) the advantage is only ``R_i - mean(R_group)``.
    A group whose rewards are all equal, including a group of one response, carries no learning signal: its
    advantage is exactly 0 (decided by comparing the rewards, not by rounding-prone ``std == 0``), for any ``eps``.

    Args:
        scores: ``[B]`` scalar reward of each response (non-floating input is converted to float32).
        group_index: ``[B]`` integer id of each response's prompt group; any ids, in any order.
        norm_adv_by_std: divide by the group std (GRPO/DAPO) or not (Dr. GRPO).
        eps: added to the std so a zero-variance group gives 0, not NaN.
        token_counts: unused (the registry's common signature).

    Returns:
        ``[B]`` advantages, float32 (float64 when ``scores`` is float64).
    """
    g = _Groups.of("compute_grpo_outcome_advantage", scores, group_index, eps)
    centered = g.scores - g.mean
    if norm_adv_by_std:
        centered = centered / (g.std + eps)
    return torch.where(g.constant, torch.zeros_like(centered), centered)


class _Groups:
    """Checked scores and their per-sample group statistics: the one group reduction every estimator reads."""

    def __init__(self, scores: Tensor, dense_group: Tensor, num_groups: int) -> None:
        zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
        size = zeros.index_add(0, dense_group, torch.ones_like(scores))
        mean = zeros.index_add(0, dense_group, scores) / size
        sum_sq = zeros.index_add(0, dense_group, (scores - mean[dense_group]).square())
        group_max = torch.full_like(zeros, -torch.inf).scatter_reduce(0, dense_group, scores, reduce="amax")
        group_min = torch.full_like(zeros, torch.inf).scatter_reduce(0, dense_group, scores, reduce="amin")
        self.scores, self.dense_group, self.num_groups = scores, dense_group, num_groups
        self.size = size[dense_group]  # every statistic per sample
        self.mean = mean[dense_group]
        self.std = (sum_sq / (size - 1).clamp(min=1)).sqrt()[dense_group]  # unbiased, as torch.std
        # All rewards equal (a group of one included): no learning signal, advantage exactly 0 (decided by comparing
        # rewards, not by rounding-prone std == 0).
        self.constant = (group_max == group_min)[dense_group]

    @classmethod
    def of(cls, where: str, scores: Tensor, group_index: Tensor, eps: float) -> "_Groups":
        if scores.dim() != 1 or group_index.dim() != 1 or scores.shape != group_index.shape:
            raise ValueError(
                f"{where}: scores and group_index must both be 1-D with the same length, "
                f"got scores{tuple(scores.shape)} and group_index{tuple(group_index.shape)}"
            )
        if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
            raise TypeError(f"{where}: group_index must be an integer tensor, got {group_index.dtype}")
        if eps < 0:
            raise ValueError(f"{where}: eps must be >= 0, got {eps}")
        dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
        scores = scores.to(dtype)
        if not bool(torch.isfinite(scores).all()):
            bad = torch.nonzero(~torch.isfinite(scores)).flatten().tolist()
            raise ValueError(f"{where}: scores must be finite, got non-finite values at positions {bad}")
        _, dense_group = torch.unique(group_index, return_inverse=True)
        return cls(scores, dense_group, int(dense_group.max()) + 1 if dense_group.numel() else 0)


@register_adv_estimator("rloo")
def compute_rloo_outcome_advantage(
    scores: Tensor,
    group_index: Tensor,
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
    token_counts: Tensor | None = None,
) -> Tensor:
    """RLOO (REINFORCE Leave-One-Out; Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740): the baseline of
    response i is the mean reward of the OTHER responses of its group::

        A_i = R_i - 1/(G-1) sum_{j != i} R_j  =  G/(G-1) * (R_i - mean(R_group))

    A group of one has no other response: advantage 0 (verl leaves its raw reward there). ``norm_adv_by_std`` and
    ``eps`` are not read (RLOO does not normalise).
    """
    g = _Groups.of("rloo", scores, group_index, eps)
    adv = g.size / (g.size - 1).clamp(min=1) * (g.scores - g.mean)
    return torch.where(g.constant, torch.zeros_like(adv), adv)


def _token_whiten(values: Tensor, token_counts: Tensor | None, where: str) -> Tensor:
    """Whiten per-sample values over the batch's loss TOKENS (sample i counts ``token_counts[i]`` times, its action
    tokens), as verl's ``masked_whiten`` over the response mask that excludes tool output: ``(v - mean) /
    sqrt(var + 1e-8)`` with the unbiased token variance."""
    if token_counts is None:
        raise ValueError(f"{where}: token_counts are needed (the whitening is over tokens)")
    if token_counts.shape != values.shape:
        raise ValueError(f"{where}: token_counts{tuple(token_counts.shape)} must match scores{tuple(values.shape)}")
    weight = token_counts.to(values.dtype)
    n = weight.sum()
    if n <= 1:
        return torch.zeros_like(values)
    mean = (weight * values).sum() / n
    var = (weight * (values - mean).square()).sum() / (n - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    scores: Tensor,
    group_index: Tensor,
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
    token_counts: Tensor | None = None,
) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262, Sec. 3): no critic and no group baseline; the return of every token
    (outcome reward, gamma = 1: the response's reward R_i) is normalised over the whole batch's action tokens (those
    that enter the loss; multi-turn tool output is not one)::

        A_i,t = (R_i - mean_tokens(R)) / sqrt(var_tokens(R) + 1e-8)

    (verl's ``masked_whiten``: token-weighted mean, unbiased token variance). Groups are not read.
    """
    g = _Groups.of("reinforce_plus_plus", scores, group_index, eps)
    return _token_whiten(g.scores, token_counts, "reinforce_plus_plus")


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    scores: Tensor,
    group_index: Tensor,
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
    token_counts: Tensor | None = None,
) -> Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262, the group-baseline variant): subtract the group mean reward, then
    whiten over the batch's tokens like ``reinforce_plus_plus``::

        A_i,t = whiten_tokens( R_i - mean(R_group) )
    """
    g = _Groups.of("reinforce_plus_plus_baseline", scores, group_index, eps)
    centered = torch.where(g.constant, torch.zeros_like(g.scores), g.scores - g.mean)
    return _token_whiten(centered, token_counts, "reinforce_plus_plus_baseline")


@register_adv_estimator("grpo_passk")
def compute_grpo_passk_outcome_advantage(
    scores: Tensor,
    group_index: Tensor,
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
    token_counts: Tensor | None = None,
) -> Tensor:
    """Pass@k GRPO, as verl's ``grpo_passk`` (which cites arXiv 2503.19595): only the best response of a group learns,
    from the margin over the second best (with 0/1 rewards: a group solved by exactly one sample pushes that sample
    up; a group solved by two or more, or by none, gives no signal)::

        A_best = (R_max - R_second) / (std(R_group) + eps)    (no division with norm_adv_by_std=False),  others 0

    Every group needs >= 2 responses. Among tied best responses the first one (lowest position) is "the best"; a
    tie for first place gives a margin of 0 anyway.
    """
    g = _Groups.of("grpo_passk", scores, group_index, eps)
    if bool((g.size < 2).any()):
        raise ValueError("grpo_passk: every group needs at least 2 responses (rollout.n >= 2)")
    adv = torch.zeros_like(g.scores)
    for group in range(g.num_groups):
        members = (g.dense_group == group).nonzero().flatten()
        values = g.scores[members]
        first_best = int((values == values.max()).nonzero()[0])
        best = members[first_best]
        margin = values[first_best] - torch.cat([values[:first_best], values[first_best + 1 :]]).max()
        adv[best] = margin / (g.std[best] + eps) if norm_adv_by_std else margin
    return adv


def broadcast_advantage(adv: Tensor, response_mask: Tensor) -> Tensor:
    """Give each response token its sequence's advantage: ``A_{i,t} = A_i`` on valid tokens, 0 on padding (Eq. 9-10)."""
    if adv.dim() != 1 or response_mask.dim() != 2 or adv.shape[0] != response_mask.shape[0]:
        raise ValueError(
            "broadcast_advantage: expected adv [B] and response_mask [B, T], "
            f"got adv{tuple(adv.shape)} and response_mask{tuple(response_mask.shape)}"
        )
    token_adv = adv.unsqueeze(1).expand(response_mask.shape)
    return torch.where(response_mask.bool(), token_adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
