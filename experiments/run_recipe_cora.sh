#!/usr/bin/env bash
# Cora, public split: GRF-GPS (cora_grf_gps.yaml) against the GAT baseline (cora_gat.yaml),
# seeds 0..4, test accuracy of the checkpoint with the best validation accuracy.
#   bash experiments/run_recipe_cora.sh OUT_DIR [THREADS] [EPOCHS] [CONFIGS] [SEEDS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: run_recipe_cora.sh OUT_DIR [THREADS] [EPOCHS]}
export OMP_NUM_THREADS=${2:-1}
EPOCHS=${3:-100}
CONFIGS=${4:-cora_gat cora_grf_gps}
SEEDS=${5:-0 1 2 3 4}
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
mkdir -p "$OUT"
config_args() {  # the --config arguments of experiments/configs/$1.yaml: its base first
  local base; base=$(sed -n 's/^# Overrides \([A-Za-z0-9_]*\.yaml\).*/\1/p' "experiments/configs/$1.yaml")
  echo ${base:+--config experiments/configs/$base} --config "experiments/configs/$1.yaml"
}
for cfg in $CONFIGS; do
  for seed in $SEEDS; do
    start=$(date +%s)
    pyg-grf fit $(config_args "$cfg") --seed_everything "$seed" \
      --test_after_fit=true --trainer.max_epochs "$EPOCHS" \
      --trainer.default_root_dir "$OUT/$cfg/seed$seed" > "$OUT/${cfg}_$seed.log" 2>&1
    acc=$(grep -o "test/acc[^0-9]*[0-9.]*" "$OUT/${cfg}_$seed.log" | tail -1 | grep -o "[0-9.]*$")
    echo "$cfg seed $seed: test/acc $acc ($(( $(date +%s) - start )) s)" | tee -a "$OUT/results.txt"
  done
done
