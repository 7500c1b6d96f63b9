#!/usr/bin/env bash
# The one short script for a lent GPU machine (the `device` tool): install, run the GPU-only tests, then measure
# the figures the issues ask for (vLLM rollout throughput and the probe gap, bf16, flash-attention packing).
# Everything it prints is also written under ${OUT:-/tmp/gpu_check}. About 6-8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
pip install -q -e ".[dev]" vllm 2>&1 | tail -2
python -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__)"
timeout 900 python -m pytest -q tests/gpu -rs 2>&1 | tail -15
timeout 300 python benchmarks/bench_rollout.py --device cuda --dtype bfloat16 --prompts 64 --n 8 --max-tokens 256 \
    --repeats 3 2>&1 | tail -12
rm -rf "$OUT/run"
timeout 300 dapo train trainer.device=cuda rollout.name=vllm trainer.total_training_steps=3 \
    trainer.default_local_dir="$OUT/run" 2>&1 | tail -5
python - "$OUT/run/tiny-synth/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["step"], {k: round(v, 4) for k, v in r.items()
                      if k in ("timing_s/gen", "timing_s/update_actor", "timing_s/step", "rollout/probe_logprob_diff",
                               "rollout/log_prob_diff/mean", "perf/throughput")})
PY
# The packed actor layout, which uses flash-attention's variable-length kernel where it is installed.
rm -rf "$OUT/packed"
timeout 300 dapo train trainer.device=cuda actor.layout=packed trainer.total_training_steps=2 \
    trainer.default_local_dir="$OUT/packed" 2>&1 | tail -3
