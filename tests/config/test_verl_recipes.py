"""verl's DAPO recipe scripts as written (tests/fixtures/verl/*.sh) go through `dapo train --print-config`: every flag
is honoured with verl's meaning (the resolved config holds the script's value) or accepted with a one-line warning
that says why it does not apply; none is rejected."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dapo.cli.main import cli
from dapo.config import verl_keys
from dapo.config.loading import canonical_key, load_config_with_report, parse_override

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verl"
SCRIPTS = sorted(FIXTURES.glob("*.sh"))


def recipe_flags(script: Path, home: Path) -> list[str]:
    """The overrides the script passes, expanded by bash exactly as verl's launcher receives them."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "DAPO_TRAIN": "printf %s\\0"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout
    return [a for a in out.split("\0") if a]


def resolved(flags: list[str]) -> tuple[dict, list[str]]:
    result = CliRunner().invoke(cli, ["train", "--print-config", *flags])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout), load_config_with_report(None, flags)[1].warnings


def at(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_fixtures_are_there():
    assert [p.name for p in SCRIPTS] == [
        "run_dapo_early_qwen2.5_32b.sh",
        "run_dapo_qwen2.5_32b.sh",
        "test_dapo_7b.sh",
        "test_dapo_7b_math.sh",
    ]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_flag_is_honoured_or_warned(script: Path, tmp_path: Path):
    flags = recipe_flags(script, tmp_path)
    assert len(flags) >= 64
    tree, warnings = resolved(flags)
    warned_keys = {
        k.strip()
        for line in warnings
        if ": accepted without effect: " in line
        for k in line.split(": accepted without effect: ")[0].split(",")
    }
    for flag in flags:
        given, value = parse_override(flag)
        key = canonical_key(given)
        entry = verl_keys.lookup(key)
        if isinstance(entry, verl_keys.Warned):
            assert given in warned_keys, f"{flag}: accepted silently without effect"
            continue
        if isinstance(entry, verl_keys.Fixed):
            assert value in entry.allowed, flag
            continue
        if isinstance(entry, verl_keys.Matches):
            assert at(tree, entry.other) == value, flag
            continue
        if isinstance(entry, verl_keys.Renamed):
            key = entry.target + key[len(entry.key) :] if entry.key.endswith(".") else entry.target
            value = entry.translate(value) if entry.translate else value
            if value is None:
                continue
        translation = verl_keys.value_translation(key)
        if translation is not None:
            value = translation.translate(value)
        got = at(tree, key)
        if isinstance(got, float) and isinstance(value, str):
            value = float(value)  # YAML 1.1 reads 1e-6 as a string; the typed tree reads it as verl does, a number
        assert got == value, f"{flag}: resolved {key}={got!r}"
    assert all(line.count("\n") == 0 for line in warnings)  # one line each


# What each script intends, in this tree's keys (read off the scripts, not computed from the flags).
INTENDED = {
    "run_dapo_qwen2.5_32b": {
        "data.train_files": ["{home}/verl/data/dapo-math-17k.parquet"],
        "data.val_files": ["{home}/verl/data/aime-2024.parquet"],
        "data.max_prompt_length": 2048,
        "data.max_response_length": 20480,
        "data.train_batch_size": 512,
        "data.gen_batch_size": 1536,
        "rollout.n": 16,
        "rollout.name": "vllm",
        "rollout.val_kwargs.n": 1,
        "rollout.val_kwargs.top_p": 0.7,
        "rollout.val_kwargs.temperature": 1.0,
        "rollout.gpu_memory_utilization": 0.8,
        "rollout.tensor_model_parallel_size": 4,
        "rollout.max_num_batched_tokens": 22528,
        "actor.clip_ratio_low": 0.2,
        "actor.clip_ratio_high": 0.28,
        "actor.clip_ratio_c": 10.0,
        "actor.loss_agg_mode": "token-mean",
        "actor.use_kl_loss": False,
        "actor.kl_loss_coef": 0.0,
        "actor.ppo_mini_batch_size": 32,
        "actor.ppo_max_token_len_per_gpu": 22528,
        "actor.gradient_checkpointing": True,
        "actor.optim.lr": 1e-6,
        "actor.optim.lr_warmup_steps": 10,
        "actor.optim.weight_decay": 0.1,
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.max_num_gen_batches": 10,
        "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.len": 4096,
        "reward_model.overlong_buffer.penalty_factor": 1.0,
        "trainer.logger": ["console", "wandb"],
        "trainer.total_epochs": 1,
        "trainer.total_training_steps": None,
        "trainer.test_freq": 5,
        "trainer.save_freq": 25,
        "trainer.val_before_train": True,
        "trainer.resume_mode": "auto",
        "model.path": "{home}/verl/models/Qwen2.5-32B",
        "trainer.experiment_name": "DAPO-Qwen2.5-32B",
    },
    "run_dapo_early_qwen2.5_32b": {
        "algorithm.filter_groups.enable": False,
        "data.gen_batch_size": 512,
        "actor.loss_agg_mode": "seq-mean-token-mean",
        "reward_model.overlong_buffer.len": 4096,
        "rollout.val_kwargs.top_p": 1.0,
        "rollout.val_kwargs.n": 1,
        "trainer.total_training_steps": None,
        "trainer.save_freq": 5,
        "actor.gradient_checkpointing": True,
    },
    "test_dapo_7b": {
        "data.max_response_length": 2048,
        "reward_model.overlong_buffer.len": 512,
        "actor.loss_agg_mode": "token-mean",
        "actor.ppo_micro_batch_size_per_gpu": None,
        "rollout.gpu_memory_utilization": 0.85,
        "trainer.test_freq": 2,
        "trainer.resume_mode": "disable",
        "model.path": "{home}/verl/models/Qwen2.5-Math-7B",
        "trainer.total_training_steps": None,
    },
    "test_dapo_7b_math": {
        "data.max_response_length": 8192,
        "data.gen_batch_size": None,
        "actor.ppo_max_token_len_per_gpu": 20480,
        "reward_model.overlong_buffer.len": 4096,
        "reward_model.overlong_buffer.log": False,
        "trainer.total_training_steps": 200,
        "trainer.total_epochs": 10,
        "rollout.val_kwargs.top_p": 0.7,
    },
}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_resolved_config_is_what_the_script_intends(script: Path, tmp_path: Path):
    tree, _ = resolved(recipe_flags(script, tmp_path))
    for key, want in INTENDED[script.stem].items():
        if isinstance(want, str):
            want = want.format(home=tmp_path)
        elif isinstance(want, list):
            want = [w.format(home=tmp_path) for w in want]
        assert at(tree, key) == want, key


def test_warnings_reach_stderr_of_the_cli(tmp_path: Path):
    flags = recipe_flags(FIXTURES / "run_dapo_qwen2.5_32b.sh", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        ["python", "-m", "dapo.cli.main", "train", "--print-config", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in proc.stderr
    assert "accepted without effect" in proc.stderr and "actor.strategy=fsdp2" in proc.stderr
    assert yaml.safe_load(proc.stdout)["rollout"]["n"] == 16
