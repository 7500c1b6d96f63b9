"""Builders for the actor tests: random (seeded) train batches, configs, plans. The tiny Qwen2 is
:func:`tests.harness.models.tiny_qwen2` at the ``ACTOR`` shape; the other families (a Llama among them) are
:func:`tests.model.families.build_tiny_model`."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import resolve_layout
from dapo.actor.mini_batch_plan import MiniBatchPlan, plan_mini_batch
from dapo.config import ActorConfig
from tests.harness.models import ACTOR

VOCAB = ACTOR["vocab_size"]  # the tiny Qwen2's (a larger vocabulary holds these tokens too)


def random_batch(
    num_groups: int,
    group_size: int,
    *,
    seed: int = 0,
    max_prompt: int = 6,
    max_response: int = 8,
    masked: tuple[int, ...] = (),
) -> TrainBatch:
    """Random prompts/responses (lengths >= 1), N(0, 1) advantages, samples in ``masked`` excluded from the loss; the
    samples of a group share their prompt, as in every RL batch (the shared-prompt layout runs it once)."""
    g = torch.Generator().manual_seed(seed)
    n = num_groups * group_size

    def tokens(max_len: int) -> torch.Tensor:
        length = int(torch.randint(1, max_len + 1, (1,), generator=g))
        return torch.randint(0, VOCAB, (length,), generator=g)

    group_prompts = [tokens(max_prompt) for _ in range(num_groups)]
    prompts = [group_prompts[i // group_size] for i in range(n)]
    responses = [tokens(max_response) for _ in range(n)]
    sample_mask = torch.ones(n, dtype=torch.bool)
    sample_mask[list(masked)] = False
    return TrainBatch(
        prompt_ids=prompts,
        response_ids=responses,
        advantages=torch.randn(n, generator=g),
        sample_mask=sample_mask,
        group_index=torch.arange(num_groups).repeat_interleave(group_size),
    )


def actor_config(**overrides: object) -> ActorConfig:
    """A small fp32 actor config; defaults are the DAPO recipe's loss settings."""
    base: dict[str, object] = dict(
        ppo_mini_batch_size=2,
        ppo_max_token_len_per_gpu=64,
        logprob_chunk_size=16,
        clip_ratio_c=10.0,
    )
    base.update(overrides)
    return ActorConfig(**base)


def plan_of(
    model: nn.Module,
    batch: TrainBatch,
    cfg: ActorConfig,
    *,
    norm_length: int,
    micro_batches: list[list[int]] | None = None,
    padding: tuple[TrainBatch, int] | None = None,
) -> MiniBatchPlan:
    """The single-process plan the update makes of ``batch`` as one mini-batch, with its cut replaced by
    ``micro_batches`` (lists of indices into ``batch``) and its zero-weight passes by ``padding`` when given: how the
    tests try any cut or padding on ``accumulate_mini_batch_gradients``."""
    plan = plan_mini_batch(batch, cfg, layout=resolve_layout(cfg.layout, model), norm_length=norm_length)
    if micro_batches is not None:
        plan = dataclasses.replace(plan, micro_batches=micro_batches)
    if padding is not None:
        plan = dataclasses.replace(plan, padding=padding)
    return plan
