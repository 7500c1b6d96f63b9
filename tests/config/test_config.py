"""The config tree: YAML + dotted overrides, verl aliases, and error messages that name the key."""

from pathlib import Path

import pytest

from dapo.config import ConfigError, DapoConfig, config_to_dict, load_config, parse_override

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_dapo():
    cfg = load_config()
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == (0.2, 0.28)
    assert cfg.actor.loss_agg_mode == "token-mean"
    assert cfg.algorithm.filter_groups.enable and cfg.reward_model.overlong_buffer.enable
    assert not cfg.actor.use_kl_loss and cfg.actor.entropy_coeff == 0.0
    assert (cfg.rollout.val_kwargs.temperature, cfg.rollout.val_kwargs.top_p) == (1.0, 0.7)


def test_issue_example_override_and_verl_paths():
    cfg = load_config(None, ["algorithm.clip_ratio_high=0.3", "actor_rollout_ref.actor.optim.lr=2e-6",
                             "actor_rollout_ref.rollout.n=4", "+data.gen_batch_size=48"])
    assert cfg.actor.clip_ratio_high == 0.3
    assert cfg.actor.optim.lr == 2e-6
    assert cfg.rollout.n == 4
    assert cfg.data.effective_gen_batch_size == 48


def test_override_values_are_yaml():
    assert parse_override("a.b=0.28") == ("a.b", 0.28)
    assert parse_override("a.b=null") == ("a.b", None)
    assert parse_override("a.b=[x, y]") == ("a.b", ["x", "y"])
    assert parse_override("a.b=true") == ("a.b", True)
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("no_equals_sign")


def test_unknown_key_names_key_section_and_suggestion():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.clip_ratio_hgh=0.3"])
    msg = str(err.value)
    assert "algorithm.clip_ratio_hgh" in msg and "Did you mean 'clip_ratio_high'" in msg
    assert "filter_groups" in msg  # the allowed keys of the section are listed


def test_wrong_type_and_literal_name_key_and_allowed_values():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor.loss_agg_mode=sum"])
    assert "actor.loss_agg_mode" in str(err.value) and "'token-mean'" in str(err.value)
    with pytest.raises(ConfigError, match=r"actor\.optim\.lr: .*number.*'fast'"):
        load_config(None, ["actor.optim.lr=fast"])
    with pytest.raises(ConfigError, match="data.train_batch_size"):
        load_config(None, ["data.train_batch_size=-3"])


def test_value_where_section_expected_is_rejected():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["actor.grad_clip.x=1"])


def test_cross_section_checks():
    with pytest.raises(ConfigError, match="ppo_mini_batch_size .* must divide"):
        load_config(None, ["data.train_batch_size=24", "actor.ppo_mini_batch_size=16"])
    with pytest.raises(ConfigError, match="overlong_buffer.len"):
        load_config(None, ["data.max_response_length=8", "reward_model.overlong_buffer.len=16"])
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        load_config(None, ["rollout.n=1"])
    with pytest.raises(ConfigError, match="ppo_micro_batch_size_per_gpu is required"):
        load_config(None, ["actor.use_dynamic_bsz=false"])


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(listy)
    typo = tmp_path / "typo.yaml"
    typo.write_text("actor:\n  clip_ratio_hi: 0.3\n")
    with pytest.raises(ConfigError, match="actor.clip_ratio_hi"):
        load_config(typo)


def test_override_beats_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("actor:\n  clip_ratio_high: 0.25\nrollout:\n  n: 4\n")
    cfg = load_config(f, ["actor.clip_ratio_high=0.3"])
    assert cfg.actor.clip_ratio_high == 0.3 and cfg.rollout.n == 4


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates_and_round_trips(path):
    cfg = load_config(path)
    assert DapoConfig.model_validate(config_to_dict(cfg)) == cfg


def test_paper_recipe_values():
    cfg = load_config(REPO / "configs" / "dapo_qwen2.5_32b.yaml")
    assert cfg.data.train_batch_size == 512 and cfg.data.gen_batch_size == 1536 and cfg.rollout.n == 16
    assert cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size == 16  # 16 gradient updates per step
    assert cfg.reward_model.overlong_buffer.len == 4096 and cfg.data.max_response_length == 20480
    assert cfg.actor.optim.lr == 1e-6 and cfg.rollout.val_kwargs.n == 32 and cfg.rollout.val_kwargs.top_p == 0.7


def test_config_reference_doc_is_current(tmp_path):
    import runpy

    out = tmp_path / "config.md"
    runpy.run_path(str(REPO / "scripts" / "write_config_doc.py"), run_name="not_main")["main"](out)
    assert out.read_text() == (REPO / "docs" / "config.md").read_text(), "run: python scripts/write_config_doc.py"
