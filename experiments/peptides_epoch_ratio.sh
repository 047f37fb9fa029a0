#!/usr/bin/env bash
# Peptides-func, seconds per epoch of the GRF-GPS recipe against the GINE recipe at equal
# parameters (GINE widened to 120 channels: 446 K vs 439 K), side by side on one machine, each
# with the DataLoader in the training process (WORKERS=0) and with one worker process, which
# for GRF-GPS also builds the GRF payload of every batch (pyg_grf.loader).
# s/step = difference of the wall times of `pyg-grf fit` with 120 and 20 training batches / 100
# (start-up, dataset loading and worker start cancel); s/epoch = 340 steps of 32 graphs.
# Runs alternate between the configs (ROUNDS rounds), training on one thread.
#   bash experiments/peptides_epoch_ratio.sh OUT_DIR [ROUNDS]
# Needs rdkit and the offline mirror (PYG_GRF_MIRROR, default ../shared/datasets); the datasets
# are processed (and cached under PYG_GRF_DATA, default ./datasets) before the timed runs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: peptides_epoch_ratio.sh OUT_DIR [ROUNDS]}
ROUNDS=${2:-2}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
mkdir -p "$OUT"
declare -A ARGS=(
  [gine]="--config experiments/configs/peptides_func_grf.yaml --config experiments/configs/peptides_func_gine.yaml --model.init_args.model.init_args.hidden_channels=120"
  [grf_gps]="--config experiments/configs/peptides_func_grf.yaml --config experiments/configs/peptides_func_grf_gps.yaml"
)
for cfg in gine grf_gps; do  # process and cache both dataset variants (untimed)
  pyg-grf fit ${ARGS[$cfg]} --trainer.fast_dev_run=true --trainer.default_root_dir="$OUT/prepare" \
    > "$OUT/prepare_$cfg.log" 2>&1
done
fit() {  # fit CFG WORKERS BATCHES -> wall seconds
  local s e
  s=$(date +%s.%N)
  pyg-grf fit ${ARGS[$1]} --data.init_args.num_workers="$2" --trainer.limit_train_batches="$3" \
    --trainer.limit_val_batches=0 --trainer.max_epochs=1 --trainer.enable_progress_bar=false \
    --trainer.default_root_dir="$OUT/runs" \
    > "$OUT/fit_$1_w$2_$3.log" 2>&1
  e=$(date +%s.%N)
  echo "$e - $s" | bc
}
: > "$OUT/steps.txt"
for r in $(seq "$ROUNDS"); do
  for w in 0 1; do
    for cfg in gine grf_gps; do
      t20=$(fit "$cfg" "$w" 20)
      t120=$(fit "$cfg" "$w" 120)
      echo "$r $cfg $w $(echo "($t120 - $t20) / 100" | bc -l)" | tee -a "$OUT/steps.txt"
    done
  done
done
python - "$OUT/steps.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
s = {}
for r, cfg, w, t in rows:
    s.setdefault((cfg, w), []).append(float(t))
print('| config | workers | s/step (median of rounds) | s/epoch (340 steps) | / GINE, same workers |')
print('|---|---|---|---|---|')
for w in ('0', '1'):
    g = statistics.median(s[('gine', w)])
    for cfg in ('gine', 'grf_gps'):
        m = statistics.median(s[(cfg, w)])
        print(f'| {cfg} | {w} | {m:.3f} | {340 * m:.0f} | {m / g:.2f} |')
PY
