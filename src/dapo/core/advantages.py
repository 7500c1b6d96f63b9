"""Group-relative outcome advantages (GRPO / DAPO Eq. 9) and the advantage-estimator registry.

Every response of a prompt group shares one scalar reward; its advantage is that reward standardised within the group,
then the same value is given to each of its response tokens (``broadcast_advantage``).

Registry: a config string picks an estimator with ``get_adv_estimator(name)``. Only ``"grpo"`` is registered. Dr. GRPO
(no division by the group std) is the ``norm_adv_by_std=False`` flag of the same estimator, not a separate name, so a
config has one switch for it rather than two that could disagree.
"""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor


class AdvantageEstimator(Protocol):
    """What a registered estimator looks like: per-sample scores and group ids in, per-sample advantages out."""

    def __call__(
        self, scores: Tensor, group_index: Tensor, *, norm_adv_by_std: bool = True, eps: float = 1e-6
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
    scores: Tensor, group_index: Tensor, *, norm_adv_by_std: bool = True, eps: float = 1e-6
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

    Returns:
        ``[B]`` advantages, float32 (float64 when ``scores`` is float64).
    """
    if scores.dim() != 1 or group_index.dim() != 1 or scores.shape != group_index.shape:
        raise ValueError(
            "compute_grpo_outcome_advantage: scores and group_index must both be 1-D with the same length, "
            f"got scores{tuple(scores.shape)} and group_index{tuple(group_index.shape)}"
        )
    if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
        raise TypeError(
            f"compute_grpo_outcome_advantage: group_index must be an integer tensor, got {group_index.dtype}"
        )
    if eps < 0:
        raise ValueError(f"compute_grpo_outcome_advantage: eps must be >= 0, got {eps}")
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    scores = scores.to(dtype)
    if not bool(torch.isfinite(scores).all()):
        bad = torch.nonzero(~torch.isfinite(scores)).flatten().tolist()
        raise ValueError(
            f"compute_grpo_outcome_advantage: scores must be finite, got non-finite values at positions {bad}"
        )

    _, dense_group = torch.unique(group_index, return_inverse=True)
    num_groups = int(dense_group.max()) + 1 if dense_group.numel() else 0
    zeros = torch.zeros(num_groups, dtype=dtype, device=scores.device)
    group_size = zeros.index_add(0, dense_group, torch.ones_like(scores))
    group_mean = zeros.index_add(0, dense_group, scores) / group_size
    centered = scores - group_mean[dense_group]
    if norm_adv_by_std:
        sum_sq = zeros.index_add(0, dense_group, centered.square())
        group_std = (sum_sq / (group_size - 1).clamp(min=1)).sqrt()
        centered = centered / (group_std[dense_group] + eps)
    group_max = torch.full_like(zeros, -torch.inf).scatter_reduce(0, dense_group, scores, reduce="amax")
    group_min = torch.full_like(zeros, torch.inf).scatter_reduce(0, dense_group, scores, reduce="amin")
    constant_group = (group_max == group_min)[dense_group]
    return torch.where(constant_group, torch.zeros_like(centered), centered)


def broadcast_advantage(adv: Tensor, response_mask: Tensor) -> Tensor:
    """Give each response token its sequence's advantage: ``A_{i,t} = A_i`` on valid tokens, 0 on padding (Eq. 9-10)."""
    if adv.dim() != 1 or response_mask.dim() != 2 or adv.shape[0] != response_mask.shape[0]:
        raise ValueError(
            "broadcast_advantage: expected adv [B] and response_mask [B, T], "
            f"got adv{tuple(adv.shape)} and response_mask{tuple(response_mask.shape)}"
        )
    token_adv = adv.unsqueeze(1).expand(response_mask.shape)
    return torch.where(response_mask.bool(), token_adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
