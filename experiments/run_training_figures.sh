#!/usr/bin/env bash
# Reproduces the training figures quoted in experiments/results/training.md at CPU budgets.
# Usage: bash experiments/run_training_figures.sh {tu_cora|peptides} OUTDIR
# Every run is single-threaded so that two streams can share a 2-core machine.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
stream=$1; out=$2; mkdir -p "$out"
run() {  # name, then CLI args
  local name=$1; shift
  local t0=$(date +%s)
  python -m pyg_grf.lightning.cli "$@" --trainer.enable_progress_bar=false \
    --trainer.default_root_dir="$out/$name" > "$out/$name.log" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$out/summary.txt"
}
if [ "$stream" = tu_cora ]; then
  run mutag_grf_cv cv --config experiments/configs/mutag_grf_cv.yaml --trainer.max_epochs=40
  run mutag_linear_cv cv --config experiments/configs/mutag_linear_cv.yaml --trainer.max_epochs=40
  for s in 0 1 2 3 4; do
    run cora_gat_s$s fit --test_after_fit=true --config experiments/configs/cora_gat.yaml --seed_everything=$s --trainer.max_epochs=100
  done
  for s in 0 1 2 3 4; do
    run cora_grf_s$s fit --test_after_fit=true --config experiments/configs/cora_grf.yaml --seed_everything=$s --trainer.max_epochs=40
  done
else
  for m in grf linear gine; do
    run peptides_$m fit --test_after_fit=true --config experiments/configs/peptides_func_$m.yaml --trainer.max_time=00:00:05:00 --trainer.max_epochs=100
  done
  run peptides_samsa_cpu fit --test_after_fit=true --config experiments/configs/peptides_func_samsa_cpu.yaml --trainer.max_time=00:00:05:00
fi
