#!/usr/bin/env bash
# MUTAG 10-fold CV (Errica protocol) of the GRF-GPS recipe against GIN and GINE of the same width
# and depth (3 layers, 64 channels), and against the same GPS block with unmasked linear
# attention (the mask's control) and with softmax multihead attention, one after the other, for
# each seed given after THREADS (default 0; OUT_DIR/seedS_CONFIG per seed).
#   bash experiments/run_recipe_mutag.sh OUT_DIR [THREADS [SEED...]]   (CONFIGS="..." to run a subset)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: run_recipe_mutag.sh OUT_DIR [THREADS [SEED...]]}
export OMP_NUM_THREADS=${2:-1}
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
mkdir -p "$OUT"
config_args() {  # the --config arguments of experiments/configs/$1.yaml: its base first
  local base; base=$(sed -n 's/^# Overrides \([A-Za-z0-9_]*\.yaml\).*/\1/p' "experiments/configs/$1.yaml")
  echo ${base:+--config experiments/configs/$base} --config "experiments/configs/$1.yaml"
}
SEEDS=("${@:3}"); [ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0)
for seed in "${SEEDS[@]}"; do
  for cfg in ${CONFIGS:-mutag_gin_cv mutag_gine_cv mutag_grf_gps_cv mutag_grf_gps_linear_cv mutag_gps_multihead_cv}; do
    start=$(date +%s)
    pyg-grf cv $(config_args "$cfg") --seed_everything="$seed" --data.init_args.num_workers=0 \
      --out "$OUT/seed${seed}_$cfg" > "$OUT/seed${seed}_$cfg.log" 2>&1
    echo "$cfg seed $seed: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
  done
done
