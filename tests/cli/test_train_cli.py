"""`dapo train` end to end through the real CLI: metrics, checkpoint, plot, and the printed summary."""

from __future__ import annotations

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.harness.runners import run_dapo
from tests.training.test_perf_metrics import check_perf_metrics

REQUIRED_STEP_KEYS = {
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "critic/score/mean",
    "critic/rewards/mean",
    "acc/mean",
    "actor/entropy",
    "actor/mean_prob",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/lr",
    "train/num_gen_batches",
    "train/kept_group_ratio",
    "train/wasted_tokens",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
    "actor/old_log_prob_recomputed",
    "actor/num_zero_advantage_samples",
    "perf/max_memory_rss_gb",
    "perf/max_memory_rss_gb/update_actor",
    "perf/mfu/actor",
    "perf/mfu/rollout",
    "perf/tokens_per_s/actor",
    "perf/tokens_per_s/rollout",
    "perf/flops/actor",
    "perf/flops/rollout",
}


def test_short_train_through_the_cli(tmp_path, fast_args):
    proc = run_dapo(
        ["train", *fast_args, "trainer.experiment_name=short", "trainer.profile_steps=[2]"],
        tmp_path,
        extra_env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # the matmul probe's cache (perf/mfu/*)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "short"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == [0, 1, 2]
    assert "val/acc/mean@2" in records[0] and "val/pass@2" in records[0]
    for record in records[1:]:
        missing = REQUIRED_STEP_KEYS - record.keys()
        assert not missing, f"step {record['step']} lacks {sorted(missing)}"
        assert 0.0 < record["actor/mean_prob"] <= 1.0
        # 2 mini-batches, and the HF engine samples from the actor's own fp32 weights: no old-log-prob pass
        assert record["actor/old_log_prob_recomputed"] == 0.0 and record["timing_s/old_log_prob"] == 0.0
        assert 0.1 < record["perf/max_memory_rss_gb/update_actor"] <= record["perf/max_memory_rss_gb"] < 64
        assert record["response_length/min"] <= record["response_length/mean"] <= record["response_length/max"]
        check_perf_metrics(record)  # model FLOPs, MFU, tokens/s per phase
    assert "val/acc/mean@2" in records[-1]
    # The final checkpoint is a Hugging Face folder that from_pretrained loads.
    hf = run_dir / "checkpoints" / "global_step_2" / "hf"
    AutoModelForCausalLM.from_pretrained(hf)
    assert AutoTokenizer.from_pretrained(hf).chat_template
    assert (run_dir / "plots" / "training.png").stat().st_size > 10_000
    assert "validation val/acc/mean@2: first" in proc.stdout and "plots:" in proc.stdout
    # trainer.profile_steps=[2]: step 2's generation and update, each with its own operators (step 1 not profiled)
    assert sorted(p.name for p in (run_dir / "profile").iterdir()) == ["step2.json", "step2.txt"]
    assert "profile (trainer.profile_steps" in proc.stdout and str(run_dir / "profile" / "step2.txt") in proc.stdout
    profile = json.loads((run_dir / "profile" / "step2.json").read_text())
    assert {"gen", "reward", "update_actor", "sync_weights"} <= set(profile["phases"])
    for phase in ("gen", "update_actor"):
        ops = {op["op"] for op in profile["phases"][phase]["operators"]}
        assert {"aten::mm", "aten::addmm"} & ops, (phase, ops)  # the weights' products run in both
    assert abs(profile["phases"]["update_actor"]["wall_s"] - records[2]["timing_s/update_actor"]) < 0.5


def test_print_config_and_bad_override(tmp_path):
    proc = run_dapo(["train", "--print-config", "algorithm.clip_ratio_high=0.3"], tmp_path)
    assert proc.returncode == 0 and "clip_ratio_high: 0.3" in proc.stdout
    proc = run_dapo(["train", "algorithm.clip_ratio_hgh=0.3"], tmp_path)
    assert proc.returncode != 0
    assert "algorithm.clip_ratio_hgh" in proc.stderr and "Traceback" not in proc.stderr
