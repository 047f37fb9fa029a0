#!/usr/bin/env bash
# Reproduces the GKAT tables (experiments/results/gkat_citation.md, gkat_tu.md, gkat_motifs.md)
# and the Cora GRF-GPS table (cora_grf_gps.md), all through the product's training stack
# (experiments/harness.py over pyg_grf.lightning; networks in experiments/paper_models.py,
# configs in experiments/configs/paper/). Runs are appended to experiments/results/<name>/runs.jsonl
# and finished ones are skipped, so a stopped stream resumes.
# Usage: bash experiments/run_gkat_figures.sh {a|b}
# Streams are independent and single-threaded: two can share a 2-core machine.
#   a: Cora + CiteSeer (GAT, GKAT, 10 seeds), PROTEINS, ENZYMES;
#      motifs caveman, ladder, circular_ladder
#   b: Cora GRF-GPS and its linear control (10 seeds), IMDB-BINARY, IMDB-MULTI, NCI1;
#      motifs circle, grid, induced cycles
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYG_GRF_MIRROR="${PYG_GRF_MIRROR:-$(cd .. && pwd)/shared/datasets}"
tu() { python experiments/gkat_tu.py --dataset "$1" --models gkat gat gin; }
motifs() { python experiments/gkat_motifs.py --motifs "$@" --seeds 3; }
case "${1:?usage: run_gkat_figures.sh a|b}" in
  a) for ds in Cora CiteSeer; do python experiments/gkat_citation.py --dataset $ds --seeds 10; done
     tu PROTEINS; tu ENZYMES
     motifs caveman ladder circular_ladder ;;
  b) python experiments/cora_grf_gps.py --variants grf_gps linear --seeds 10
     tu IMDB-BINARY; tu IMDB-MULTI; tu NCI1
     motifs circle grid induced_cycle ;;
  *) echo "unknown stream '$1' (expected a or b)" >&2; exit 2 ;;
esac
