"""The objective switches as a verl user writes them: full key paths and verl's strings, what each resolves to, and
the combinations refused with a message (rollout correction against a truncated sampler, trl#6789)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dapo.actor.update import policy_loss_params
from dapo.config import ActorConfig, ConfigError, DapoConfig, load_config
from dapo.config.loading import build_config, build_config_with_report
from dapo.core import aggregate_loss, get_policy_loss
from dapo.training.actor_step import old_log_prob_source

OBJECTIVE_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "objectives"


def test_verl_full_key_paths_resolve() -> None:
    cfg = build_config(
        None,
        [
            "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
            "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.001",
            "actor_rollout_ref.actor.tau_pos=0.9",
            "algorithm.adv_estimator=reinforce_plus_plus_baseline",
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold=0.5_2.0",
            "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
            "algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001",
        ],
    )
    assert cfg.actor.policy_loss.loss_mode == "geo_mean" and cfg.actor.policy_loss.clip_cov_ratio == 0.001
    assert cfg.actor.tau_pos == 0.9 and cfg.algorithm.adv_estimator == "reinforce_plus_plus_baseline"
    rc = cfg.algorithm.rollout_correction
    assert rc.is_bounds() == (2.0, 0.5)
    assert rc.rs_bounds() == (1.001, 0.999)


def test_thresholds_by_hand() -> None:
    one = build_config(
        None,
        ["algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=2.0"],
    )
    assert one.algorithm.rollout_correction.rs_bounds() == (2.0, 0.5)  # one number u: the band [1/u, u]
    k3 = build_config(
        None,
        [
            "algorithm.rollout_correction.rollout_rs=seq_max_k3",
            "algorithm.rollout_correction.rollout_rs_threshold=0.01",
        ],
    )
    assert k3.algorithm.rollout_correction.rs_bounds() == (0.01, None)
    assert build_config(None, []).algorithm.rollout_correction.is_bounds() == (2.0, None)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.rollout_correction.rollout_rs=seq_mean_k1"], "needs rollout_rs_threshold"),
        (
            [
                "algorithm.rollout_correction.rollout_rs=seq_max_k2",
                "algorithm.rollout_correction.rollout_rs_threshold=0.1_2.0",
            ],
            "give one number",
        ),
        (
            ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2_x"],
            "expected a number or 'lower_upper'",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_is=token",
                "algorithm.rollout_correction.rollout_is_threshold=3.0_2.0",
            ],
            "0 < lower <= upper",
        ),
        (
            ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
            "bypass_mode=true makes pi_old the engine's log-probs",
        ),
        (["algorithm.rollout_correction.rollout_rs=seq_max_k1"], "seq_max_k1"),
        (
            [
                "actor.recompute_old_log_prob=never",
                "algorithm.rollout_correction.rollout_rs=token_k2",
                "algorithm.rollout_correction.rollout_rs_threshold=0.1",
            ],
            "rollout_rs compares pi_old",
        ),
        (
            ["algorithm.adv_estimator=grpo_passk", "rollout.n=1", "algorithm.filter_groups.enable=false"],
            "grpo_passk needs rollout.n >= 2",
        ),
    ],
)
def test_bad_combinations_are_refused_with_the_key(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_config(None, overrides)


@pytest.mark.parametrize(
    "switch",
    [
        ["algorithm.rollout_correction.rollout_is=token"],
        ["algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=2.0"],
        ["algorithm.rollout_correction.bypass_mode=true"],
        ["actor.recompute_old_log_prob=never"],
    ],
)
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
    rs = build_config(
        None,
        [
            "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
            "algorithm.rollout_correction.rollout_rs_threshold=0.99_1.01",
        ],
    )
    assert old_log_prob_source(rs, num_groups=8, engine_samples_from_actor=True) == "recompute"


@pytest.mark.parametrize(
    ("trl", "mode", "agg"),
    [
        ("loss_type=grpo", "vanilla", "seq-mean-token-mean"),
        ("loss_type=dr_grpo", "vanilla", "seq-mean-token-sum-norm"),
        ("loss_type=dapo", "vanilla", "token-mean"),
        ("loss_type=bnpo", "vanilla", "token-mean"),
        ("loss_type=cispo", "cispo", "token-mean"),
        ("loss_type=sapo", "sapo", "seq-mean-token-mean"),
        # no loss_type: GSPO's own aggregation, one term per response (TRL's GSPO recipe names loss_type=grpo, the same)
        ("importance_sampling_level=sequence", "gspo", "seq-mean-token-mean"),
    ],
)
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
    build_config(
        None,
        [
            "algorithm.rollout_correction.loss_type=ppo_clip",
            "algorithm.rollout_correction.rollout_is_batch_normalize=false",
        ],
    )


# ---------------------------------------- #39 items 1 and 21: a one-key loss_mode switch is the paper's objective
def _loss_and_grad(
    cfg: DapoConfig, log_ratio: list[list[float]], adv: list[float], mask: list[list[int]]
) -> tuple[float, torch.Tensor]:
    """The scalar the actor back-propagates for this config (its loss mode, knobs and aggregation), and its gradient
    w.r.t. log pi, on a [B, T] batch with pi_old = 0 (so log pi is the log-ratio)."""
    lp = torch.tensor(log_ratio, dtype=torch.float64, requires_grad=True)
    m = torch.tensor(mask)
    a = torch.tensor(adv, dtype=torch.float64).unsqueeze(1).expand_as(lp)
    out = get_policy_loss(cfg.actor.policy_loss.loss_mode).fn(
        lp, torch.zeros_like(lp), a, m, policy_loss_params(cfg.actor)
    )
    loss = aggregate_loss(out.loss_mat, m, cfg.actor.loss_agg_mode)
    loss.backward()
    return loss.item(), lp.grad


def assert_grad(grad: torch.Tensor, want: list[list[float]]) -> None:
    torch.testing.assert_close(grad, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-12)


# Ragged: response 0 has 1 token, response 1 has 3 (row 0 padded). Response 1 is on-policy (ratio 1), A = -1.
RAGGED_MASK = [[1, 0, 0], [1, 1, 1]]


def test_one_key_gspo_is_the_papers_objective_by_hand() -> None:
    # Response 0: log-ratio 1e-3, A = +1: s = e^0.001 = 1.0010005 > 1 + 4e-4, so GSPO's clip takes 1.0004 (no gradient).
    # Response 1: s = 1 inside the band, loss per token -A s = 1. J_GSPO's 1/G sum over responses:
    #   loss = (-1.0004 + 1) / 2 = -2e-4; d/d log pi_1,t = -A s / |y_1| / G = 1/3 / 2 = 1/6.
    # (DAPO's token-mean and 0.2 / 0.28 would give (-1.0010005 + 3) / 4 and gradients -1.0010005/4, 1/4.)
    cfg = build_config(None, ["actor.policy_loss.loss_mode=gspo"])
    loss, grad = _loss_and_grad(cfg, [[1e-3, 0.0, 0.0], [0.0, 0.0, 0.0]], [1.0, -1.0], RAGGED_MASK)
    assert loss == pytest.approx(-2e-4, rel=1e-9)
    assert_grad(grad, [[0.0, 0.0, 0.0], [1 / 6] * 3])
    assert cfg.actor.paper_defaults_taken() == {
        "clip_ratio_low": 3e-4,
        "clip_ratio_high": 4e-4,
        "loss_agg_mode": "seq-mean-token-mean",
    }


@pytest.mark.parametrize(
    ("mode", "want_loss", "want_grad"),
    [
        # On-policy, A = (+1, -1): GSPO-token and GMPO give -A_i on every token of response i; the mean per response,
        # then over the 2 responses: (-1 + 1) / 2 = 0; the gradient of token t of response i is -A_i / |y_i| / 2.
        ("gspo_token", 0.0, [[-0.5, 0.0, 0.0], [1 / 6] * 3]),
        ("geo_mean", 0.0, [[-0.5, 0.0, 0.0], [1 / 6] * 3]),
        # SAPO at r = 1: -A 4/tau sigmoid(0) = -2 A / tau (tau_pos 1, tau_neg 1.05): (-2 + 2/1.05) / 2; slope 1 per token.
        ("sapo", (-2 + 2 / 1.05) / 2, [[-0.5, 0.0, 0.0], [1 / 6] * 3]),
    ],
)
def test_one_key_switch_averages_per_response_by_hand(
    mode: str, want_loss: float, want_grad: list[list[float]]
) -> None:
    # (token-mean would give 0.5 for GSPO-token / GMPO, (-2 + 3 * 2/1.05) / 4 for SAPO, gradients -1/4 and 1/4.)
    cfg = build_config(None, [f"actor.policy_loss.loss_mode={mode}"])
    assert cfg.actor.loss_agg_mode == "seq-mean-token-mean"
    loss, grad = _loss_and_grad(cfg, [[0.0] * 3] * 2, [1.0, -1.0], RAGGED_MASK)
    assert loss == pytest.approx(want_loss, abs=1e-12)
    assert_grad(grad, want_grad)


def test_one_key_geo_mean_clips_at_the_papers_log_space_bound() -> None:
    # GMPO's paper clips the log-ratio at +-0.4. One token, log-ratio 0.3, A = +1: inside (-0.4, 0.4) -> loss -e^0.3
    # with gradient -e^0.3 (DAPO's 0.28 as a log-space bound would clip it: loss -e^0.28, gradient 0).
    cfg = build_config(None, ["actor.policy_loss.loss_mode=geo_mean"])
    loss, grad = _loss_and_grad(cfg, [[0.3]], [1.0], [[1]])
    assert loss == pytest.approx(-math.exp(0.3), rel=1e-12)
    assert_grad(grad, [[-math.exp(0.3)]])


def test_keys_the_user_sets_win_over_the_papers_defaults() -> None:
    cfg, report = build_config_with_report(
        None,
        [
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            "algorithm.clip_ratio_high=0.01",
            "actor.loss_agg_mode=token-mean",
        ],
    )
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high, cfg.actor.loss_agg_mode) == (3e-4, 0.01, "token-mean")
    assert cfg.actor.paper_defaults_taken() == {"clip_ratio_low": 3e-4}
    assert report.notices == [
        "actor.clip_ratio_low=0.0003: actor.policy_loss.loss_mode=gspo's paper default, GSPO "
        "(arXiv 2507.18071), for what the config does not set (set a key to choose another "
        "value)"
    ]
    # an aggregation set against the paper's runs, with one warning saying what it changes
    assert [
        w
        for w in report.warnings
        if "actor.loss_agg_mode=token-mean with actor.policy_loss.loss_mode=gspo" in w and "seq-mean-token-mean" in w
    ]
    # a value set equal to DAPO's default is set too (the key was given)
    explicit = build_config(
        None,
        [
            "actor.policy_loss.loss_mode=gspo",
            "actor.clip_ratio_low=0.2",
            "actor.clip_ratio_high=0.28",
            "actor.loss_agg_mode=seq-mean-token-mean",
        ],
    )
    assert (explicit.actor.clip_ratio_low, explicit.actor.clip_ratio_high) == (0.2, 0.28)
    assert explicit.actor.paper_defaults_taken() == {}


def test_modes_without_paper_defaults_keep_dapos_and_say_nothing() -> None:
    for mode in ("vanilla", "clip_cov", "kl_cov"):
        cfg, report = build_config_with_report(None, [f"actor.policy_loss.loss_mode={mode}"])
        a = cfg.actor
        assert (a.clip_ratio_low, a.clip_ratio_high, a.loss_agg_mode) == (0.2, 0.28, "token-mean"), mode
        assert report.notices == [] and report.warnings == [], mode
    # the defaults follow the mode the config ends with, also when the actor section is built directly
    assert ActorConfig(policy_loss={"loss_mode": "gspo"}).clip_ratio_high == 4e-4
    assert ActorConfig(policy_loss={"loss_mode": "vanilla"}).clip_ratio_high == 0.28


@pytest.mark.parametrize("path", sorted(OBJECTIVE_CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_objective_configs_equal_their_one_key_switch(path: Path) -> None:
    """configs/objectives/*.yaml spell out each paper's settings; the one-key switch docs/objectives.md promises must
    resolve to the same objective (the whole actor and algorithm sections)."""
    shipped = load_config(path)
    one_key = build_config(None, [f"actor.policy_loss.loss_mode={shipped.actor.policy_loss.loss_mode}"])
    assert shipped.actor.model_dump() == one_key.actor.model_dump()
    assert shipped.algorithm.model_dump() == one_key.algorithm.model_dump()


@pytest.mark.parametrize("mode", ["token_k1", "seq_sum_k1", "seq_mean_k1"])
def test_an_asymmetric_k1_band_warns_once_with_verls_equivalent(mode: str) -> None:
    # verl's code tests -log(pi_old/mu) against [log lower, log upper], i.e. keeps the ratio in [1/upper, 1/lower]:
    # '0.5_5.0' there keeps [0.2, 2]; here (as both projects' docs say) [0.5, 5].
    cfg, report = build_config_with_report(
        None,
        [
            f"algorithm.rollout_correction.rollout_rs={mode}",
            "algorithm.rollout_correction.rollout_rs_threshold=0.5_5.0",
        ],
    )
    assert cfg.algorithm.rollout_correction.rs_bounds() == (5.0, 0.5)
    band = [w for w in report.warnings if "asymmetric band" in w]
    assert len(band) == 1 and "[0.5, 5.0]" in band[0] and "[0.2, 2]" in band[0] and "'0.2_2'" in band[0]
    for symmetric in (
        "0.5_2.0",
        "2.0",
        "0.8_1.25",
        "0.999_1.001",
        "0.99_1.01",
    ):  # lower = 1/upper: the same tokens in both
        _, report = build_config_with_report(
            None,
            [
                f"algorithm.rollout_correction.rollout_rs={mode}",
                f"algorithm.rollout_correction.rollout_rs_threshold={symmetric}",
            ],
        )
        assert not [w for w in report.warnings if "asymmetric" in w], symmetric


def test_the_band_warning_is_logged_once_per_config_load(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="dapo.config"):
        load_config(
            None,
            [
                "algorithm.rollout_correction.rollout_rs=token_k1",
                "algorithm.rollout_correction.rollout_rs_threshold=0.5_5.0",
            ],
        )
    assert sum("asymmetric band" in r.getMessage() for r in caplog.records) == 1
