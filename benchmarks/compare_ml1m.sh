#!/usr/bin/env bash
# `tfrs-logq compare` on ML-1M through the generic CSV path (compare_ml1m.py),
# run by run from one pinned commit, optionally committed after every run.
#
#   COMMIT=1 benchmarks/compare_ml1m.sh
#
# Pinning, snapshots and commits: grid_lib.sh (as fixed_grid.sh).
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GRID_NAME=compare_ml1m.sh
# shellcheck source=benchmarks/grid_lib.sh
. "$ROOT/benchmarks/grid_lib.sh"
OUT=${OUT:-results/compare-ml1m}
grid_check_out "$OUT" || { echo "OUT must be results/NAME" >&2; exit 2; }
PY=${PY:-$ROOT/.venv/bin/python}
grid_pin "$OUT" || exit 2
echo "compare_ml1m.sh: into $OUT, every run from commit $PIN"
snap=$(mktemp -d)
trap 'rm -rf "$snap"' EXIT
grid_snapshot "$PIN" "$snap" || exit 1
git show "$PIN:benchmarks/compare_ml1m.py" > "$snap/compare_ml1m.py" || exit 1  # pinned too
DATA=${DATA:-$ROOT/../shared/data/ml-1m-sasrec/ml-1m.txt.gz}
driver() { grid_python "$snap" "$snap/compare_ml1m.py" --output-dir "$ROOT/$OUT" \
             --data "$DATA" "$@"; }
while :; do
  left=$(driver --pending | tail -n 1) || exit 1
  [ "$left" -gt 0 ] 2>/dev/null || { echo "compare_ml1m.sh: $OUT complete"; break; }
  echo "compare_ml1m.sh: $left run(s) left"
  driver --max-runs 1 || exit 1
  grid_commit "$OUT" "of the ML-1M comparison (code $PIN)" || exit 1
done
