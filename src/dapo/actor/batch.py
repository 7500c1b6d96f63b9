"""The actor's input: a batch of (prompt, response, advantage) samples, grouped by prompt.

Per-sample token sequences have different lengths, so they are kept as lists of 1-D tensors (no padding); per-sample
scalars are 1-D tensors of length B. Per-token log-probabilities (old / rollout / reference) are lists of 1-D float
tensors, one per response, each exactly as long as its response. Padding happens only where a [B, T] tensor is needed
(the loss functions), via :func:`pad_per_token`.

DAPO samples ``n`` responses per prompt; the ``n`` samples of a prompt form a *group* and are contiguous in the batch.
A PPO mini-batch is a whole number of groups (``ppo_mini_batch_size`` is counted in prompts, as in the paper and verl),
so :meth:`TrainBatch.split_into_mini_batches` never cuts a group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TrainBatch", "pad_per_token"]


def _as_token_tensor(seq: Sequence[int] | Tensor, what: str, index: int) -> Tensor:
    if isinstance(seq, Tensor):
        tensor = seq
    else:
        items = list(seq)
        tensor = torch.tensor(items) if items else torch.zeros(0, dtype=torch.long)
    if tensor.dim() != 1:
        raise ValueError(f"TrainBatch.{what}[{index}] must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.dtype != torch.long:
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            raise ValueError(f"TrainBatch.{what}[{index}] must hold integer token ids, got dtype {tensor.dtype}")
        tensor = tensor.long()
    if tensor.numel() == 0:
        raise ValueError(f"TrainBatch.{what}[{index}] is empty; every prompt and response needs at least one token")
    return tensor


@dataclass(frozen=True)
class TrainBatch:
    """B samples for a policy update.

    Attributes:
        prompt_ids: B 1-D long tensors (lists of ints are converted), the prompt tokens of each sample.
        response_ids: B 1-D long tensors, the generated tokens of each sample.
        advantages: [B] float, one advantage per sample, broadcast over its response tokens (GRPO, Eq. 9).
        sample_mask: [B] bool; False excludes every token of the sample from the loss (overlong filtering).
        group_index: [B] long, the prompt-group id of each sample; samples of a group are contiguous.
        old_log_probs: per-response log-probs under the policy that is being updated from (pi_theta_old), or None
            (the actor then recomputes them before the update).
        rollout_log_probs: per-response log-probs reported by the inference engine, carried for diagnostics.
        ref_log_probs: per-response log-probs under the reference policy; needed only for the optional KL loss.
        is_weights: per-response, per-token truncated importance weights pi_old / mu (rollout correction) that scale
            each token's policy-gradient loss, or None (weight 1).
        token_mask: per-response bool tensors, False on tokens rejected from the loss (token-level rejection
            sampling, ``dapo.core.rollout_correction.rejection_mask``), or None (every token kept).
        token_advantages: per-response, per-token advantages that replace the broadcast ``advantages`` in the policy
            loss (on-policy distillation's PG OPD: the teacher's signal per token, plus the reward's advantage), or
            None (every token of a response takes its sample's advantage).
        teacher_log_probs: per-response log-probs of the sampled tokens under the distillation teacher, for a
            distillation loss backpropagated directly (``DirectDistillation``), or None.
        teacher_topk_log_probs, teacher_topk_ids: per-response ``[len, k]`` teacher log-probs of its k most likely
            tokens at each position and their ids (``forward_kl_topk``), or None.
        action_mask: per-response bool tensors, True on the tokens the policy sampled and False on context inside the
            response (a tool's output in a multi-turn trajectory), or None (every response token is an action). Only
            actions enter the loss, the entropy and the token counts (:meth:`loss_mask`).
        routed_experts: per sample ``[prompt + response tokens, MoE layers, k]`` integer expert ids that the actor's
            passes route each token to (router replay, :mod:`dapo.model.router_replay`; -1: route that token live),
            or None (every token routes live).
    """

    prompt_ids: list[Tensor]
    response_ids: list[Tensor]
    advantages: Tensor
    sample_mask: Tensor
    group_index: Tensor
    old_log_probs: list[Tensor] | None = None
    rollout_log_probs: list[Tensor] | None = None
    ref_log_probs: list[Tensor] | None = None
    is_weights: list[Tensor] | None = None
    token_mask: list[Tensor] | None = None
    action_mask: list[Tensor] | None = None
    token_advantages: list[Tensor] | None = None
    teacher_log_probs: list[Tensor] | None = None
    teacher_topk_log_probs: list[Tensor] | None = None
    teacher_topk_ids: list[Tensor] | None = None
    routed_experts: list[Tensor] | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        if len(self.response_ids) != n:
            raise ValueError(f"TrainBatch: {n} prompts but {len(self.response_ids)} responses")
        prompts = [_as_token_tensor(p, "prompt_ids", i) for i, p in enumerate(self.prompt_ids)]
        responses = [_as_token_tensor(r, "response_ids", i) for i, r in enumerate(self.response_ids)]
        object.__setattr__(self, "prompt_ids", prompts)
        object.__setattr__(self, "response_ids", responses)

        for name in ("advantages", "sample_mask", "group_index"):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or value.shape != (n,):
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"TrainBatch.{name} must be a tensor of shape ({n},), got {shape}")
        if not self.advantages.is_floating_point():
            raise ValueError(f"TrainBatch.advantages must be floating point, got {self.advantages.dtype}")
        if not torch.isfinite(self.advantages).all():
            bad = torch.nonzero(~torch.isfinite(self.advantages)).flatten().tolist()
            raise ValueError(f"TrainBatch.advantages has non-finite values at samples {bad[:10]}")
        if self.sample_mask.dtype != torch.bool:
            raise ValueError(f"TrainBatch.sample_mask must be bool, got {self.sample_mask.dtype}")
        if self.group_index.dtype != torch.long:
            raise ValueError(f"TrainBatch.group_index must be long, got {self.group_index.dtype}")
        if n > 0:
            starts = self.group_index[1:] != self.group_index[:-1]
            distinct_runs = int(starts.sum()) + 1
            if distinct_runs != int(torch.unique(self.group_index).numel()):
                raise ValueError("TrainBatch.group_index: the samples of each group must be contiguous")

        for name in (
            "old_log_probs",
            "rollout_log_probs",
            "ref_log_probs",
            "is_weights",
            "token_advantages",
            "teacher_log_probs",
        ):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != n:
                raise ValueError(f"TrainBatch.{name} has {len(values)} entries for {n} samples")
            for i, (lp, resp) in enumerate(zip(values, responses, strict=True)):
                if not isinstance(lp, Tensor) or lp.shape != resp.shape or not lp.is_floating_point():
                    got = f"{tuple(lp.shape)} {lp.dtype}" if isinstance(lp, Tensor) else type(lp).__name__
                    raise ValueError(
                        f"TrainBatch.{name}[{i}] must be a float tensor of shape {tuple(resp.shape)} "
                        f"(its response length), got {got}"
                    )
        for name in ("teacher_topk_log_probs", "teacher_topk_ids"):  # [len, k] per response
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != n:
                raise ValueError(f"TrainBatch.{name} has {len(values)} entries for {n} samples")
            for i, (v, resp) in enumerate(zip(values, responses, strict=True)):
                if not isinstance(v, Tensor) or v.dim() != 2 or v.shape[0] != resp.numel():
                    got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                    raise ValueError(
                        f"TrainBatch.{name}[{i}] must be [{resp.numel()}, k] (its response length), got {got}"
                    )
        if self.routed_experts is not None:
            if len(self.routed_experts) != n:
                raise ValueError(f"TrainBatch.routed_experts has {len(self.routed_experts)} entries for {n} samples")
            for i, (r, p, resp) in enumerate(zip(self.routed_experts, prompts, responses, strict=True)):
                tokens = int(p.numel() + resp.numel())
                if not isinstance(r, Tensor) or r.dim() != 3 or r.shape[0] != tokens or r.is_floating_point():
                    got = f"{tuple(r.shape)} {r.dtype}" if isinstance(r, Tensor) else type(r).__name__
                    raise ValueError(
                        f"TrainBatch.routed_experts[{i}] must be integer [{tokens}, layers, k] (its "
                        f"prompt + response tokens), got {got}"
                    )
        if self.token_advantages is not None:
            bad = [i for i, a in enumerate(self.token_advantages) if not bool(torch.isfinite(a).all())]
            if bad:
                raise ValueError(f"TrainBatch.token_advantages has non-finite values in samples {bad[:10]}")
        for name in ("token_mask", "action_mask"):  # per-token bool masks over the response
            masks = getattr(self, name)
            if masks is None:
                continue
            if len(masks) != n:
                raise ValueError(f"TrainBatch.{name} has {len(masks)} entries for {n} samples")
            for i, (m, resp) in enumerate(zip(masks, responses, strict=True)):
                if not isinstance(m, Tensor) or m.shape != resp.shape or m.dtype != torch.bool:
                    got = f"{tuple(m.shape)} {m.dtype}" if isinstance(m, Tensor) else type(m).__name__
                    raise ValueError(
                        f"TrainBatch.{name}[{i}] must be a bool tensor of shape {tuple(resp.shape)} "
                        f"(its response length), got {got}"
                    )

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def prompt_lengths(self) -> list[int]:
        return [int(p.numel()) for p in self.prompt_ids]

    @property
    def response_lengths(self) -> list[int]:
        return [int(r.numel()) for r in self.response_ids]

    @property
    def sequence_lengths(self) -> list[int]:
        """Prompt + response tokens per sample: the cost of a sample in a packed forward pass."""
        return [int(p.numel() + r.numel()) for p, r in zip(self.prompt_ids, self.response_ids, strict=True)]

    def group_boundaries(self) -> list[tuple[int, int]]:
        """(start, end) sample ranges of the groups, in batch order."""
        n = len(self)
        if n == 0:
            return []
        change = torch.nonzero(self.group_index[1:] != self.group_index[:-1]).flatten() + 1
        edges = [0, *change.tolist(), n]
        return list(zip(edges[:-1], edges[1:], strict=True))

    @property
    def num_groups(self) -> int:
        return len(self.group_boundaries())

    def select(self, indices: Sequence[int]) -> TrainBatch:
        """A new batch with the given samples, in the given order (the caller keeps groups contiguous)."""
        idx = [int(i) for i in indices]
        n = len(self)
        for i in idx:
            if not 0 <= i < n:
                raise IndexError(f"TrainBatch.select: index {i} out of range for {n} samples")
        index = torch.tensor(idx, dtype=torch.long)

        def pick(values: list[Tensor] | None) -> list[Tensor] | None:
            return None if values is None else [values[i] for i in idx]

        return TrainBatch(
            prompt_ids=[self.prompt_ids[i] for i in idx],
            response_ids=[self.response_ids[i] for i in idx],
            advantages=self.advantages[index],
            sample_mask=self.sample_mask[index],
            group_index=self.group_index[index],
            old_log_probs=pick(self.old_log_probs),
            rollout_log_probs=pick(self.rollout_log_probs),
            ref_log_probs=pick(self.ref_log_probs),
            is_weights=pick(self.is_weights),
            token_mask=pick(self.token_mask),
            action_mask=pick(self.action_mask),
            token_advantages=pick(self.token_advantages),
            teacher_log_probs=pick(self.teacher_log_probs),
            teacher_topk_log_probs=pick(self.teacher_topk_log_probs),
            teacher_topk_ids=pick(self.teacher_topk_ids),
            routed_experts=pick(self.routed_experts),
        )

    def split_into_mini_batches(
        self, groups_per_mini_batch: int, *, generator: torch.Generator | None = None, shuffle: bool = False
    ) -> list[TrainBatch]:
        """Cut the batch into mini-batches of ``groups_per_mini_batch`` whole groups.

        With ``shuffle`` the groups are permuted first (samples stay together within their group). When the number of
        groups is not a multiple of ``groups_per_mini_batch`` the last mini-batch holds the remainder.
        """
        if groups_per_mini_batch < 1:
            raise ValueError(f"groups_per_mini_batch must be >= 1, got {groups_per_mini_batch}")
        bounds = self.group_boundaries()
        if shuffle:
            order = torch.randperm(len(bounds), generator=generator).tolist()
            bounds = [bounds[i] for i in order]
        mini_batches = []
        for first in range(0, len(bounds), groups_per_mini_batch):
            chosen = bounds[first : first + groups_per_mini_batch]
            mini_batches.append(self.select([i for start, end in chosen for i in range(start, end)]))
        return mini_batches

    def with_old_log_probs(self, old_log_probs: list[Tensor]) -> TrainBatch:
        """A copy of the batch carrying ``old_log_probs`` (validated like the constructor's)."""
        return dataclasses.replace(self, old_log_probs=old_log_probs)

    def with_routed_experts(self, routed_experts: list[Tensor] | None) -> TrainBatch:
        """A copy of the batch whose actor passes replay ``routed_experts`` (None: route live)."""
        return dataclasses.replace(self, routed_experts=routed_experts)

    def with_is_weights(self, is_weights: list[Tensor]) -> TrainBatch:
        """A copy of the batch carrying per-token importance weights (validated like the constructor's)."""
        return dataclasses.replace(self, is_weights=is_weights)

    def loss_mask(self) -> Tensor:
        """[B, T_max] bool: True on response tokens of samples kept by ``sample_mask`` (T_max = longest response) that
        are actions (``action_mask``; tool output is not) and not rejected by ``token_mask``."""
        lengths = torch.tensor(self.response_lengths, dtype=torch.long)
        width = int(lengths.max()) if len(self) > 0 else 0
        in_response = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        mask = in_response & self.sample_mask.unsqueeze(1)
        if self.token_mask is not None and len(self) > 0:
            mask &= pad_per_token([m.to(torch.uint8) for m in self.token_mask], width).bool()
        if self.action_mask is not None and len(self) > 0:
            mask = mask & pad_per_token(self.action_mask, width)
        return mask


def pad_per_token(values: Sequence[Tensor], width: int | None = None, pad_value: float = 0.0) -> Tensor:
    """Right-pad B 1-D tensors into a [B, width] tensor (width defaults to the longest)."""
    if len(values) == 0:
        raise ValueError("pad_per_token: no tensors to pad")
    longest = max(int(v.numel()) for v in values)
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"pad_per_token: width {width} is shorter than the longest tensor ({longest})")
    out = values[0].new_full((len(values), width), pad_value)
    for row, v in enumerate(values):
        out[row, : v.numel()] = v
    return out
