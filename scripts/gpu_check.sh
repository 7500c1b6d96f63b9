#!/usr/bin/env bash
# The one short script for a lent GPU machine (the `device` tool): the GPU tests this machine can run (it first lists
# which of them skip and why), a rollout benchmark in bf16 on CUDA, a short training run with the packed actor layout
# (flash-attention's varlen kernel where it is installed) and with the padded one, MFU included; the actor update
# on a random-weight Qwen3-0.6B at 16K tokens a step beside prime-rl's one-H100 baseline.
#
#   bash scripts/gpu_check.sh --prepare      # HERE, once: wheels the GPU image lacks, into .whl/ (git-ignored)
#   bash scripts/gpu_check.sh                # THERE, with `.whl` carried: run(command=..., carry=[".whl"])
#
# The GPU image (docs of the device tool) has torch 2.11 + CUDA 13, transformers, pandas, pyarrow, click, rich,
# matplotlib, tensorboard, but not pydantic, and nothing can be fetched there. vLLM cannot be carried: its wheel is
# ~440 MB against the 64 MiB a call may carry, so the vLLM tests skip there with "vLLM is not installed". dapo is
# installed with --no-deps (its torch pin is the CPU one; the image's CUDA torch is used). Output also goes to
# $OUT/gpu_check.log. About 6 minutes on one H200 (never run yet: see docs/gpu-walkthrough.md).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
    exit $?
fi
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
python3 -c "import torch, dapo; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
# What this machine can run, before running it: every GPU test and what it needs. On a one-GPU machine without vLLM
# (the lent image) only tests/gpu/test_gpu_one_device.py runs; the vLLM tests (sleep mode, a step with vLLM on CUDA)
# and the 2-rank NCCL/FSDP2 test skip, and so do the vLLM tests of the CPU suite.
python3 - <<'PY'
import torch
from dapo.rollout.vllm_engine import vllm_available
gpus, (vllm, why) = torch.cuda.device_count(), vllm_available()
print(f"{gpus} CUDA device(s); vLLM {'installed' if vllm else 'missing: ' + why}")
for test, needs_gpus, needs_vllm in (
        ("tests/gpu/test_gpu_one_device.py::test_train_on_cuda_with_the_transformers_engine[fp32,bf16]", 1, False),
        ("tests/gpu/test_gpu_paths.py::test_vllm_sleeps_between_generations_and_wakes_with_the_pushed_weights", 1, True),
        ("tests/gpu/test_gpu_paths.py::test_one_training_step_with_vllm_on_cuda", 1, True),
        ("tests/gpu/test_gpu_paths.py::test_two_nccl_ranks_with_a_bf16_fsdp2_actor_and_vllm", 2, True)):
    missing = [m for m, lacking in (("a GPU" if needs_gpus == 1 else "2 GPUs", gpus < needs_gpus),
                                    ("vLLM", needs_vllm and not vllm)) if lacking]
    print(("SKIPS (needs " + " and ".join(missing) + "): " if missing else "runs: ") + test)
PY
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu -rs 2>&1 | tail -12
# The actor update on a random-weight Qwen3-0.6B (configs/models/qwen3-0.6b: its published config.json, no weights)
# at 16K tokens a step in bf16: tokens/s, MFU and s/step beside prime-rl's one-H100 baseline, then the HF engine's
# generation tokens/s on the same weights (ready, never run yet: docs/gpu-walkthrough.md).
timeout 300 python3 benchmarks/bench_qwen3_update.py --device cuda --dtype bf16 --tokens 16384 --seq-len 16384 \
    2>&1 | tail -5
timeout 240 python3 benchmarks/bench_rollout.py --device cuda --dtype bfloat16 --prompts 64 --n 8 --max-tokens 256 \
    --repeats 3 2>&1 | tail -12
for layout in packed padded; do
    rm -rf "$OUT/$layout"
    timeout 180 python3 -m dapo.cli.main train trainer.device=cuda actor.layout=$layout trainer.total_training_steps=3 \
        trainer.val_before_train=false trainer.default_local_dir="$OUT/$layout" 2>&1 | tail -2
    python3 - "$OUT/$layout/tiny-synth/metrics.jsonl" "$layout" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(sys.argv[2], r["step"], {k: round(v, 4) for k, v in r.items() if k in (
        "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/throughput", "actor/pg_loss",
        "perf/mfu/actor", "perf/mfu/rollout", "perf/tokens_per_s/rollout")})
PY
done

# ---- one-GPU colocated asynchronous training (#34 item 3, dapo.distributed.placement): the trainer and the rollout
# worker it spawns share cuda:0 (the HF engine here: vLLM is not in the image; with vLLM, rollout.gpu_memory_utilization
# is its fraction of the GPU), the weights cross through host memory on gloo (NCCL refuses two ranks on one device).
# A few steps of the tiny model, fully async with partial rollouts; its figures per step.
rm -rf "$OUT/async_colocated"
timeout 240 python3 -m dapo.cli.main train trainer.device=cuda async_training.mode=fully_async \
    async_training.staleness_threshold=1 async_training.partial_rollout=true trainer.total_training_steps=4 \
    trainer.val_before_train=false trainer.test_freq=0 trainer.default_local_dir="$OUT/async_colocated" 2>&1 | tail -3
python3 - "$OUT/async_colocated/tiny-synth/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("async_colocated", r["step"], {k: round(v, 4) for k, v in r.items() if k in (
        "timing_s/step", "timing_s/update_actor", "async/produce_s", "async/overlap_s", "async/trainer_idle_s",
        "async/engine_idle_s", "async/weight_transfer_s", "async/staleness/max", "rollout/probe_logprob_diff",
        "perf/throughput", "perf/mfu/actor")})
PY
