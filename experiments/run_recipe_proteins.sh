#!/usr/bin/env bash
# PROTEINS 10-fold CV (Errica protocol): GRF-GPS against GIN of the same width and depth.
#   bash experiments/run_recipe_proteins.sh OUT_DIR [THREADS] [CONFIGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: run_recipe_proteins.sh OUT_DIR [THREADS] [CONFIGS...]}
export OMP_NUM_THREADS=${2:-1}
shift $(( $# >= 2 ? 2 : 1 ))
CONFIGS=${*:-proteins_gin_cv proteins_grf_gps_cv}
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
mkdir -p "$OUT"
config_args() {  # the --config arguments of experiments/configs/$1.yaml: its base first
  local base; base=$(sed -n 's/^# Overrides \([A-Za-z0-9_]*\.yaml\).*/\1/p' "experiments/configs/$1.yaml")
  echo ${base:+--config experiments/configs/$base} --config "experiments/configs/$1.yaml"
}
for cfg in $CONFIGS; do
  start=$(date +%s)
  pyg-grf cv $(config_args "$cfg") --out "$OUT/$cfg" > "$OUT/$cfg.log" 2>&1
  echo "$cfg: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
done
