#!/usr/bin/env bash
# The paper's progression (Table 1) on the tiny task: six configs of the same code, two at a time on a 2-core CPU.
# Results: runs/ablation-*; summarise with `python scripts/summarize_ablation.py runs/ablation-*`.
set -euo pipefail
cd "$(dirname "$0")/.."
configs=(configs/ablation/*.yaml)
for ((i = 0; i < ${#configs[@]}; i += 2)); do
  for cfg in "${configs[@]:i:2}"; do
    name=$(basename "$cfg" .yaml)
    /usr/bin/time -v dapo train --config "$cfg" trainer.num_threads=1 trainer.resume_mode=disable "$@" \
      > "runs/log-$name.txt" 2>&1 &
  done
  wait
done
