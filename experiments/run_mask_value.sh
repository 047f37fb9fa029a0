#!/usr/bin/env bash
# Issue #17 (the mask's value at O(N)): the runs behind experiments/results/digits_grid.md and the
# new GRF / LINEAR rows of experiments/results/gkat_motifs.md. Streams are single-threaded.
#   bash experiments/run_mask_value.sh digits      # Table 1 variants, 5 seeds (~60 min)
#   bash experiments/run_mask_value.sh ablations   # walkers, importance, free f, 3 seeds (~45 min)
#   bash experiments/run_mask_value.sh motifs1     # GRF with the library's defaults (|f|, one
#   bash experiments/run_mask_value.sh motifs2     #   walk set), 3 seeds each
#   bash experiments/run_mask_value.sh circle      # circle: walks per head and layer + the
#                                                  #   unmasked-linear control
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
digits() { python experiments/digits_grid.py --out experiments/results/digits_grid "$@"; }
motifs() {  # motif, then options
  python experiments/gkat_motifs.py --motifs "$1" --num-graphs 4096 --epochs 60 --patience 80 \
    --seeds 3 --mode softmax --threshold 0.05 --threads 1 --models grf --grf-draws 1 \
    --tag "$1_grf_abs" "${@:2}"
}
case "${1:?usage: run_mask_value.sh digits|ablations|motifs1|motifs2|circle}" in
  digits) digits --variants linear,power_series,grf,grf_old_defaults,softmax,grf_shared_walks,grid_rpe \
    --seeds 0,1,2,3,4 ;;
  ablations) digits --variants grf_free_f,grf_no_importance,grf_walks4,grf_walks16,grf_walks128 \
    --seeds 0,1,2 ;;
  motifs1) for m in circle caveman circular_ladder; do motifs $m; done ;;
  motifs2) motifs induced_cycle --walk-length 6; for m in ladder grid; do motifs $m; done ;;
  circle) python experiments/gkat_motifs.py --motifs circle --num-graphs 4096 --epochs 60 \
    --patience 80 --seeds 3 --mode softmax --threshold 0.05 --threads 1 --models grf linear \
    --grf-draws 4 --tag circle_grf_draws ;;
  *) echo "unknown stream '$1'" >&2; exit 2 ;;
esac
