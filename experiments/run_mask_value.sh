#!/usr/bin/env bash
# Issue #17 (the mask's value at O(N)): the runs behind experiments/results/digits_grid.md and the
# new GRF / LINEAR rows of experiments/results/gkat_motifs.md. Streams are single-threaded.
#   bash experiments/run_mask_value.sh digits      # Table 1 variants, 5 seeds (~2 h)
#   bash experiments/run_mask_value.sh ablations   # walkers, free and signed f, 3 seeds (~1 h)
#   bash experiments/run_mask_value.sh motifs1     # GRF with the library's defaults (|f|, one
#   bash experiments/run_mask_value.sh motifs2     #   walk set) and the unmasked-linear control,
#                                                  #   3 seeds each (experiments/gkat_motifs.py)
#   bash experiments/run_mask_value.sh peptides SEED [EPOCHS] [MAX_STEPS]  # GRF-GPS and the
#       same block with unmasked linear attention side by side (439 K parameters each; both
#       ~0.54 s/step on an idle core), the cosine schedule sized for EPOCHS (9), training
#       stopped after MAX_STEPS (1360 = 4 epochs; 0: no step limit, 50 minutes of wall clock),
#       tested at the best-validation checkpoint; results appended to
#       experiments/results/peptides_mask_value.txt
set -euo pipefail
cd "$(dirname "$0")/.."
config_args() {  # the --config arguments of experiments/configs/$1.yaml: its base first
  local base; base=$(sed -n 's/^# Overrides \([A-Za-z0-9_]*\.yaml\).*/\1/p' "experiments/configs/$1.yaml")
  echo ${base:+--config experiments/configs/$base} --config "experiments/configs/$1.yaml"
}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
digits() { python experiments/digits_grid.py --out experiments/results/digits_grid "$@"; }
motifs() {  # motifs: GRF with the library's defaults and its unmasked-linear control
  python experiments/gkat_motifs.py --motifs "$@" --seeds 3 --models grf linear
}
peptides() {  # seed, epochs, max_steps
  local out=runs/peptides_mask_value/seed$1 res=experiments/results/peptides_mask_value.txt
  local limit="--trainer.max_time=00:00:50:00"
  [ "${3:-0}" != 0 ] && limit="--trainer.max_steps=$3 --trainer.max_time=00:02:00:00"
  export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
  mkdir -p "$out"
  for cfg in grf_gps grf_gps_linear; do
    ( start=$(date +%s)
      pyg-grf fit --test_after_fit=true $(config_args "peptides_func_$cfg") \
        --seed_everything="$1" --trainer.max_epochs="$2" $limit \
        --model.init_args.lr=0.001 --model.init_args.warmup_epochs=0.25 \
        --trainer.enable_progress_bar=false --trainer.default_root_dir="$out/$cfg" \
        > "$out/$cfg.log" 2>&1
      echo "$cfg seed=$1 epochs=$2 max_steps=${3:-0} wall_s=$(( $(date +%s) - start )) $(grep -o "test/ap[^0-9]*[0-9.]*" "$out/$cfg.log" | tail -1 | tr -s ' │|' ' ')" >> "$res"
    ) &
  done
  wait
}
case "${1:?usage: run_mask_value.sh digits|ablations|motifs1|motifs2|peptides}" in
  digits) digits --variants linear,power_series,grf,grf_old_defaults,softmax,grf_shared_walks,grid_rpe \
    --seeds 0,1,2,3,4 ;;
  ablations) digits --variants grf_free_f,grf_signed_f,grf_walks4,grf_walks16,grf_walks128 \
    --seeds 0,1,2 ;;
  motifs1) motifs circle caveman circular_ladder ;;
  motifs2) motifs induced_cycle ladder grid ;;
  peptides) peptides "${2:?seed}" "${3:-9}" "${4:-0}" ;;
  *) echo "unknown stream '$1'" >&2; exit 2 ;;
esac
