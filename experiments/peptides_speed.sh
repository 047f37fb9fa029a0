#!/usr/bin/env bash
# Peptides-func speed: first processing time and cache size of the GRF pre_transform, then the
# seconds per training step (and per epoch of 340 steps) of the three configs
# peptides_func_{gine,linear,grf}.yaml, from the wall time of `pyg-grf fit` with 20 and 120
# training batches (the difference removes start-up and data loading).
#   bash experiments/peptides_speed.sh [DATA_ROOT] [THREADS]
# Needs the offline mirror (PYG_GRF_MIRROR, default ../shared/datasets) and rdkit.
set -euo pipefail
cd "$(dirname "$0")/.."
config_args() {  # the --config arguments of experiments/configs/$1.yaml: its base first
  local base; base=$(sed -n 's/^# Overrides \([A-Za-z0-9_]*\.yaml\).*/\1/p' "experiments/configs/$1.yaml")
  echo ${base:+--config experiments/configs/$base} --config "experiments/configs/$1.yaml"
}
ROOT=${1:-$(mktemp -d)}
THREADS=${2:-1}
export PYG_GRF_DATA="$ROOT" PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
export OMP_NUM_THREADS=$THREADS
PIN=""
if [ "$THREADS" = 1 ] && command -v taskset >/dev/null; then PIN="taskset -c 0"; fi
python - <<PY
import os, time, torch
from pyg_grf.lightning.datamodules import LRGBDataModule
from pyg_grf.transforms import AddGraphRandomFeatures
for pre in (None, AddGraphRandomFeatures(num_walks=16, p_halt=0.2, max_length=4, seed=0)):
    t = time.perf_counter()
    dm = LRGBDataModule('peptides-func', pre_transform=pre)
    dm.prepare_data()
    dt = time.perf_counter() - t
    root = os.path.join(os.environ['PYG_GRF_DATA'], 'LRGB', 'peptides-functional')
    sizes = {d: sum(os.path.getsize(os.path.join(root, d, f)) for f in os.listdir(os.path.join(root, d)))
             for d in os.listdir(root) if d.startswith('processed')}
    print(f"first processing ({'GRF' if pre else 'no'} pre_transform): {dt:.1f} s; caches (MiB): "
          + ', '.join(f'{k} {v / 2**20:.0f}' for k, v in sorted(sizes.items())), flush=True)
PY
for cfg in gine linear grf; do
  declare -A T
  for nb in 20 120; do
    s=$(date +%s.%N)
    $PIN pyg-grf fit $(config_args "peptides_func_$cfg") \
      --trainer.limit_train_batches $nb --trainer.limit_val_batches 0 --trainer.max_epochs 1 \
      --trainer.default_root_dir "$ROOT/runs/$cfg" --trainer.enable_progress_bar false \
      > "$ROOT/fit_${cfg}_$nb.log" 2>&1
    T[$nb]=$(echo "$(date +%s.%N) - $s" | bc)
  done
  python -c "s = (${T[120]} - ${T[20]}) / 100; print(f'$cfg: {s:.3f} s/step, {s * 340:.0f} s/epoch (340 steps of 32)')"
done
