"""Dynamic Sampling (DAPO Section 3.2, Eq. 11): which prompt groups carry a gradient.

A group where every answer has the same accuracy has zero reward variance, so every advantage is 0 (Eq. 9) and the
group contributes no gradient, only noise in the batch size. ``filter_informative_groups`` enforces the Eq. 11
constraint ``0 < |{o_i : is_equivalent(a, o_i)}| < G`` on raw accuracy (never on the shaped reward, where a length
penalty could make an all-wrong group look informative) and returns, in one pass, the decision per group and the
counts the monitoring needs. Collecting kept groups across generation rounds until a batch is full is state, and lives
in ``dapo.training.dynamic_sampling_buffer``.

``solved_in_recent_epochs`` is the pure rule behind skipping solved prompts before generation (the per-prompt record
it reads is state, kept by ``dapo.data.prompt_sampler``): a prompt that every sample answered correctly in each of its
last ``k`` epochs would most likely form an all-correct group again, which Eq. 11 drops after its tokens were paid for.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GroupFilterResult:
    """Eq. 11 applied to one generation round.

    Attributes:
        group_ids: ``[G]`` the distinct group ids, ascending.
        keep: ``[G]`` bool, True for a group with ``0 < #correct < size`` (a group of one is never kept).
        keep_sample: ``[B]`` bool, ``keep`` of each sample's group.
        pass_rate: ``[G]`` float, the fraction of each group's samples that are correct.
        num_all_correct: groups whose answers are all right.
        num_all_wrong: groups whose answers are all wrong.
    """

    group_ids: Tensor
    keep: Tensor
    keep_sample: Tensor
    pass_rate: Tensor
    num_all_correct: int
    num_all_wrong: int

    @property
    def num_groups(self) -> int:
        return int(self.keep.numel())

    @property
    def num_kept(self) -> int:
        """``num_groups - num_all_correct - num_all_wrong``."""
        return int(self.keep.sum())


def filter_informative_groups(acc: Tensor, group_index: Tensor) -> GroupFilterResult:
    """Decide Eq. 11 for every group of a round, and count the all-correct and all-wrong ones.

    Args:
        acc: ``[B]`` raw accuracy of each response, bool or 0/1.
        group_index: ``[B]`` integer prompt-group id of each response; any ids, in any order.
    """
    if acc.dim() != 1 or group_index.dim() != 1 or acc.shape != group_index.shape:
        raise ValueError(
            "dynamic sampling: acc and group_index must both be 1-D with the same length, "
            f"got acc{tuple(acc.shape)} and group_index{tuple(group_index.shape)}"
        )
    if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
        raise TypeError(f"dynamic sampling: group_index must be an integer tensor, got {group_index.dtype}")
    if acc.dtype != torch.bool:
        not_binary = (acc != 0) & (acc != 1)
        if bool(not_binary.any()):
            bad = acc[not_binary][:5].tolist()
            raise ValueError(
                f"dynamic sampling: acc must be raw 0/1 or bool accuracy (not a shaped reward), got e.g. {bad}"
            )
    group_ids, dense_group = torch.unique(group_index, return_inverse=True)
    zeros = torch.zeros(group_ids.numel(), dtype=torch.long, device=acc.device)
    num_correct = zeros.index_add(0, dense_group, acc.bool().long())
    group_size = zeros.index_add(0, dense_group, torch.ones_like(dense_group))
    keep = (num_correct > 0) & (num_correct < group_size)
    return GroupFilterResult(
        group_ids=group_ids,
        keep=keep,
        keep_sample=keep[dense_group],
        pass_rate=num_correct.double() / group_size.double(),
        num_all_correct=int((num_correct == group_size).sum()),
        num_all_wrong=int((num_correct == 0).sum()),
    )


def solved_in_recent_epochs(history: Sequence[tuple[int, float]], epochs: int) -> bool:
    """True when the prompt was solved by every sample (pass rate 1) in each of the last ``epochs`` epochs it was seen.

    ``history`` is the prompt's ``(epoch, pass_rate)`` entries in the order they were recorded; epochs it was not
    sampled in do not count, and an epoch where it was sampled more than once counts as solved only if every time was.
    Such a prompt would likely give an all-correct group, which Eq. 11 (``0 < #correct < G``) drops: skipping it before
    generation saves those tokens. Fewer than ``epochs`` epochs seen is never "solved".
    """
    if epochs < 1:
        raise ValueError(f"solved_in_recent_epochs: epochs must be >= 1, got {epochs}")
    solved_by_epoch: dict[int, bool] = {}
    for epoch, rate in history:
        solved_by_epoch[epoch] = solved_by_epoch.get(epoch, True) and rate >= 1.0
    recent = sorted(solved_by_epoch)[-epochs:]
    return len(recent) == epochs and all(solved_by_epoch[e] for e in recent)
