#!/usr/bin/env bash
# The prepared GPU run (bench/gpu_check.py) from anywhere: bash bench/gpu_check.sh OUT [options]
# e.g. on the lent device machine: bash bench/gpu_check.sh "$OUT"
set -euo pipefail
out="${1:-${OUT:?give the output folder as the first argument or set OUT}}"
shift || true
cd "$(dirname "$0")/.."
exec python bench/gpu_check.py --out "$out" "$@"
