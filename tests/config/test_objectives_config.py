"""The objective switches as a verl user writes them: full key paths and verl's strings, what each resolves to, and
the combinations refused with a message (rollout correction against a truncated sampler, trl#6789)."""

from __future__ import annotations

import pytest

from dapo.config import ConfigError
from dapo.config.loading import build_config
from dapo.training.actor_step import old_log_prob_source


def test_verl_full_key_paths_resolve() -> None:
    cfg = build_config(None, [
        "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.001",
        "actor_rollout_ref.actor.tau_pos=0.9",
        "algorithm.adv_estimator=reinforce_plus_plus_baseline",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=0.5_2.0",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001",
    ])
    assert cfg.actor.policy_loss.loss_mode == "geo_mean" and cfg.actor.policy_loss.clip_cov_ratio == 0.001
    assert cfg.actor.tau_pos == 0.9 and cfg.algorithm.adv_estimator == "reinforce_plus_plus_baseline"
    rc = cfg.algorithm.rollout_correction
    assert rc.is_bounds() == (2.0, 0.5)
    assert rc.rs_bounds() == (1.001, 0.999)


def test_thresholds_by_hand() -> None:
    one = build_config(None, ["algorithm.rollout_correction.rollout_rs=token_k1",
                              "algorithm.rollout_correction.rollout_rs_threshold=2.0"])
    assert one.algorithm.rollout_correction.rs_bounds() == (2.0, 0.5)  # one number u: the band [1/u, u]
    k3 = build_config(None, ["algorithm.rollout_correction.rollout_rs=seq_max_k3",
                             "algorithm.rollout_correction.rollout_rs_threshold=0.01"])
    assert k3.algorithm.rollout_correction.rs_bounds() == (0.01, None)
    assert build_config(None, []).algorithm.rollout_correction.is_bounds() == (2.0, None)


@pytest.mark.parametrize(("overrides", "match"), [
    (["algorithm.rollout_correction.rollout_rs=seq_mean_k1"], "needs rollout_rs_threshold"),
    (["algorithm.rollout_correction.rollout_rs=seq_max_k2", "algorithm.rollout_correction.rollout_rs_threshold=0.1_2.0"],
     "give one number"),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2_x"],
     "expected a number or 'lower_upper'"),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=3.0_2.0"],
     "0 < lower <= upper"),
    (["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
     "bypass_mode=true makes pi_old the engine's log-probs"),
    (["algorithm.rollout_correction.rollout_rs=seq_max_k1"], "seq_max_k1"),
    (["actor.recompute_old_log_prob=never", "algorithm.rollout_correction.rollout_rs=token_k2",
      "algorithm.rollout_correction.rollout_rs_threshold=0.1"], "rollout_rs compares pi_old"),
    (["algorithm.adv_estimator=grpo_passk", "rollout.n=1", "algorithm.filter_groups.enable=false"],
     "grpo_passk needs rollout.n >= 2"),
])
def test_bad_combinations_are_refused_with_the_key(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_config(None, overrides)


@pytest.mark.parametrize("switch", [
    ["algorithm.rollout_correction.rollout_is=token"],
    ["algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=2.0"],
    ["algorithm.rollout_correction.bypass_mode=true"],
    ["actor.recompute_old_log_prob=never"],
])
@pytest.mark.parametrize("truncation", ["rollout.top_p=0.7", "rollout.top_k=20"])
def test_truncated_sampling_with_an_actor_vs_engine_ratio_is_refused(switch: list[str], truncation: str) -> None:
    """trl#6789: the engine's log-probs are of the truncated distribution, the actor's of the full softmax."""
    with pytest.raises(ConfigError, match=r"truncated distribution .*trl#6789"):
        build_config(None, [*switch, truncation])
    build_config(None, switch)  # the same switch without truncation is fine
    build_config(None, [truncation])  # and truncation alone (pi_old recomputed by the actor) is fine


def test_bypass_and_rejection_pick_where_pi_old_comes_from() -> None:
    bypass = build_config(None, ["algorithm.rollout_correction.bypass_mode=true"])
    # bypass: the engine's log-probs, even when a single optimizer step would otherwise use the update's own forward
    assert old_log_prob_source(bypass, num_groups=8, engine_samples_from_actor=False) == "rollout"
    assert old_log_prob_source(bypass, num_groups=32, engine_samples_from_actor=False) == "rollout"
    rs = build_config(None, ["algorithm.rollout_correction.rollout_rs=seq_mean_k1",
                             "algorithm.rollout_correction.rollout_rs_threshold=0.99_1.01"])
    assert old_log_prob_source(rs, num_groups=8, engine_samples_from_actor=True) == "recompute"


@pytest.mark.parametrize(("trl", "mode", "agg"), [
    ("loss_type=grpo", "vanilla", "seq-mean-token-mean"),
    ("loss_type=dr_grpo", "vanilla", "seq-mean-token-sum-norm"),
    ("loss_type=dapo", "vanilla", "token-mean"),
    ("loss_type=bnpo", "vanilla", "token-mean"),
    ("loss_type=cispo", "cispo", "token-mean"),
    ("loss_type=sapo", "sapo", "seq-mean-token-mean"),
    ("importance_sampling_level=sequence", "gspo", "token-mean"),
])
def test_trl_spellings(trl: str, mode: str, agg: str) -> None:
    cfg = build_config(None, [trl, "epsilon=0.1", "epsilon_high=0.3", "scale_rewards=false"])
    assert (cfg.actor.policy_loss.loss_mode, cfg.actor.loss_agg_mode) == (mode, agg)
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == (0.1, 0.3)
    assert cfg.algorithm.norm_adv_by_std_in_grpo is False


def test_trl_and_verl_values_without_a_counterpart_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"loss_type='ppo': allowed: grpo, dr_grpo"):
        build_config(None, ["loss_type=ppo"])
    with pytest.raises(ConfigError, match="'reinforce' loss is not implemented"):
        build_config(None, ["algorithm.rollout_correction.loss_type=reinforce"])
    build_config(None, ["algorithm.rollout_correction.loss_type=ppo_clip",
                        "algorithm.rollout_correction.rollout_is_batch_normalize=false"])
