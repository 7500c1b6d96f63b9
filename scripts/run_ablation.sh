#!/usr/bin/env bash
# The paper's progression (Table 1) on the tiny task, every config with several seeds, two runs at a time on a
# 2-core CPU (one torch thread each).
#
#   scripts/run_ablation.sh [SEEDS] [OVERRIDE ...]         # SEEDS (default 3): seeds 1..SEEDS of every config
#   ABLATION_CONFIGS="configs/clip_entropy/*.yaml" scripts/run_ablation.sh 3
#   ABLATION_OUT=runs/ablation scripts/run_ablation.sh 3 trainer.total_training_steps=20
#
# A seed sets both the rollout sampling (trainer.seed) and the prompt order (data.seed); the model, the task and the
# validation set are the same for every seed. Run k of config C is $ABLATION_OUT/<C's experiment_name>-s<k>, its
# console log beside it (log-<run>.txt). Summarise with
#   python scripts/summarize_ablation.py "$ABLATION_OUT"/*-s* --plots docs/img/ablation
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=3
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  seeds=$1
  shift
fi
if (( seeds < 1 )); then
  echo "run_ablation.sh: SEEDS must be >= 1, got $seeds" >&2
  exit 2
fi
out=${ABLATION_OUT:-runs/ablation}
read -r -a configs <<< "${ABLATION_CONFIGS:-configs/ablation/*.yaml}"
configs=($(ls ${configs[@]}))
mkdir -p "$out"

jobs=()
for cfg in "${configs[@]}"; do
  for ((s = 1; s <= seeds; s++)); do
    jobs+=("$cfg $s")
  done
done
echo "run_ablation: ${#configs[@]} configs x $seeds seeds = ${#jobs[@]} runs into $out"

failed=0
run_one() {
  local cfg=$1 seed=$2
  shift 2  # the rest are the user's overrides
  local name
  name="$(dapo train --config "$cfg" --print-config | sed -n 's/^  experiment_name: //p')-s$seed"
  /usr/bin/time -v dapo train --config "$cfg" trainer.num_threads=1 trainer.resume_mode=disable \
    trainer.progress=false trainer.seed="$seed" data.seed="$seed" trainer.experiment_name="$name" \
    trainer.default_local_dir="$out" "$@" > "$out/log-$name.txt" 2>&1
}
for ((i = 0; i < ${#jobs[@]}; i += 2)); do
  pids=()
  for job in "${jobs[@]:i:2}"; do
    read -r cfg seed <<< "$job"
    run_one "$cfg" "$seed" "$@" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=$((failed + 1))
  done
  echo "run_ablation: $((i + ${#pids[@]})) of ${#jobs[@]} runs done, $failed failed ($(date +%H:%M:%S))"
done
if (( failed > 0 )); then
  echo "run_ablation: $failed runs failed; see $out/log-*.txt" >&2
  exit 1
fi
