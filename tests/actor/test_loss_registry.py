"""The policy-loss registry is the one place a loss is named: a loss registered here, in a test, without touching any
source file, is accepted by config validation (under verl's key), explained with its knobs, given its paper default,
and trained by the update; a name nobody registered is refused naming the key and the registered names."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import Tensor

from actor_helpers import actor_config, random_batch
from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.actor.update import update_policy
from dapo.config import ConfigError
from dapo.config.loading import build_config
from dapo.config.objective import describe_objective, paper_defaults_notice
from dapo.core.policy_loss import (
    POLICY_LOSSES,
    PolicyLossOutput,
    PolicyLossParams,
    masked_loss,
    register_policy_loss,
    token_diagnostics,
)
from tests.harness.models import ACTOR, tiny_qwen2

TOY = "toy_scaled"


def toy_scaled_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, params: PolicyLossParams
) -> PolicyLossOutput:
    """``-eps_high * A_t * r_t``: the unclipped surrogate scaled by a knob, so its on-policy value is known by hand."""
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    loss = -params.clip_ratio_high * advantages * ratio
    return token_diagnostics(
        response_mask,
        masked_loss(loss, response_mask),
        log_ratio=log_ratio,
        ratio=ratio,
        clipped=torch.zeros_like(response_mask, dtype=torch.bool),
    )


@contextmanager
def registered(name: str, **entry: object) -> Iterator[None]:
    """``name`` registered for the test's duration (the registry is the process's; it is left as it was found)."""
    register_policy_loss(name, **entry)(toy_scaled_loss)  # type: ignore[arg-type]
    try:
        yield
    finally:
        del POLICY_LOSSES[name]


@pytest.fixture
def toy_loss() -> Iterator[None]:
    with registered(TOY, knobs=("clip_ratio_high",), paper="Toy (a test)", paper_defaults={"clip_ratio_high": 0.5}):
        yield


def test_a_loss_registered_in_a_test_is_validated_explained_and_trained(toy_loss: None) -> None:
    cfg = build_config(None, [f"actor_rollout_ref.actor.policy_loss.loss_mode={TOY}"])
    assert cfg.actor.policy_loss.loss_mode == TOY
    assert cfg.actor.clip_ratio_high == 0.5  # the entry's paper default, the config did not set the key
    assert describe_objective(cfg).startswith(f"policy loss {TOY} (clip_ratio_high=0.5), aggregation token-mean")
    assert f"actor.clip_ratio_high=0.5: actor.policy_loss.loss_mode={TOY}'s paper default, Toy (a test)" in (
        paper_defaults_notice(cfg) or ""
    )
    assert (
        build_config(None, [f"actor.policy_loss.loss_mode={TOY}", "actor.clip_ratio_high=0.25"]).actor.clip_ratio_high
        == 0.25
    )  # a value the config sets stands

    # The update trains with it: on-policy every ratio is 1, so the token-mean loss is
    # -eps_high * sum_i A_i n_i / sum_i n_i with n_i the response lengths (the vanilla loss would be -sum_i A_i n_i /
    # sum_i n_i: eps_high = 0.5 tells the two apart).
    batch = random_batch(2, 3, seed=4)
    n = torch.tensor(batch.response_lengths, dtype=torch.float32)
    expected = float(-0.5 * (batch.advantages * n).sum() / n.sum())
    actor = actor_config(policy_loss={"loss_mode": TOY})
    assert actor.clip_ratio_high == 0.5
    model = tiny_qwen2(5, ACTOR)
    optimizer = build_optimizer(model, actor.optim)
    metrics = update_policy(
        model, optimizer, build_lr_scheduler(optimizer, actor.optim), batch, actor, temperature=1.0, on_policy=True
    )
    assert metrics["actor/num_optimizer_steps"] == 1.0
    assert metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_an_unknown_loss_is_refused_naming_the_key_and_the_registered_losses() -> None:
    with pytest.raises(ConfigError) as refused:
        build_config(None, ["actor_rollout_ref.actor.policy_loss.loss_mode=gmpo"])
    message = str(refused.value)
    assert "actor.policy_loss.loss_mode: unknown policy loss 'gmpo'" in message
    assert f"registered losses: {', '.join(sorted(POLICY_LOSSES))}" in message
    assert "geo_mean" in message and "vanilla" in message


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"knobs": ("clip_ratio_hihg",)}, rf"loss_mode={TOY} reads actor.clip_ratio_hihg, which is not a config key"),
        ({"knobs": ("policy_loss.clip_cov_band",)}, "reads actor.policy_loss.clip_cov_band, which is not a config key"),
        ({"knobs": ("grad_clip",)}, "reads actor.grad_clip, which PolicyLossParams has no field for"),
        (
            {"knobs": (), "paper": "Toy (a test)", "paper_defaults": {"clip_ratio_low": 1.5}},
            r"paper default actor.clip_ratio_low=1.5 is refused: Input should be less than 1",
        ),
        (
            {"knobs": (), "paper": "Toy (a test)", "paper_defaults": {"policy_loss.clip_cov_lb": 2.0}},
            "not a top-level actor key",
        ),
    ],
)
def test_an_entry_naming_what_the_config_cannot_give_is_refused(entry: dict[str, object], match: str) -> None:
    with registered(TOY, **entry), pytest.raises(ConfigError, match=match):
        build_config(None, [f"actor.policy_loss.loss_mode={TOY}"])


def test_paper_defaults_need_their_paper() -> None:
    # the notice of a taken default names the paper it comes from
    with pytest.raises(ValueError, match="paper_defaults need the paper"):
        register_policy_loss(TOY, knobs=(), paper_defaults={"clip_ratio_high": 0.5})
    assert TOY not in POLICY_LOSSES
