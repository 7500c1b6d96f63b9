"""benchmarks/vs_trl.py gives TRL every setting from dapo's resolved config: each GRPOConfig keyword the harness
passes is checked here against the dapo value it must mirror (no TRL training runs). With TRL installed
(`pip install trl==1.16.0`; CI does not install it) the keywords also build a real GRPOConfig that keeps them."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from dapo.config import config_to_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "benchmarks" / "vs_trl.py")
vs_trl = importlib.util.module_from_spec(_spec)
sys.modules["vs_trl"] = vs_trl  # its dataclasses look their module up
_spec.loader.exec_module(vs_trl)

ARGS = argparse.Namespace(
    prompts=None,
    samples=None,
    max_tokens=None,
    opt_steps=None,
    dapo_override=None,
    trl_micro_batch=None,
    threads=2,
    seed=7,
    device="cpu",
    steps=3,
)

# keyword -> (the dapo value it mirrors, from the resolved config dict c and the job j)
MIRRORED = {
    "seed": lambda c, j: ARGS.seed,
    "use_cpu": lambda c, j: ARGS.device == "cpu",
    "bf16": lambda c, j: c["actor"]["dtype"] == "bf16",
    "gradient_checkpointing": lambda c, j: c["actor"]["gradient_checkpointing"],
    "learning_rate": lambda c, j: c["actor"]["optim"]["lr"],
    "weight_decay": lambda c, j: c["actor"]["optim"]["weight_decay"],
    "adam_beta1": lambda c, j: c["actor"]["optim"]["betas"][0],
    "adam_beta2": lambda c, j: c["actor"]["optim"]["betas"][1],
    "adam_epsilon": lambda c, j: c["actor"]["optim"]["eps"],
    "max_grad_norm": lambda c, j: c["actor"]["grad_clip"],
    "max_steps": lambda c, j: ARGS.steps * j.opt_steps,
    "per_device_train_batch_size": lambda c, j: j.samples,  # one group per micro-batch unless --trl-micro-batch
    # K optimizer steps per rollout step, as dapo's ppo_mini_batch_size = prompts / K
    "gradient_accumulation_steps": lambda c, j: j.prompts * j.samples // j.opt_steps // j.samples,
    "steps_per_generation": lambda c, j: j.prompts,
    "num_generations": lambda c, j: j.samples,
    "max_completion_length": lambda c, j: j.max_tokens,
    "temperature": lambda c, j: c["rollout"]["temperature"],
    "top_p": lambda c, j: c["rollout"]["top_p"],
    "top_k": lambda c, j: 0 if c["rollout"]["top_k"] in (-1, 0) else c["rollout"]["top_k"],
    "epsilon": lambda c, j: c["actor"]["clip_ratio_low"],
    "epsilon_high": lambda c, j: c["actor"]["clip_ratio_high"],
    "scale_rewards": lambda c, j: "group" if c["algorithm"]["norm_adv_by_std_in_grpo"] else "none",
    "mask_truncated_completions": lambda c, j: c["algorithm"]["overlong_filter"],
    "reward_weights": lambda c, j: (
        [1.0, c["reward_model"]["overlong_buffer"]["penalty_factor"]]
        if c["reward_model"]["overlong_buffer"]["enable"]
        else [1.0]
    ),
}
# keyword -> the fixed value that makes TRL run DAPO as dapo does (or only shapes the harness's bookkeeping)
FIXED = {
    "fp16": False,
    "lr_scheduler_type": "constant",
    "optim": "adamw_torch",
    "num_iterations": 1,
    "shuffle_dataset": False,
    "loss_type": "dapo",
    "beta": 0.0,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "disable_tqdm": True,
    "log_completions": False,
    "dataloader_num_workers": 0,
    "output_dir": "/tmp/out",
}

CASES = {
    "tiny": (None, []),
    "smollm2": (ROOT / "configs" / "smollm2_135m.yaml", []),
    "flipped": (
        None,
        [
            "actor.gradient_checkpointing=true",
            "algorithm.overlong_filter=true",
            "actor.dtype=bf16",
            "algorithm.norm_adv_by_std_in_grpo=false",
            "rollout.top_k=5",
            "rollout.top_p=0.9",
            "reward_model.overlong_buffer.enable=false",
            "actor.optim.lr=3e-5",
        ],
    ),
}


def kwargs_of(case: str):
    config, overrides = CASES[case]
    resolved = config_to_dict(load_config(config, overrides))
    job = vs_trl.job_definition("smollm2" if case == "smollm2" else "tiny", ARGS)
    spec = dict(vs_trl.trl_spec(job, resolved, ARGS, Path("/tmp/data.parquet")), output_dir="/tmp/out")
    weights = [1.0] + ([float(spec["overlong_factor"])] if spec["overlong"] else [])  # as the worker builds them
    return resolved, job, vs_trl.grpo_config_kwargs(spec, weights)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_keyword_mirrors_dapo(case: str) -> None:
    resolved, job, kwargs = kwargs_of(case)
    assert set(kwargs) == set(MIRRORED) | set(FIXED), "a keyword passed to TRL without a check here (or vice versa)"
    for key, dapo_value in MIRRORED.items():
        assert kwargs[key] == dapo_value(resolved, job), key
    for key, value in FIXED.items():
        assert kwargs[key] == value, key


def test_gradient_checkpointing_follows_dapo() -> None:
    # TRL 1.16 defaults to gradient checkpointing on: the tiny job (dapo off) must pass False, the SmolLM2 preset True
    assert kwargs_of("tiny")[2]["gradient_checkpointing"] is False
    assert kwargs_of("smollm2")[2]["gradient_checkpointing"] is True
    assert kwargs_of("flipped")[2]["gradient_checkpointing"] is True


@pytest.mark.parametrize("case", sorted(CASES))
def test_trl_keeps_what_it_is_given(case: str) -> None:
    trl = pytest.importorskip("trl", reason="TRL is a benchmark-only dependency (pip install trl==1.16.0)")
    from trl import GRPOConfig

    _, _, kwargs = kwargs_of(case)
    config = GRPOConfig(**kwargs)
    for key in (
        "gradient_checkpointing",
        "learning_rate",
        "max_grad_norm",
        "epsilon",
        "epsilon_high",
        "beta",
        "loss_type",
        "temperature",
        "top_p",
        "top_k",
        "num_generations",
        "max_completion_length",
        "steps_per_generation",
        "gradient_accumulation_steps",
        "per_device_train_batch_size",
        "mask_truncated_completions",
        "reward_weights",
        "seed",
        "bf16",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "num_iterations",
        "shuffle_dataset",
    ):
        assert getattr(config, key) == kwargs[key], (trl.__version__, key)
    assert str(config.scale_rewards) == kwargs["scale_rewards"]


def test_summary_keeps_dapos_mfu_from_its_metrics(tmp_path: Path) -> None:
    import json

    job = vs_trl.job_definition("tiny", ARGS)
    rows = [
        {
            "step": s,
            "timing_s/step": 2.0,
            "timing_s/gen": 1.0,
            "timing_s/update_actor": 0.5,
            "perf/mfu/actor": mfu,
            "perf/mfu/rollout": mfu / 2,
        }
        for s, mfu in ((1, 0.9), (2, 0.2), (3, 0.4))
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    steps = vs_trl.dapo_steps(path, job)
    runs = [
        {"program": "dapo", "steps": steps, "peak_rss_gb": 1.0},
        {
            "program": "trl",
            "steps": [{**{k: v for k, v in s.items() if k != "perf"}, "train": 0.5} for s in steps],
            "peak_rss_gb": 1.0,
        },
    ]
    summary = vs_trl.summarize(runs, skip_first=True)
    assert summary["dapo"]["perf/mfu/actor"] == pytest.approx(0.3)  # median of steps 2 and 3 (the first is left out)
    assert summary["dapo"]["perf/mfu/rollout"] == pytest.approx(0.15)
    assert "perf/mfu/actor" not in summary["trl"]
