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
    cfg = load_config(
        None,
        [
            "algorithm.clip_ratio_high=0.3",
            "actor_rollout_ref.actor.optim.lr=2e-6",
            "actor_rollout_ref.rollout.n=4",
            "+data.gen_batch_size=48",
        ],
    )
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
    assert cfg.actor.optim.lr == 1e-6 and cfg.rollout.val_kwargs.top_p == 0.7
    assert cfg.rollout.val_kwargs.n == 1  # the official AIME file repeats each problem 32x: n=1 is avg@32


def test_config_reference_doc_is_current(tmp_path):
    import runpy

    out = tmp_path / "config.md"
    runpy.run_path(str(REPO / "scripts" / "write_config_doc.py"), run_name="not_main")["main"](out)
    assert out.read_text() == (REPO / "docs" / "config.md").read_text(), "run: python scripts/write_config_doc.py"


# ---- verl habits (issue 12) ------------------------------------------------------------------------------------------


def test_all_problems_in_one_message_each_with_a_suggestion():
    with pytest.raises(ConfigError) as err:
        load_config(
            None,
            [
                "actor.clip_ratio_hgh=0.3",
                "rollout.temprature=1.0",
                "actor.loss_agg_mode=token_mean",
                "data.train_batch_size=abc",
                "actor_rollout_ref.actor.use_remove_padding=True",
            ],
        )
    msg = str(err.value)
    assert msg.startswith("invalid configuration (defaults + overrides): 5 problems")
    assert "Did you mean 'clip_ratio_high'" in msg and "Did you mean 'temperature'" in msg
    assert "did you mean 'token-mean'" in msg and "data.train_batch_size" in msg
    assert "'actor_rollout_ref.actor.use_remove_padding' (= 'actor.use_remove_padding')" in msg
    assert "Did you mean 'model.use_remove_padding'" in msg


def test_plain_string_files_plus_keys_and_verl_values():
    cfg = load_config(
        None,
        [
            "data.train_files=/d/train.parquet",
            "+data.val_files=/d/val.parquet",
            "+trainer.val_before_train=False",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=-1",
            "data.filter_overlong_prompts=True",
            "trainer.logger=console",
        ],
    )
    assert cfg.data.train_files == ["/d/train.parquet"] and cfg.data.val_files == ["/d/val.parquet"]
    assert cfg.trainer.val_before_train is False and cfg.actor.optim.lr_warmup_steps == 0
    assert cfg.data.filter_overlong_prompts == "drop" and cfg.trainer.logger == ["console"]
    assert load_config(None, ["data.filter_overlong_prompts=False"]).data.filter_overlong_prompts == "error"


def test_renamed_verl_keys():
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            "actor_rollout_ref.actor.use_token_level_loss=False",
            "custom_reward_function.overlong_buffer.len=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size=4",
            "actor.use_dynamic_bsz=false",
        ],
    )
    assert cfg.actor.gradient_checkpointing and cfg.actor.loss_agg_mode == "seq-mean-token-mean"
    assert cfg.reward_model.overlong_buffer.len == 8 and cfg.actor.ppo_micro_batch_size_per_gpu == 4
    cfg = load_config(
        None, ["+reward_model.reward_kwargs.overlong_buffer_cfg.len=16", "+reward_model.reward_kwargs.max_resp_len=64"]
    )
    assert cfg.reward_model.overlong_buffer.len == 16


def test_fixed_and_matching_verl_keys_are_checked():
    with pytest.raises(ConfigError) as err:
        load_config(
            None,
            [
                "data.prompt_key=question",
                "reward_model.reward_manager=naive",
                "algorithm.use_kl_in_reward=True",
                "+reward_model.reward_kwargs.max_resp_len=100",
            ],
        )
    msg = str(err.value)
    assert "4 problems" in msg and "data.prompt_key='question': only 'prompt' is supported" in msg
    assert "reward_model.reward_manager='naive'" in msg and "algorithm.use_kl_in_reward=True" in msg
    assert "max_resp_len=100 differs from data.max_response_length=64" in msg


def test_warned_verl_keys_are_accepted_with_one_line_each(caplog):
    from dapo.config.loading import load_config_with_report

    flags = [
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "trainer.nnodes=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=null",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    ]
    cfg, report = load_config_with_report(None, flags)
    assert cfg == load_config()
    assert len(report.warnings) == 4 and all("\n" not in w and "accepted without effect" in w for w in report.warnings)
    # each says where the setting lives here instead: dapo's FSDP2 keys, and torchrun for the world size
    assert any("fsdp_config.param_offload" in w and "actor.strategy=fsdp2" in w for w in report.warnings)
    assert any("trainer.nnodes" in w and "torchrun" in w for w in report.warnings)
    with caplog.at_level("WARNING", logger="dapo.config"):
        load_config(None, flags)
    assert len([r for r in caplog.records if r.name == "dapo.config"]) == 4


def test_total_epochs_governs_length_without_total_training_steps(tmp_path):
    assert load_config().trainer.total_training_steps == 30  # the tiny default run
    cfg = load_config(None, ["trainer.total_epochs=3"])
    assert cfg.trainer.total_training_steps is None and cfg.trainer.total_epochs == 3
    cfg = load_config(None, ["trainer.total_epochs=3", "trainer.total_training_steps=7"])
    assert cfg.trainer.total_training_steps == 7  # as in verl, an explicit step count wins
    f = tmp_path / "x.yaml"
    f.write_text("trainer:\n  total_epochs: 2\n")
    assert load_config(f).trainer.total_training_steps is None


def test_default_local_dir_difference_is_warned():
    from dapo.config.loading import load_config_with_report

    _, report = load_config_with_report(None, ["trainer.default_local_dir=/ck/DAPO/exp", "trainer.experiment_name=exp"])
    assert any("default_local_dir/experiment_name = /ck/DAPO/exp/exp" in w for w in report.warnings)
    _, report = load_config_with_report(None, ["trainer.default_local_dir=/ck/DAPO"])
    assert report.warnings == []


def test_run_record_is_written_whatever_the_loggers():
    from dapo.config.loading import tracker_backends

    assert tracker_backends(load_config(None, ["trainer.logger=[console,wandb]"])) == ["jsonl", "console", "wandb"]
    assert tracker_backends(load_config()) == ["jsonl", "tensorboard"]


def test_resume_refuses_changed_hyper_parameters(tmp_path):
    import yaml

    from dapo.config.resume import check_resume, resume_conflicts

    old = load_config(None, ["actor.clip_ratio_high=0.28"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_to_dict(old)))
    check_resume(tmp_path, load_config(None, ["trainer.total_training_steps=60", "trainer.logger=[jsonl]"]))
    new = load_config(None, ["actor.clip_ratio_high=0.3", "rollout.n=4"])
    assert resume_conflicts(config_to_dict(old), new) == ["actor.clip_ratio_high: 0.28 -> 0.3", "rollout.n: 8 -> 4"]
    with pytest.raises(ConfigError, match=r"Changed \(2\):\n  actor.clip_ratio_high: 0.28 -> 0.3") as err:
        check_resume(tmp_path, new)
    assert "trainer.resume_with_changes=true" in str(err.value)
    check_resume(tmp_path, load_config(None, ["actor.clip_ratio_high=0.3", "trainer.resume_with_changes=true"]))
    check_resume(tmp_path / "fresh", new)  # nothing saved there: nothing to compare
    saved = config_to_dict(old)
    del saved["reward_model"]["compat"]  # a run started before the key existed
    assert resume_conflicts(saved, old) == []


@pytest.mark.parametrize("name", ["dapo_qwen2.5_32b.yaml", "dapo_early_qwen2.5_32b.yaml", "dapo_qwen2.5_math_7b.yaml"])
def test_gpu_recipes_name_the_prepared_files_and_sample_avg32_once(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.data.train_files == ["data/dapo17k/train.parquet"]  # `dapo data prepare ... --out data/dapo17k`
    assert cfg.data.val_files == ["data/aime-2024.parquet"]  # the official file, each problem 32 times
    assert cfg.rollout.val_kwargs.n == 1 and cfg.trainer.total_training_steps is None


def test_7b_recipe_is_verls_test_script():
    cfg = load_config(REPO / "configs" / "dapo_qwen2.5_math_7b.yaml")
    assert cfg.model.path == "Qwen/Qwen2.5-Math-7B" and cfg.rollout.name == "vllm"
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (2048, 2048)
    assert (cfg.data.train_batch_size, cfg.data.gen_batch_size, cfg.actor.ppo_mini_batch_size, cfg.rollout.n) == (
        512,
        1536,
        32,
        16,
    )
    assert cfg.reward_model.overlong_buffer.len == 512 and cfg.actor.ppo_max_token_len_per_gpu == 4096
    assert (cfg.trainer.test_freq, cfg.trainer.save_freq, cfg.trainer.resume_mode) == (2, 2, "disable")
    header = (REPO / "configs" / "dapo_qwen2.5_math_7b.yaml").read_text()
    assert "#   dapo train --config configs/dapo_qwen2.5_math_7b.yaml" in header


def test_several_config_files_merge_in_order_later_wins(tmp_path) -> None:
    first = tmp_path / "first.yaml"
    first.write_text("actor:\n  clip_ratio_high: 0.28\n  clip_ratio_low: 0.1\ntrainer:\n  seed: 7\n")
    second = tmp_path / "second.yaml"
    second.write_text("actor:\n  clip_ratio_high: 0.3\ntrainer:\n  total_training_steps: 4\n")
    cfg = load_config([first, second])
    # Both files' keys survive (the merge is per key, within each section); on a conflict the later file wins.
    assert (cfg.actor.clip_ratio_low, cfg.trainer.seed, cfg.trainer.total_training_steps) == (0.1, 7, 4)
    assert cfg.actor.clip_ratio_high == 0.3
    assert load_config([second, first]).actor.clip_ratio_high == 0.28
    assert load_config([first]).trainer.total_training_steps == load_config(None).trainer.total_training_steps


def test_train_cli_merges_repeated_config_options(tmp_path) -> None:
    from tests.harness.runners import run_dapo_in_process

    first = tmp_path / "first.yaml"
    first.write_text("trainer:\n  seed: 7\n  experiment_name: from-first\n")
    second = tmp_path / "second.yaml"
    second.write_text("trainer:\n  experiment_name: from-second\n")
    proc = run_dapo_in_process(["train", "--config", str(first), "--config", str(second), "--print-config"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "seed: 7" in proc.stdout and "experiment_name: from-second" in proc.stdout
