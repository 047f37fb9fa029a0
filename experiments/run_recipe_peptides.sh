#!/usr/bin/env bash
# Peptides-func at equal wall-clock: GINE and GRF-GPS side by side (one thread each, started
# together so that both see the same machine load), each trained for MINUTES minutes
# (processing not counted; max_epochs set so that the cosine schedule about completes in the
# budget at the step times of speed_peptides.md), then tested.
# GINE is widened to 120 channels so that both have the same parameter count (446 K vs 439 K).
#   bash experiments/run_recipe_peptides.sh OUT_DIR [MINUTES] [SLOWDOWN_PERCENT] [SEED]
# SLOWDOWN_PERCENT (default 100) scales the step times used to size the schedule, for a loaded
# machine (140: steps 1.4x slower than on an idle core). SEED (default 0) seeds the model's
# initialisation and the batch order (the walks are drawn once per dataset, seed 0).
set -euo pipefail
cd "$(dirname "$0")/.."
config_args() {  # the --config arguments of experiments/configs/$1.yaml: its base first
  local base; base=$(sed -n 's/^# Overrides \([A-Za-z0-9_]*\.yaml\).*/\1/p' "experiments/configs/$1.yaml")
  echo ${base:+--config experiments/configs/$base} --config "experiments/configs/$1.yaml"
}
OUT=${1:?usage: run_recipe_peptides.sh OUT_DIR [MINUTES] [SLOWDOWN_PERCENT] [SEED]}
MIN=${2:-15}
SLOW=${3:-100}
SEED=${4:-0}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
mkdir -p "$OUT"
budget="--seed_everything=$SEED --trainer.max_time=00:00:$MIN:00 --model.init_args.lr=0.001 --model.init_args.warmup_epochs=0.25"
# epochs that fit the budget at the step times of speed_peptides.md (340 steps per epoch; GINE
# at 120 channels about 100 s per epoch)
# each dataset variant (with and without walks) is processed once before the timed runs
for cfg in gine grf_gps; do
  pyg-grf fit $(config_args "peptides_func_$cfg") --trainer.fast_dev_run=true \
    --trainer.default_root_dir="$OUT/prepare" > "$OUT/prepare_$cfg.log" 2>&1
done
run() {
  pyg-grf fit --test_after_fit=true $(config_args "peptides_func_$1") $budget \
    --trainer.max_epochs="$2" --trainer.enable_progress_bar=false ${3:-} \
    --trainer.default_root_dir="$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1: $(grep -o "test/ap[^0-9]*[0-9.]*" "$OUT/$1.log" | tail -1)" | tee -a "$OUT/results.txt"
}
run gine $(( MIN * 60 / (100 * SLOW / 100) + 1 )) --model.init_args.model.init_args.hidden_channels=120 &
run grf_gps $(( MIN * 60 / (160 * SLOW / 100) + 1 )) &
wait
