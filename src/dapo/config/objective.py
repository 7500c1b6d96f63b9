"""One line naming the objective a config resolves to (``dapo train --print-config``): which policy loss, advantage
estimator, loss aggregation and rollout correction will run, with their knobs, after every alias was applied; the
notice of the loss mode's paper defaults a config took, and the warnings about objective settings that do not mean
what a reader of the paper or a verl user expects."""

from __future__ import annotations

import math

from dapo.config.policy_losses import knob_parameter, knob_value, registered_policy_loss
from dapo.config.schema import DapoConfig


def describe_objective(cfg: DapoConfig) -> str:
    """E.g. ``policy loss gspo (clip_ratio_low=0.0003, clip_ratio_high=0.0004), aggregation seq-mean-token-mean,
    advantages grpo (std-normalised), rollout correction off``."""
    mode = cfg.actor.policy_loss.loss_mode
    knobs = ", ".join(f"{knob_parameter(k)}={knob_value(cfg.actor, k)}" for k in registered_policy_loss(mode).knobs)
    alg = cfg.algorithm
    adv = alg.adv_estimator
    if adv in ("grpo", "grpo_passk"):
        adv += " (std-normalised)" if alg.norm_adv_by_std_in_grpo else " (no std division: Dr. GRPO)"
    rc = alg.rollout_correction
    parts = []
    if rc.bypass_mode:
        parts.append("bypass_mode (pi_old = engine log-probs)")
    if rc.rollout_is is not None:
        upper, lower = rc.is_bounds()
        parts.append(
            f"rollout_is={rc.rollout_is} "
            + (f"IcePop band [{lower}, {upper}]" if lower is not None else f"TIS C={upper}")
        )
    if rc.rollout_rs is not None:
        upper, lower = rc.rs_bounds()
        parts.append(f"rollout_rs={rc.rollout_rs} " + (f"[{lower}, {upper}]" if lower is not None else f"<= {upper}"))
    return (
        f"policy loss {mode} ({knobs}), aggregation {cfg.actor.loss_agg_mode}, advantages {adv}, "
        f"rollout correction {'; '.join(parts) if parts else 'off'}"
    )


def paper_defaults_notice(cfg: DapoConfig) -> str | None:
    """One line naming the keys that took ``loss_mode``'s paper default (the config did not set them), or None."""
    taken = cfg.actor.paper_defaults_taken()
    if not taken:
        return None
    mode = cfg.actor.policy_loss.loss_mode
    keys = ", ".join(f"actor.{k}={v}" for k, v in taken.items())
    return (
        f"{keys}: actor.policy_loss.loss_mode={mode}'s paper default{'s' if len(taken) > 1 else ''}, "
        f"{registered_policy_loss(mode).paper}, for what the config does not set (set a key to choose another value)"
    )


def distillation_notice(cfg: DapoConfig) -> str | None:
    """What Dynamic Sampling does when distillation trains without the task reward (docs/distillation.md)."""
    ds = cfg.distillation
    if ds.enabled and not ds.distillation_loss.use_task_rewards and cfg.algorithm.filter_groups.enable:
        return (
            "algorithm.filter_groups.enable=true with distillation.distillation_loss.use_task_rewards=false: Eq. "
            "11 drops groups whose accuracy is all equal because their reward advantage is 0; with the reward "
            "off every group carries the teacher's per-token signal, so no group is dropped "
            "(docs/distillation.md)"
        )
    return None


def objective_warnings(cfg: DapoConfig) -> list[str]:
    """Settings that run, but not as the paper or verl would: an aggregation set against the loss mode's paper, and
    an asymmetric k1 rejection band, which verl's code applies to the inverse ratio (docs/objectives.md)."""
    warnings = []
    actor, mode = cfg.actor, cfg.actor.policy_loss.loss_mode
    loss = registered_policy_loss(mode)
    paper_agg = loss.paper_defaults.get("loss_agg_mode")
    if paper_agg is not None and actor.loss_agg_mode != paper_agg:
        warnings.append(
            f"actor.loss_agg_mode={actor.loss_agg_mode} with actor.policy_loss.loss_mode={mode}: {loss.paper} "
            f"averages per response ({paper_agg}, which verl hard-codes for this mode), so this optimises another "
            "objective than the paper's (remove the key to take the paper's)"
        )
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_rs is not None and rc.rollout_rs.endswith("k1"):
        upper, lower = rc.rs_bounds()
        # Bands within 0.1 % of symmetric (the docs' 0.999_1.001, 0.99_1.01) reject the same tokens up to rounding
        # in both projects: no warning for those.
        if lower is not None and not math.isclose(lower * upper, 1.0, rel_tol=1e-3):
            warnings.append(
                f"algorithm.rollout_correction.rollout_rs_threshold={rc.rollout_rs_threshold!r} is an asymmetric band: "
                f"dapo keeps the ratio pi_old/mu in [{lower}, {upper}], as verl's and dapo's docs say, but verl's code "
                f"keeps it in [1/{upper}, 1/{lower}] = [{1 / upper:.6g}, {1 / lower:.6g}]; a band ported from a verl "
                f"run rejects other tokens here (for verl's behaviour write '{1 / upper:.6g}_{1 / lower:.6g}')"
            )
    return warnings
