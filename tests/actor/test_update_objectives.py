"""Every registered policy loss through the actor update: the mini-batch plan makes micro-batching exact for each
(sequence-level ratios included), and the zero-advantage skip is taken only where a loss allows it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from actor_helpers import actor_config, plan_of, random_batch
from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.log_probs import compute_log_probs_batch
from dapo.actor.mini_batch_plan import plan_mini_batch, trained_samples
from dapo.actor.update import accumulate_mini_batch_gradients, policy_loss_params
from dapo.config import ActorConfig
from dapo.core import POLICY_LOSSES, aggregate_loss, get_policy_loss
from tests.harness.models import ACTOR, tiny_qwen2

TEMPERATURE = 1.0
# Clip-Cov and KL-Cov centre their covariance over the tokens of one call, as verl does, so they are per micro-batch
# by definition; every other loss must give the uncut mini-batch gradient under any cut.
EXACT_UNDER_CUTS = sorted(set(POLICY_LOSSES) - {"clip_cov", "kl_cov"})


def off_policy_batch(model: nn.Module) -> TrainBatch:
    batch = random_batch(3, 3, seed=5, masked=(2,))
    current = compute_log_probs_batch(model, batch, actor_config(), TEMPERATURE)
    g = torch.Generator().manual_seed(6)
    old = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in current]
    return TrainBatch(
        prompt_ids=batch.prompt_ids,
        response_ids=batch.response_ids,
        advantages=batch.advantages,
        sample_mask=batch.sample_mask,
        group_index=batch.group_index,
        old_log_probs=old,
    )


def uncut_gradient(model: nn.Module, batch: TrainBatch, cfg: ActorConfig) -> dict[str, Tensor]:
    model.zero_grad(set_to_none=True)
    log_probs = []
    for prompt, response in zip(batch.prompt_ids, batch.response_ids, strict=True):
        logits = model(input_ids=torch.cat([prompt, response]).unsqueeze(0), use_cache=False).logits[0]
        logp = (logits[prompt.numel() - 1 : -1].float() / TEMPERATURE).log_softmax(-1)
        log_probs.append(logp.gather(-1, response.unsqueeze(-1)).squeeze(-1))
    log_prob, mask = pad_per_token(log_probs), batch.loss_mask()
    assert batch.old_log_probs is not None
    adv = batch.advantages.unsqueeze(1).expand_as(log_prob)
    out = get_policy_loss(cfg.policy_loss.loss_mode).fn(
        log_prob, pad_per_token(batch.old_log_probs), adv, mask, policy_loss_params(cfg)
    )
    aggregate_loss(out.loss_mat, mask, cfg.loss_agg_mode, norm_length=8).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("loss_mode", "loss_agg_mode"),
    [(m, "token-mean") for m in EXACT_UNDER_CUTS]
    + [("gspo", "seq-mean-token-mean"), ("geo_mean", "seq-mean-token-mean")],
)
def test_every_objective_accumulates_the_uncut_gradient(loss_mode: str, loss_agg_mode: str) -> None:
    model = tiny_qwen2(4, ACTOR)
    model.train()
    batch = off_policy_batch(model)
    overrides = dict(
        loss_agg_mode=loss_agg_mode, policy_loss={"loss_mode": loss_mode}, clip_ratio_low=0.1, clip_ratio_high=0.1
    )
    want = uncut_gradient(model, batch, actor_config(**overrides))
    scale = max(float(g.abs().max()) for g in want.values())
    assert scale > 0
    for cut in ([[0, 1, 2, 3, 4, 5, 6, 7, 8]], [[0], [1, 5], [3, 4, 6, 7, 8]], [[8, 0], [1, 3], [4], [6, 7, 5]]):
        model.zero_grad(set_to_none=True)
        cfg = actor_config(**overrides)
        accumulate_mini_batch_gradients(
            model, plan_of(model, batch, cfg, norm_length=8, micro_batches=cut), cfg, temperature=TEMPERATURE
        )
        for name, g in want.items():
            got = dict(model.named_parameters())[name].grad
            torch.testing.assert_close(got, g, atol=1e-6 * scale + 1e-7, rtol=1e-4, msg=f"{loss_mode} {name}")


def test_zero_advantage_samples_are_trained_only_where_a_loss_needs_them() -> None:
    batch = random_batch(2, 3, seed=1)
    batch = TrainBatch(
        prompt_ids=batch.prompt_ids,
        response_ids=batch.response_ids,
        advantages=torch.tensor([1.0, 0.0, -1.0, 0.0, 0.0, 0.0]),
        sample_mask=batch.sample_mask,
        group_index=batch.group_index,
    )
    assert trained_samples(batch, actor_config()) == [0, 2]
    assert trained_samples(batch, actor_config(policy_loss={"loss_mode": "gspo"})) == [0, 2]
    assert trained_samples(batch, actor_config(policy_loss={"loss_mode": "kl_cov"})) == list(range(6))
    assert trained_samples(batch, actor_config(policy_loss={"loss_mode": "clip_cov"})) == list(range(6))


def test_the_plan_carries_the_whole_mini_batch_counts() -> None:
    batch = random_batch(2, 3, seed=2, masked=(4,))
    plan = plan_mini_batch(batch, actor_config(ppo_max_token_len_per_gpu=10), layout="padded", norm_length=9)
    mask = batch.loss_mask()
    assert (plan.num_tokens, plan.num_seqs) == (int(mask.sum()), 5)
    assert plan.norm_length == 9 and plan.share is batch and plan.padding is None
    assert sorted(i for mb in plan.micro_batches for i in mb) == trained_samples(batch, actor_config())


def test_token_metrics_average_over_the_trained_tokens_only() -> None:
    """Skipped zero-advantage samples count in the loss normalisers, not in the diagnostics: on-policy, the ratio of
    every trained token is exactly 1, so actor/ratio_mean is 1 however many samples were skipped (it read 2/16 of 1
    when the sums were divided by every token of the mini-batch)."""
    from dapo.actor.optim import build_lr_scheduler, build_optimizer

    model = tiny_qwen2(3, ACTOR)
    batch = random_batch(2, 4, seed=9)
    batch = TrainBatch(
        prompt_ids=batch.prompt_ids,
        response_ids=batch.response_ids,
        advantages=torch.tensor([1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0]),
        sample_mask=batch.sample_mask,
        group_index=batch.group_index,
    )
    cfg = actor_config(ppo_mini_batch_size=2)
    optimizer = build_optimizer(model, cfg.optim)
    from dapo.actor.update import update_policy

    metrics = update_policy(
        model, optimizer, build_lr_scheduler(optimizer, cfg.optim), batch, cfg, temperature=TEMPERATURE, on_policy=True
    )
    assert metrics["actor/num_zero_advantage_samples"] == 6
    assert metrics["actor/ratio_mean"] == 1.0 and metrics["actor/ppo_kl"] == 0.0
    assert "actor/num_trained_tokens" not in metrics
