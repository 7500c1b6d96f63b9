"""One line naming the objective a config resolves to (``dapo train --print-config``): which policy loss, advantage
estimator, loss aggregation and rollout correction will run, with their knobs, after every alias was applied."""

from __future__ import annotations

from dapo.config.schema import DapoConfig

# The knobs each policy loss reads besides the aggregation (docs/objectives.md).
_LOSS_KNOBS: dict[str, tuple[str, ...]] = {
    "vanilla": ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"),
    "gspo": ("clip_ratio_low", "clip_ratio_high"),
    "gspo_token": ("clip_ratio_low", "clip_ratio_high"),
    "cispo": ("clip_ratio_low", "clip_ratio_high"),
    "geo_mean": ("clip_ratio_low", "clip_ratio_high"),
    "sapo": ("tau_pos", "tau_neg"),
    "clip_cov": ("clip_ratio_low", "clip_ratio_high", "policy_loss.clip_cov_ratio", "policy_loss.clip_cov_lb",
                 "policy_loss.clip_cov_ub"),
    "kl_cov": ("policy_loss.kl_cov_ratio", "policy_loss.ppo_kl_coef"),
}


def _actor_value(cfg: DapoConfig, dotted: str) -> object:
    node: object = cfg.actor
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def describe_objective(cfg: DapoConfig) -> str:
    """E.g. ``policy loss gspo (clip_ratio_low=0.0003, clip_ratio_high=0.0004), aggregation seq-mean-token-mean,
    advantages grpo (std-normalised), rollout correction off``."""
    mode = cfg.actor.policy_loss.loss_mode
    knobs = ", ".join(f"{k.rsplit('.', 1)[-1]}={_actor_value(cfg, k)}" for k in _LOSS_KNOBS.get(mode, ()))
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
        parts.append(f"rollout_is={rc.rollout_is} " + (f"IcePop band [{lower}, {upper}]" if lower is not None
                                                       else f"TIS C={upper}"))
    if rc.rollout_rs is not None:
        upper, lower = rc.rs_bounds()
        parts.append(f"rollout_rs={rc.rollout_rs} " + (f"[{lower}, {upper}]" if lower is not None else f"<= {upper}"))
    return (f"policy loss {mode} ({knobs}), aggregation {cfg.actor.loss_agg_mode}, advantages {adv}, "
            f"rollout correction {'; '.join(parts) if parts else 'off'}")
