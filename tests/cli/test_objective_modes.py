"""Every objective switch trains the default tiny task, written as a verl user writes it (full key paths, verl's
strings): each run is one real training step of Algorithm 1 on the embedded model, with the mode in effect.

The 9 runs cover every policy loss, every advantage estimator and every rollout-correction mode at least once (one
of each per run), so each switch is exercised end to end at a fraction of the cost of one run per switch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dapo.cli.main import cli
from dapo.config.loading import build_config
from dapo.training.loop import train

FAST = [
    "trainer.total_training_steps=1",
    "data.train_batch_size=2",
    "actor.ppo_mini_batch_size=1",
    "rollout.n=4",
    "data.synth.num_train=32",
    "data.synth.num_val=2",
    "rollout.val_kwargs.n=1",
    "trainer.val_before_train=false",
    "trainer.num_threads=1",
    "algorithm.filter_groups.on_exhausted=train_on_partial",
    "trainer.logger=[jsonl]",
    "data.max_response_length=32",
    "reward_model.overlong_buffer.len=8",
]
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
RC = "algorithm.rollout_correction"
RUNS: dict[str, list[str]] = {
    "vanilla": [f"{LOSS}=vanilla", "algorithm.adv_estimator=rloo", f"{RC}.rollout_is=token"],
    "gspo": [
        f"{LOSS}=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=3e-4",
        "actor_rollout_ref.actor.clip_ratio_high=4e-4",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "algorithm.adv_estimator=reinforce_plus_plus",
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_is_threshold=0.5_2.0",
    ],
    "gspo_token": [
        f"{LOSS}=gspo_token",
        "algorithm.adv_estimator=reinforce_plus_plus_baseline",
        f"{RC}.rollout_rs=seq_mean_k1",
        f"{RC}.rollout_rs_threshold=0.999_1.001",
    ],
    "cispo": [
        f"{LOSS}=cispo",
        "algorithm.adv_estimator=grpo_passk",
        f"{RC}.rollout_rs=token_k1",
        f"{RC}.rollout_rs_threshold=2.0",
    ],
    "geo_mean": [
        f"{LOSS}=geo_mean",
        "actor_rollout_ref.actor.clip_ratio_low=0.4",
        "actor_rollout_ref.actor.clip_ratio_high=0.4",
        f"{RC}.rollout_rs=seq_sum_k1",
        f"{RC}.rollout_rs_threshold=0.5_2.0",
    ],
    "sapo": [f"{LOSS}=sapo", f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=0.01"],
    "clip_cov": [f"{LOSS}=clip_cov", f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.01"],
    "kl_cov": [f"{LOSS}=kl_cov", f"{RC}.bypass_mode=true"],
    "dr_grpo": [
        "algorithm.norm_adv_by_std_in_grpo=false",
        "actor.loss_agg_mode=seq-mean-token-sum-norm",
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_threshold=0.8_1.25",
    ],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_each_mode_trains_the_tiny_task(name: str, tmp_path: Path) -> None:
    cfg = build_config(
        None, [*FAST, f"trainer.default_local_dir={tmp_path}", f"trainer.experiment_name={name}", *RUNS[name]]
    )
    result = train(cfg)
    assert result.steps_done == 1
    step = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["actor/num_optimizer_steps"] >= 1 and step["actor/num_micro_batches"] >= 1
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is is not None:
        assert 0 < step["rollout_corr/is_eff_sample_size"] <= 1.0 + 1e-9
    if rc.rollout_rs is not None:
        assert 0 <= step["rollout_corr/rs_masked_fraction"] <= 1
    if rc.bypass_mode:
        assert step["actor/old_log_prob_recomputed"] == 0.0
    saved = (result.run_dir / "config.yaml").read_text()
    assert f"loss_mode: {cfg.actor.policy_loss.loss_mode}" in saved


def test_every_switch_is_covered_by_a_run() -> None:
    from dapo.core import ADV_ESTIMATORS, POLICY_LOSSES, ROLLOUT_RS_MODES

    configs = [build_config(None, overrides) for overrides in RUNS.values()]
    assert {c.actor.policy_loss.loss_mode for c in configs} == set(POLICY_LOSSES)
    assert {c.algorithm.adv_estimator for c in configs} == set(ADV_ESTIMATORS)
    rs_levels = {
        c.algorithm.rollout_correction.rollout_rs.rsplit("_k", 1)[0]
        for c in configs
        if c.algorithm.rollout_correction.rollout_rs
    }
    assert rs_levels == {m.rsplit("_k", 1)[0] for m in ROLLOUT_RS_MODES}
    assert any(c.algorithm.rollout_correction.bypass_mode for c in configs)


def test_print_config_names_the_resolved_objective() -> None:
    out = CliRunner().invoke(
        cli,
        [
            "train",
            "--print-config",
            f"{LOSS}=cispo",
            "algorithm.adv_estimator=rloo",
            f"{RC}.rollout_rs=seq_mean_k1",
            f"{RC}.rollout_rs_threshold=0.99_1.01",
        ],
    )
    assert out.exit_code == 0, out.output
    first, second = out.output.splitlines()[:2]
    # CISPO's paper has no lower bound on its IS weight: clip_ratio_low 0.999 where the config does not set one
    assert first.startswith("# objective: policy loss cispo (clip_ratio_low=0.999, clip_ratio_high=0.28)")
    assert "advantages rloo" in first and "rollout_rs=seq_mean_k1 [0.99, 1.01]" in first
    assert second.startswith("# note: actor.clip_ratio_low=0.999: actor.policy_loss.loss_mode=cispo's paper default")
    assert "loss_mode: cispo" in out.output


def test_print_config_says_which_values_came_from_the_loss_modes_paper() -> None:
    out = CliRunner().invoke(cli, ["train", "--print-config", f"{LOSS}=gspo", "actor.clip_ratio_high=0.001"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith(
        "# objective: policy loss gspo (clip_ratio_low=0.0003, clip_ratio_high=0.001), aggregation seq-mean-token-mean"
    )
    assert lines[1] == (
        "# note: actor.clip_ratio_low=0.0003, actor.loss_agg_mode=seq-mean-token-mean: "
        "actor.policy_loss.loss_mode=gspo's paper defaults, GSPO (arXiv 2507.18071), for what the "
        "config does not set (set a key to choose another value)"
    )
    printed = yaml.safe_load(out.output)  # the comments keep it a loadable config, with the values resolved
    assert printed["actor"]["clip_ratio_low"] == 3e-4 and printed["actor"]["loss_agg_mode"] == "seq-mean-token-mean"
    plain = CliRunner().invoke(cli, ["train", "--print-config"])
    assert plain.exit_code == 0 and "# note:" not in plain.output


@pytest.mark.parametrize("top_p", [0.7, 1.0])
def test_top_p_sampling_keeps_the_on_policy_ratio_at_one(top_p: float, tmp_path: Path) -> None:
    """trl#6789 here: with top-p 0.7 the engine reports log-probs of the truncated distribution, far from the actor's
    full softmax (the gap every actor-vs-engine ratio would inherit, so those are refused in the config); pi_old is
    then the actor's own, and the PPO ratio of an on-policy update is exactly 1. Without truncation the two agree."""
    cfg = build_config(
        None,
        [
            *FAST,
            f"trainer.default_local_dir={tmp_path}",
            "trainer.experiment_name=top_p",
            "actor.ppo_mini_batch_size=2",
            f"rollout.top_p={top_p}",
        ],
    )
    result = train(cfg)
    step = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["actor/num_optimizer_steps"] == 1
    assert step["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    gap = step["rollout/log_prob_diff/mean"]
    assert gap > 0.01 if top_p < 1.0 else gap < 1e-4
