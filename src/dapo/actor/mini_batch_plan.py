"""The plan of one mini-batch on one rank: which samples it trains, cut into which micro-batches, divided by which
whole-mini-batch counts, and with how many zero-weight padding passes. Built once per mini-batch from the config
(:func:`plan_mini_batch`); ``dapo.actor.update.accumulate_mini_batch_gradients`` runs it and plans nothing itself.

Samples that cannot move the policy are left out of the cut: those with ``sample_mask`` False (overlong filtering),
and, when the entropy and KL terms are off (DAPO) and the policy loss allows it
(``PolicyLoss.zero_advantage_no_gradient``; every loss but Clip-Cov / KL-Cov), those whose advantage is exactly 0
(``dapo.actor.update`` says why their gradient is exactly 0). They still count in the normalisers.

Under data parallelism each rank trains a token-balanced share of whole groups. A sharded actor
(``actor.strategy=fsdp2``) runs collectives inside every forward and backward, so every rank must run the same number
of micro-batch passes per mini-batch, which token-balanced shares and skipped zero-advantage samples do not give.
Every rank plans every rank's micro-batches (the same plan everywhere, from the same batch, with no collective) and
the ranks with fewer add zero-weight passes (``padding_micro_batches``): a real one-sample micro-batch whose loss is
multiplied by 0.0, so its gradient is exactly zero and the update is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dapo.actor.batch import TrainBatch
from dapo.actor.direct_distillation import DirectDistillation
from dapo.actor.micro_batching import padding_micro_batches, plan_micro_batches
from dapo.core.loss_aggregation import count_loss_normalizers
from dapo.core.policy_loss import get_policy_loss
from dapo.distributed.data_parallel import balanced_group_shares
from dapo.distributed.world import World

if TYPE_CHECKING:
    from dapo.config import ActorConfig

__all__ = [
    "MicroBatchCut",
    "MiniBatchPlan",
    "ShardedShare",
    "cut_micro_batches",
    "plan_mini_batch",
    "rank_share",
    "rank_shares",
    "sharded_share",
    "trained_samples",
]


def trained_samples(
    mini_batch: TrainBatch, cfg: ActorConfig, distillation: DirectDistillation | None = None
) -> list[int]:
    """Indices of the samples whose gradient can be non-zero: kept by ``sample_mask``, and, unless an entropy, KL or
    direct distillation term is on or the policy loss needs them (``PolicyLoss.zero_advantage_no_gradient``), with a
    non-zero advantage (``dapo.actor.update``'s docstring says why the others contribute exactly 0); with per-token
    advantages (``token_advantages``) a sample is trained when any of its tokens has one."""
    keep = mini_batch.sample_mask.clone()
    if mini_batch.token_mask is not None:  # every token rejected (rollout correction): nothing left to train
        keep &= mini_batch.loss_mask().any(dim=1)
    skippable = get_policy_loss(cfg.policy_loss.loss_mode).zero_advantage_no_gradient
    if cfg.entropy_coeff == 0.0 and not cfg.use_kl_loss and skippable and distillation is None:
        if mini_batch.token_advantages is not None:
            keep &= torch.tensor([bool((a != 0).any()) for a in mini_batch.token_advantages], dtype=torch.bool)
        else:
            keep &= mini_batch.advantages != 0
    return keep.nonzero().flatten().tolist()


def rank_shares(mini_batch: TrainBatch, world_size: int) -> list[TrainBatch]:
    """Every rank's whole groups of ``mini_batch``, balanced by tokens across ranks (the same plan on every rank)."""
    bounds = mini_batch.group_boundaries()
    lengths = mini_batch.sequence_lengths
    shares = balanced_group_shares([sum(lengths[start:end]) for start, end in bounds], world_size)
    return [mini_batch.select([i for g in share for i in range(*bounds[g])]) for share in shares]


def rank_share(mini_batch: TrainBatch, world: World) -> TrainBatch:
    """This rank's whole groups of ``mini_batch`` (see :func:`rank_shares`)."""
    return rank_shares(mini_batch, world.world_size)[world.rank]


@dataclass(frozen=True)
class MicroBatchCut:
    """The samples of a mini-batch (or of a rank's share) that can have a gradient, cut into micro-batches."""

    micro_batches: list[list[int]]  # indices into the mini-batch
    num_oversized: int = 0
    num_zero_advantage: int = 0


def cut_micro_batches(
    mini_batch: TrainBatch, cfg: ActorConfig, layout: str, distillation: DirectDistillation | None = None
) -> MicroBatchCut:
    """The trained samples of ``mini_batch`` (:func:`trained_samples`) planned into micro-batches by ``cfg``."""
    active = trained_samples(mini_batch, cfg, distillation)
    lengths, prompt_lengths = mini_batch.sequence_lengths, mini_batch.prompt_lengths
    groups = mini_batch.group_index.tolist()
    plan = plan_micro_batches(
        [lengths[i] for i in active],
        use_dynamic_bsz=cfg.use_dynamic_bsz,
        max_token_len=cfg.ppo_max_token_len_per_gpu,
        micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
        layout=layout,
        prompt_lengths=[prompt_lengths[i] for i in active],
        prompt_keys=[groups[i] for i in active],
    )
    return MicroBatchCut(
        [[active[j] for j in mb] for mb in plan.micro_batches],
        plan.num_oversized,
        int(mini_batch.sample_mask.sum()) - len(active),
    )


@dataclass(frozen=True)
class ShardedShare:
    """What one rank of a sharded actor trains on in a mini-batch: its share, its cut, and how many zero-weight
    passes over ``filler`` (a one-sample batch) bring its micro-batch count up to the largest of any rank."""

    share: TrainBatch
    cut: MicroBatchCut
    num_padding: int
    filler: TrainBatch


def sharded_share(
    mini_batch: TrainBatch, cfg: ActorConfig, world: World, layout: str, distillation: DirectDistillation | None = None
) -> ShardedShare:
    """This rank's share of ``mini_batch`` with its padding (see the module docstring).

    Every rank cuts every rank's share of the same mini-batch, so the counts agree without a collective. The filler
    is a real sample (the share's first, or the mini-batch's first when the share is empty), so its pass runs the
    same modules as any micro-batch; multiplied by exactly 0.0, its loss adds exactly zero to every gradient.
    """
    shares = rank_shares(mini_batch, world.world_size)
    cuts = [cut_micro_batches(share, cfg, layout, distillation) for share in shares]
    mine = shares[world.rank]
    filler = mine.select([0]) if len(mine) else mini_batch.select([0])
    return ShardedShare(
        mine, cuts[world.rank], padding_micro_batches([len(c.micro_batches) for c in cuts], world.rank), filler
    )


@dataclass(frozen=True)
class MiniBatchPlan:
    """One mini-batch as this rank trains it: the one place its counts come from, read by every objective and every
    aggregation mode (``dapo.core.loss_aggregation``), whatever the world size or strategy.

    Attributes:
        share: the samples this rank trains (the whole mini-batch on one process; a share of whole groups otherwise).
        num_tokens, num_seqs: the WHOLE mini-batch's valid tokens and sequences with >= 1 valid token (Eq. 12's
            normalisers), so that summing the micro-batch (and rank) losses gives the uncut mini-batch loss.
        norm_length: the constant length of ``seq-mean-token-sum-norm``.
        micro_batches: indices into ``share``, each one forward/backward; every response is whole in one of them,
            so per-sequence quantities (GSPO's and GMPO's sequence ratios) see the complete sequence.
        layout: the micro-batch layout the cut was planned for, and the one its forwards run in
            (``dapo.actor.log_probs.resolve_layout``).
        num_oversized, num_zero_advantage: counts of the cut, for the metrics.
        padding: (filler batch, count) of zero-weight passes a sharded rank adds (see the module docstring).
    """

    share: TrainBatch
    num_tokens: int
    num_seqs: int
    norm_length: int
    micro_batches: list[list[int]]
    layout: str
    num_oversized: int = 0
    num_zero_advantage: int = 0
    padding: tuple[TrainBatch, int] | None = None


def plan_mini_batch(
    mini_batch: TrainBatch,
    cfg: ActorConfig,
    *,
    layout: str,
    norm_length: int,
    world: World | None = None,
    sharded: bool = False,
    distillation: DirectDistillation | None = None,
) -> MiniBatchPlan:
    """The plan of ``mini_batch`` on this rank of ``world``: the whole of it on one process, a token-balanced share of
    whole groups under data parallelism, with zero-weight padding passes under a sharded actor (``sharded``)."""
    num_tokens, num_seqs = count_loss_normalizers(mini_batch.loss_mask())
    if world is None or not world.distributed:
        share, padding = mini_batch, None
        cut = cut_micro_batches(share, cfg, layout, distillation) if num_tokens else MicroBatchCut([])
    elif sharded:  # every rank runs the same number of micro-batch passes
        planned = sharded_share(mini_batch, cfg, world, layout, distillation)
        share, cut, padding = planned.share, planned.cut, (planned.filler, planned.num_padding)
    else:
        share, padding = rank_share(mini_batch, world), None
        cut = cut_micro_batches(share, cfg, layout, distillation) if num_tokens else MicroBatchCut([])
    return MiniBatchPlan(
        share,
        num_tokens,
        num_seqs,
        norm_length,
        cut.micro_batches,
        layout,
        cut.num_oversized,
        cut.num_zero_advantage,
        padding,
    )
