"""The policy update: exact micro-batch gradient accumulation, step counts, learning behaviour, failure handling."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor, nn

from actor_helpers import actor_config, plan_of, random_batch
from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.log_probs import LAYOUTS, compute_log_probs_batch
from dapo.actor.log_probs import uses_activation_checkpointing
from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.actor.update import (
    FirstPassRecord,
    NonFiniteLossError,
    accumulate_mini_batch_gradients,
    configure_model_for_training,
    update_policy,
)
from dapo.config import ActorConfig, OptimConfig
from dapo.core.kl import kl_penalty
from dapo.core.loss_aggregation import LOSS_AGG_MODES, aggregate_loss
from dapo.core.policy_loss import compute_policy_loss
from tests.harness.models import ACTOR, tiny_qwen2

TEMPERATURE = 0.9


def per_sample_log_probs(model: nn.Module, batch: TrainBatch) -> tuple[list[Tensor], list[Tensor]]:
    """Independent path: one plain HF forward per sample, full logits, log_softmax."""
    log_probs, entropies = [], []
    for prompt, response in zip(batch.prompt_ids, batch.response_ids, strict=True):
        logits = model(input_ids=torch.cat([prompt, response]).unsqueeze(0), use_cache=False).logits[0]
        logp = (logits[prompt.numel() - 1 : -1].float() / TEMPERATURE).log_softmax(-1)
        log_probs.append(logp.gather(-1, response.unsqueeze(-1)).squeeze(-1))
        entropies.append(-(logp.exp() * logp).sum(-1))
    return log_probs, entropies


def uncut_gradient(model: nn.Module, batch: TrainBatch, cfg: ActorConfig, norm_length: int) -> dict[str, Tensor]:
    """Gradient of the whole mini-batch's loss in one piece, aggregated with its own counts."""
    model.zero_grad(set_to_none=True)
    log_probs, entropies = per_sample_log_probs(model, batch)
    assert batch.old_log_probs is not None
    log_prob, old = pad_per_token(log_probs), pad_per_token(batch.old_log_probs)
    mask = batch.loss_mask()
    advantages = batch.advantages.unsqueeze(1).expand_as(log_prob)
    out = compute_policy_loss(
        log_prob,
        old,
        advantages,
        mask,
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        clip_ratio_c=cfg.clip_ratio_c,
    )
    loss_mat = out.loss_mat if batch.is_weights is None else out.loss_mat * pad_per_token(batch.is_weights)
    loss = aggregate_loss(loss_mat, mask, cfg.loss_agg_mode, norm_length=norm_length)
    entropy = aggregate_loss(pad_per_token(entropies), mask, cfg.loss_agg_mode, norm_length=norm_length)
    loss = loss - cfg.entropy_coeff * entropy
    if cfg.use_kl_loss:
        assert batch.ref_log_probs is not None
        kl = kl_penalty(log_prob, pad_per_token(batch.ref_log_probs), cfg.kl_loss_type)
        loss = loss + cfg.kl_loss_coef * aggregate_loss(kl, mask, cfg.loss_agg_mode, norm_length=norm_length)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def off_policy_batch(model: nn.Module, seed: int) -> TrainBatch:
    """A mini-batch whose old/ref log-probs are perturbed so that both clip sides and the dual clip are active."""
    batch = random_batch(3, 3, seed=seed, masked=(1, 5))
    batch = TrainBatch(
        prompt_ids=batch.prompt_ids,
        response_ids=batch.response_ids,
        advantages=batch.advantages * 2.0,
        sample_mask=batch.sample_mask,
        group_index=batch.group_index,
    )
    current = compute_log_probs_batch(model, batch, actor_config(), TEMPERATURE)
    g = torch.Generator().manual_seed(seed + 1)
    old = [lp + 0.4 * torch.randn(lp.shape, generator=g) for lp in current]
    ref = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in current]
    return TrainBatch(
        prompt_ids=batch.prompt_ids,
        response_ids=batch.response_ids,
        advantages=batch.advantages,
        sample_mask=batch.sample_mask,
        group_index=batch.group_index,
        old_log_probs=old,
        ref_log_probs=ref,
    )


def random_cut(n: int, seed: int) -> list[list[int]]:
    """A random partition of range(n) into non-empty, unordered micro-batches."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist()
    edges = sorted(set(torch.randint(1, n, (3,), generator=g).tolist()))
    bounds = [0, *edges, n]
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def assert_same_gradients(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert got.keys() == want.keys()
    scale = max(float(g.abs().max()) for g in want.values())
    assert scale > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6 * scale + 1e-7, rtol=1e-4, msg=name)


@pytest.mark.parametrize("loss_agg_mode", LOSS_AGG_MODES)
def test_accumulated_micro_batch_gradient_equals_uncut_mini_batch_gradient(loss_agg_mode: str) -> None:
    model = tiny_qwen2(8, ACTOR)
    model.train()
    batch = off_policy_batch(model, seed=21)
    norm_length = max(batch.response_lengths) + 3
    base = dict(loss_agg_mode=loss_agg_mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3")
    want = uncut_gradient(model, batch, actor_config(**base), norm_length)

    plans: list[tuple[ActorConfig, list[list[int]] | None]] = [
        (actor_config(**base, layout=layout), random_cut(len(batch), seed)) for seed in range(3) for layout in LAYOUTS
    ]
    for layout in LAYOUTS:
        plans += [
            (actor_config(**base, layout=layout, ppo_max_token_len_per_gpu=budget), None)
            for budget in (6, 17, 40, 10_000)
        ]
        plans += [
            (actor_config(**base, layout=layout, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=size), None)
            for size in (1, 4)
        ]
    for cfg, cut in plans:
        model.zero_grad(set_to_none=True)
        result = accumulate_mini_batch_gradients(
            model, plan_of(model, batch, cfg, norm_length=norm_length, micro_batches=cut), cfg, temperature=TEMPERATURE
        )
        assert result.num_micro_batches >= 1
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        assert_same_gradients(got, want)


def test_importance_weights_scale_each_token_loss_under_any_micro_batch_cut() -> None:
    """Rollout correction: the per-token PPO loss times w_t (detached), exact under every cut; w = 1 changes nothing."""
    model = tiny_qwen2(8, ACTOR)
    model.train()
    batch = off_policy_batch(model, seed=22)
    cfg = actor_config(loss_agg_mode="token-mean")
    norm_length = max(batch.response_lengths)
    plain = uncut_gradient(model, batch, cfg, norm_length)
    ones = batch.with_is_weights([torch.ones_like(lp) for lp in batch.old_log_probs])
    model.zero_grad(set_to_none=True)
    accumulate_mini_batch_gradients(
        model, plan_of(model, ones, cfg, norm_length=norm_length), cfg, temperature=TEMPERATURE
    )
    assert_same_gradients({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, plain)

    g = torch.Generator().manual_seed(5)
    weighted = batch.with_is_weights([torch.rand(lp.shape, generator=g) * 2.0 for lp in batch.old_log_probs])
    want = uncut_gradient(model, weighted, cfg, norm_length)
    assert not torch.allclose(next(iter(want.values())), next(iter(plain.values())))
    for seed in range(2):
        model.zero_grad(set_to_none=True)
        plan = plan_of(model, weighted, cfg, norm_length=norm_length, micro_batches=random_cut(len(weighted), seed))
        accumulate_mini_batch_gradients(model, plan, cfg, temperature=TEMPERATURE)
        assert_same_gradients({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, want)


def test_clipping_is_exercised_by_the_gradient_test() -> None:
    """Guards the key test above: its off-policy batch really has clipped tokens, so it tests the clipped loss."""
    model = tiny_qwen2(8, ACTOR)
    batch = off_policy_batch(model, seed=21)
    cfg = actor_config()
    result = accumulate_mini_batch_gradients(
        model, plan_of(model, batch, cfg, norm_length=8), cfg, temperature=TEMPERATURE
    )
    assert result.token_sums["pg_clipfrac"] / result.num_tokens > 0.05


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_checkpointing_gives_the_same_gradient(layout: str) -> None:
    model = tiny_qwen2(8, ACTOR)
    model.train()
    batch = off_policy_batch(model, seed=3)
    cfg = actor_config(ppo_max_token_len_per_gpu=20, layout=layout)
    accumulate_mini_batch_gradients(model, plan_of(model, batch, cfg, norm_length=8), cfg, temperature=TEMPERATURE)
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    # shared_prompt: response passes capped at 6 tokens, so checkpointing recomputes several passes per micro-batch
    checkpointed = actor_config(
        ppo_max_token_len_per_gpu=20, layout=layout, gradient_checkpointing=True, shared_prompt_chunk_tokens=6
    )
    configure_model_for_training(model, checkpointed)
    # The shared-prompt layout checkpoints its own passes: Hugging Face's per-layer checkpointing would drop the
    # KV cache that carries each prompt to its responses, so it stays off.
    assert uses_activation_checkpointing(model) == (layout != "shared_prompt")
    accumulate_mini_batch_gradients(
        model, plan_of(model, batch, checkpointed, norm_length=8), checkpointed, temperature=TEMPERATURE
    )
    assert_same_gradients({n: p.grad.clone() for n, p in model.named_parameters()}, want)


def test_checkpointed_shared_prompt_passes_train_the_other_weights_when_embeddings_are_frozen() -> None:
    # The shared-prompt passes use the reentrant checkpoint, which only runs a backward for a pass with an input that
    # requires grad; the pass's embedded tokens are that input, and frozen embeddings must not silence the rest.
    model = tiny_qwen2(8, ACTOR)
    model.train()
    model.get_input_embeddings().weight.requires_grad_(False)  # tied: the LM head is frozen with it
    batch = off_policy_batch(model, seed=3)
    grads = []
    for checkpointing in (False, True):
        cfg = actor_config(
            ppo_max_token_len_per_gpu=20,
            layout="shared_prompt",
            gradient_checkpointing=checkpointing,
            shared_prompt_chunk_tokens=6,
        )
        accumulate_mini_batch_gradients(model, plan_of(model, batch, cfg, norm_length=8), cfg, temperature=TEMPERATURE)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        model.zero_grad(set_to_none=True)
    assert grads[1] and all(bool(g.abs().sum() > 0) for g in grads[1].values() if g.dim() == 2)
    assert_same_gradients(grads[1], grads[0])


def _optimizer_and_scheduler(
    model: nn.Module, lr: float = 1e-3, warmup: int = 0
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optim_cfg = OptimConfig(lr=lr, lr_warmup_steps=warmup, weight_decay=0.0)
    optimizer = build_optimizer(model, optim_cfg)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg)


def test_one_optimizer_step_per_mini_batch_of_groups_per_epoch() -> None:
    # Miniature of 512 prompts x 16 responses with mini-batches of 32 prompts (16 steps): 8 prompts x 2, mini-batch 2.
    model = tiny_qwen2(0, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model, warmup=100)
    batch = random_batch(8, 2, seed=2, max_prompt=3, max_response=3)
    cfg = actor_config(ppo_mini_batch_size=2, ppo_epochs=2, shuffle=True)
    metrics = update_policy(
        model, optimizer, scheduler, batch, cfg, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    assert metrics["actor/num_optimizer_steps"] == 8.0  # 8 / 2 = 4 steps per epoch, 2 epochs
    assert scheduler.last_epoch == 8
    assert metrics["actor/lr"] == pytest.approx(1e-3 * 8 / 100)  # lr of the 8th step (index 7) of the warm-up
    assert metrics["actor/num_skipped_steps"] == 0.0
    for key in (
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/grad_norm",
        "actor/ratio_mean",
    ):
        assert math.isfinite(metrics[key]), key
    assert 0.0 < metrics["actor/entropy"] <= math.log(40) + 1e-4
    assert metrics["actor/grad_norm"] > 0.0


def test_first_step_is_on_policy() -> None:
    """With old log-probs recomputed by the actor, the first mini-batch sees ratio 1 and nothing clipped."""
    model = tiny_qwen2(0, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model)
    batch = random_batch(2, 2, seed=6)
    metrics = update_policy(model, optimizer, scheduler, batch, actor_config(ppo_mini_batch_size=2), temperature=1.0)
    assert metrics["actor/num_optimizer_steps"] == 1.0
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["actor/pg_clipfrac"] == 0.0


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_update_raises_the_log_prob_of_a_positive_advantage_response(loss_agg_mode: str) -> None:
    model = tiny_qwen2(4, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model, lr=1e-2)
    base = random_batch(1, 2, seed=9)
    batch = TrainBatch(
        prompt_ids=base.prompt_ids,
        response_ids=base.response_ids,
        advantages=torch.tensor([1.0, -1.0]),
        sample_mask=base.sample_mask,
        group_index=base.group_index,
    )
    cfg = actor_config(ppo_mini_batch_size=1, loss_agg_mode=loss_agg_mode)
    before = [float(lp.sum()) for lp in compute_log_probs_batch(model, batch, cfg, 1.0)]
    update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0)
    after = [float(lp.sum()) for lp in compute_log_probs_batch(model, batch, cfg, 1.0)]
    assert after[0] > before[0] + 1e-3
    assert after[1] < before[1] - 1e-3


def test_masked_samples_do_not_move_the_model() -> None:
    """Overlong-filtered samples contribute no gradient: a batch where every sample is masked takes no step."""
    model = tiny_qwen2(4, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model, lr=1e-2)
    batch = random_batch(2, 2, seed=1, masked=(0, 1, 2, 3))
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = update_policy(model, optimizer, scheduler, batch, actor_config(ppo_mini_batch_size=1), temperature=1.0)
    assert metrics["actor/num_optimizer_steps"] == 0.0
    assert metrics["actor/num_micro_batches"] == 0.0
    for n, p in model.named_parameters():
        assert torch.equal(p, snapshot[n])


def test_non_finite_loss_raises_and_drops_gradients() -> None:
    model = tiny_qwen2(0, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model)
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="policy-gradient loss is nan in epoch 0, mini-batch 0"):
        update_policy(model, optimizer, scheduler, random_batch(2, 2, seed=0), actor_config(), temperature=1.0)
    assert all(p.grad is None for p in model.parameters())
    assert scheduler.last_epoch == 0


def test_non_finite_gradient_skips_the_step_with_a_warning() -> None:
    model = tiny_qwen2(0, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model)
    model.model.norm.weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch, cfg = random_batch(2, 2, seed=0), actor_config(ppo_mini_batch_size=2)
    with pytest.warns(RuntimeWarning, match="gradient norm is inf .* step is skipped"):
        metrics = update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0)
    assert metrics["actor/num_skipped_steps"] == 1.0 and metrics["actor/num_optimizer_steps"] == 0.0
    assert scheduler.last_epoch == 0
    for n, p in model.named_parameters():
        assert torch.equal(p, snapshot[n]), n


def test_kl_loss_needs_reference_log_probs() -> None:
    model = tiny_qwen2(0, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model)
    with pytest.raises(ValueError, match="use_kl_loss is set but the batch has no ref_log_probs"):
        update_policy(model, optimizer, scheduler, random_batch(1, 2), actor_config(use_kl_loss=True), temperature=1.0)


def test_bf16_update_keeps_fp32_master_weights_and_learns() -> None:
    model = tiny_qwen2(4, ACTOR)
    optimizer, scheduler = _optimizer_and_scheduler(model, lr=1e-2)
    batch = random_batch(1, 2, seed=9)
    # padded: the layout under which Hugging Face's own activation checkpointing runs
    cfg = actor_config(ppo_mini_batch_size=1, dtype="bf16", gradient_checkpointing=True, layout="padded")
    metrics = update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0)
    assert metrics["actor/num_optimizer_steps"] == 1.0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert uses_activation_checkpointing(model)


def _with_zero_advantage_groups(batch: TrainBatch, groups: tuple[int, ...]) -> TrainBatch:
    advantages = batch.advantages.clone()
    for g in groups:
        advantages[batch.group_index == g] = 0.0
    return TrainBatch(
        prompt_ids=batch.prompt_ids,
        response_ids=batch.response_ids,
        advantages=advantages,
        sample_mask=batch.sample_mask,
        group_index=batch.group_index,
    )


def _trained_weights(batch: TrainBatch, cfg: ActorConfig, *, ref: bool) -> tuple[dict[str, Tensor], dict[str, float]]:
    model = tiny_qwen2(12, ACTOR)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    scheduler = build_lr_scheduler(optimizer, OptimConfig(lr=1e-2, weight_decay=0.1))
    if ref:  # a KL term of weight 0: the same loss, but the actor may not leave zero-advantage samples out
        batch = dataclasses.replace(batch, ref_log_probs=compute_log_probs_batch(model, batch, cfg, 1.0))
    metrics = update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, metrics


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_advantage_samples_cost_no_compute_and_leave_the_update_identical(layout: str) -> None:
    """Groups 0 and 2 and 3 (all-correct / all-wrong, dynamic sampling off) have advantage 0: left out of every
    forward and backward, still in the token-mean denominator. Mini-batch 1 (groups 2, 3) is all zero: its step still
    runs (AdamW momentum and weight decay move the weights), as it would with the samples in. Bit for bit equal."""
    batch = _with_zero_advantage_groups(random_batch(4, 3, seed=30, masked=(4,)), (0, 2, 3))
    per_sample = dict(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=2, layout=layout)
    skipped, metrics = _trained_weights(batch, actor_config(**per_sample), ref=False)
    kept, ref_metrics = _trained_weights(
        batch, actor_config(**per_sample, use_kl_loss=True, kl_loss_coef=0.0), ref=True
    )
    assert metrics["actor/num_zero_advantage_samples"] == 9.0  # 3 groups x 3; the masked sample 4 is not counted
    assert ref_metrics["actor/num_zero_advantage_samples"] == 0.0
    assert metrics["actor/num_micro_batches"] == 2.0  # group 1 minus its masked sample
    assert ref_metrics["actor/num_micro_batches"] == 11.0
    assert metrics["actor/num_optimizer_steps"] == ref_metrics["actor/num_optimizer_steps"] == 2.0
    for name, value in kept.items():
        assert torch.equal(skipped[name], value), name
    # Under a token budget the micro-batches differ, so only the rounding of the gradient's sums does.
    model = tiny_qwen2(12, ACTOR)
    cfg = actor_config(layout=layout)
    batch = batch.with_old_log_probs(compute_log_probs_batch(model, batch, cfg, 1.0))
    gradients = []
    for cut in (None, [list(range(len(batch)))]):  # the token-budget plan; every sample in one pass
        model.zero_grad(set_to_none=True)
        accumulate_mini_batch_gradients(
            model, plan_of(model, batch, cfg, norm_length=8, micro_batches=cut), cfg, temperature=1.0
        )
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert_same_gradients(*gradients)


def test_zero_advantage_samples_are_trained_when_an_entropy_term_reads_them() -> None:
    batch = _with_zero_advantage_groups(random_batch(2, 2, seed=31), (0,))
    _, metrics = _trained_weights(batch, actor_config(entropy_coeff=0.01), ref=False)
    assert metrics["actor/num_zero_advantage_samples"] == 0.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_on_policy_update_without_the_old_log_prob_pass_equals_the_recomputed_one(layout: str) -> None:
    """One optimizer step per update: pi_old is the actor itself, so its own detached log-probs give ratio 1 exactly
    as a recomputed pass does; the first-pass record holds every trained sample once."""
    batch = random_batch(2, 3, seed=32, masked=(2,))
    cfg = actor_config(ppo_mini_batch_size=2, layout=layout)
    results = []
    for on_policy in (False, True):
        model = tiny_qwen2(13, ACTOR)
        # Plain SGD, so the weights differ by lr x the gradients' difference. AdamW's first step is ~lr * sign(g):
        # where a group's advantages (which sum to 0) make a weight's gradient cancel to rounding level, the
        # recomputed pass's 1e-7 ratio noise flipped that step (6e-7 apart on an AVX-512 CPU, packed layout).
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        record = FirstPassRecord()
        metrics = update_policy(
            model, optimizer, scheduler, batch, cfg, temperature=1.0, on_policy=on_policy, record=record
        )
        results.append(({n: p.detach().clone() for n, p in model.named_parameters()}, metrics, record))
    (recomputed, m0, _), (on_policy_weights, m1, record) = results
    for name, value in recomputed.items():
        torch.testing.assert_close(on_policy_weights[name], value, atol=1e-7, rtol=1e-6, msg=name)
    assert m1["actor/ratio_mean"] == 1.0 and m1["actor/pg_clipfrac"] == 0.0
    assert m0["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], abs=1e-6)
    assert len(record.log_probs) == len(record.entropies) == 5  # 6 samples, one masked
    with pytest.raises(ValueError, match="single optimizer step"):
        model = tiny_qwen2(13, ACTOR)
        optimizer, scheduler = _optimizer_and_scheduler(model)
        update_policy(
            model, optimizer, scheduler, batch, actor_config(ppo_mini_batch_size=1), temperature=1.0, on_policy=True
        )
