"""`dapo explain`: the layout of a step of the shipped recipes, and refusals (exit 2, keys named, no traceback)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from dapo.cli.main import cli
from tests.harness.runners import run_dapo

REPO = Path(__file__).resolve().parents[2]
FULL = str(REPO / "configs" / "dapo_qwen2.5_32b.yaml")
EARLY = str(REPO / "configs" / "dapo_early_qwen2.5_32b.yaml")
SEVEN_B = str(REPO / "configs" / "dapo_qwen2.5_math_7b.yaml")


def explain(*args: str):
    return CliRunner().invoke(cli, ["explain", *args])


def value(out: str, label: str) -> str:
    """The value printed after a row's label."""
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(label))
    return line.strip()[len(label) :].strip()


# ---- in a subprocess, as a user runs it --------------------------------------------------------------------------------
def test_full_recipe_on_128_gpus_subprocess(tmp_path):
    proc = run_dapo(["explain", "--config", FULL, "--nnodes", "16", "--nproc-per-node", "8"], tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "16 node(s) x 8 GPU(s) = 128 rank(s)" in out
    assert value(out, "optimizer steps per rollout step").startswith("16 = actor.ppo_epochs 1 x 512 / ")
    assert "Qwen2.5-32B, 32.76 B parameters" in out and "built-in table: config.json of Qwen/Qwen2.5-32B" in out
    assert value(out, "prompts per step (data.train_batch_size)") == "512"
    assert value(out, "responses per step (x rollout.n 16)") == "8192"
    assert value(out, "expected generation rounds").startswith("1 = ceil(512 / (1536 x 0.5)), at most 10")
    assert value(out, "per rank per mini-batch").startswith("4 samples")
    assert value(out, "micro-batches per rank per mini-batch").startswith("2 expected")
    assert value(out, "token bound per micro-batch").startswith("22528")
    # memory per GPU: 16 B/param sharded over 128 ranks: 4 x 32.76e9 / 128 B = 976.4 MiB of parameters, 1.9 GiB of m, v
    assert value(out, "parameters (fp32, 4 B each)").startswith("976.4 MiB sharded over 128  | 122.1 GiB unsharded")
    assert value(out, "optimizer (AdamW m and v, fp32)").startswith("1.9 GiB sharded")
    assert value(out, "vLLM KV cache per token").startswith("64.0 KiB")
    phase = float(
        re.match(r"([\d.]+) GiB", value(out, "actor training phase (states + layer + activations + logits)"))[1]
    )
    assert 20 < phase < 80
    assert "Traceback" not in proc.stderr


def test_refusal_subprocess_exit_2_names_the_keys(tmp_path):
    proc = run_dapo(
        [
            "explain",
            "--config",
            FULL,
            "--nnodes",
            "1",
            "--nproc-per-node",
            "6",
            "reward_model.overlong_buffer.len=20480",
        ],
        tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "rollout.tensor_model_parallel_size (4) must divide the world size (6" in proc.stderr
    assert "reward_model.overlong_buffer.len (L_cache = 20480) must be below data.max_response_length" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---- in-process ------------------------------------------------------------------------------------------------------
def test_7b_recipe_on_8_gpus():
    res = explain("--config", SEVEN_B, "--nnodes", "1", "--nproc-per-node", "8")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Qwen2.5-Math-7B, 7.62 B parameters" in out
    assert value(out, "optimizer steps per rollout step").startswith("16 = ")
    assert value(out, "per rank per mini-batch").startswith("64 samples (32 prompts x 16 / 8 ranks)")
    assert value(out, "micro-batches per rank per mini-batch").startswith("32 expected = ceil(64 x 2048 tokens / 4096)")
    assert value(out, "parameters (fp32, 4 B each)").startswith("3.5 GiB sharded over 8")
    assert value(out, "vLLM KV cache per token").startswith("56.0 KiB")
    assert "warnings" not in out


def test_early_recipe_and_defaults_explain():
    res = explain("--config", EARLY, "--nnodes", "16", "--nproc-per-node", "8")
    assert res.exit_code == 0, res.output
    assert "filter_groups.enable=false" in res.output
    res = explain()  # the embedded tiny model's default run, sized from its own config.json
    assert res.exit_code == 0, res.output
    assert "tiny-qwen2 (embedded), 0.00 B parameters" in res.output and "assets/tiny-qwen2/config.json" in res.output


def test_overrides_and_assumption_flags():
    res = explain(
        "--config",
        FULL,
        "--nnodes",
        "16",
        "--nproc-per-node",
        "8",
        "--informative-fraction",
        "0.1",
        "--response-tokens",
        "4000",
        "actor.ppo_epochs=2",
    )
    assert res.exit_code == 0, res.output
    assert value(res.output, "optimizer steps per rollout step").startswith("32 = actor.ppo_epochs 2")
    assert value(res.output, "expected generation rounds").startswith("4 = ceil(512 / (1536 x 0.1))")
    assert value(res.output, "expected generated tokens per step").startswith("393.22 M")  # 4 x 24576 x 4000


def test_local_model_config_is_preferred(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 100,
                "tie_word_embeddings": True,
            }
        )
    )
    res = explain("--config", SEVEN_B, "--nnodes", "1", "--nproc-per-node", "8", f"model.path={folder}")
    assert res.exit_code == 0, res.output
    assert "model: my-model" in res.output and f"local model folder: {folder / 'config.json'}" in res.output


def test_unknown_model_gives_layout_without_memory():
    res = explain("--config", SEVEN_B, "--nnodes", "1", "--nproc-per-node", "8", "model.path=someone/unknown-9b")
    assert res.exit_code == 0, res.output
    assert "model: unknown size" in res.output and "--model-config" in res.output
    assert "memory per GPU" not in res.output and value(res.output, "optimizer steps per rollout step").startswith("16")


@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--config", SEVEN_B, "--nnodes", "1", "--nproc-per-node", "6"],
            "data.train_batch_size (512) must be divisible by the data-parallel size (6",
        ),
        (
            ["--config", SEVEN_B, "--nnodes", "1", "--nproc-per-node", "8", "actor.ppo_mini_batch_size=1024"],
            "actor.ppo_mini_batch_size (1024) must divide data.train_batch_size (512)",
        ),
        (
            ["--config", SEVEN_B, "--nnodes", "8", "--nproc-per-node", "8", "rollout.n=3"],
            "actor.ppo_mini_batch_size 32 x rollout.n 3 = 96) must be divisible by the number of ranks (64)",
        ),
        (
            ["--config", SEVEN_B, "--nproc-per-node", "8", "reward_model.overlong_buffer.len=2048"],
            "reward_model.overlong_buffer.len (L_cache = 2048) must be below data.max_response_length (L_max = 2048)",
        ),
        (
            ["--config", FULL, "--nnodes", "1", "--nproc-per-node", "6"],
            "rollout.tensor_model_parallel_size (4) must divide the world size (6",
        ),
        (["--config", SEVEN_B, "--nproc-per-node", "8", "data.gen_batch_size=1540"], "data.gen_batch_size (1540)"),
        (["--config", SEVEN_B, "--nproc-per-node", "8", "actor.clip_ratio_hgh=0.3"], "clip_ratio_hgh"),
        (
            ["--config", FULL, "--nnodes", "16", "--nproc-per-node", "8", "--informative-fraction", "0"],
            "--informative-fraction must be in (0, 1]",
        ),
    ],
)
def test_refusals_exit_2_naming_the_keys(args, expect):
    res = explain(*args)
    assert res.exit_code == 2, res.output
    assert expect in res.output and "Traceback" not in res.output


def test_small_token_budget_is_a_warning_not_a_refusal():
    res = explain("--config", SEVEN_B, "--nproc-per-node", "8", "actor.ppo_max_token_len_per_gpu=3000")
    assert res.exit_code == 0, res.output
    assert "warnings" in res.output and "actor.ppo_max_token_len_per_gpu (3000) is smaller than" in res.output
    # before the numbers they qualify (the micro-batch layout), not after the last table
    assert res.output.index("actor.ppo_max_token_len_per_gpu (3000) is smaller than") < res.output.index("\nstep\n")


@pytest.mark.parametrize("path", [FULL, EARLY, SEVEN_B], ids=lambda p: Path(p).name)
def test_recipe_headers_hold_their_launch_and_explain_commands(path):
    text = Path(path).read_text()
    header = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    name = f"configs/{Path(path).name}"
    nodes = "--nnodes 1 --nproc-per-node 8" if "7b" in name else "--nnodes 16 --nproc-per-node 8"
    assert f"#   dapo explain --config {name} {nodes}" in header
    assert f"torchrun {nodes}" in header and "-m dapo.cli.main train --config " + name in header
    assert "multi-rank training is not implemented in this repo" in header
