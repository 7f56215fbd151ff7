#!/usr/bin/env bash
# The powered ML-1M comparison of standard vs improved logQ (`python -m lab experiment`):
# fixed-length runs (`--preset fixed`: the long preset's model and data, 80 epochs, no early
# stop), each scored by the mean test Recall@20 / NDCG@20 of all 6,040 users over its last
# 20 epochs.
# Pairs share the seed, so the two corrections of a pair see the same batches, initial
# weights, dropout masks and negatives (every random draw is a function of the seed and
# a counter). Pair-major order: seed s of in-batch logq, in-batch corrected, MNS logq,
# MNS corrected, then seed s + 1, so an interrupted grid holds whole pairs.
#
# Every run trains from one pinned snapshot of the code: the commit in OUT/code_commit
# (written by the first run; PIN=<commit> overrides it for a new grid), so all runs of
# the comparison use the same code whatever is committed meanwhile. Resumable: a run
# whose row is in the committed results.csv is skipped, an interrupted one resumes
# exactly from its last finished epoch. With COMMIT=1 the results directory is
# committed after every finished run. (Pinning, snapshots, commits: grid_lib.sh.)
#
#   COMMIT=1 SEEDS="0 1 2 3" benchmarks/fixed_grid.sh [--data-dir ABSOLUTE_DIR --data-format sasrec]
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GRID_NAME=fixed_grid.sh
# shellcheck source=benchmarks/grid_lib.sh
. "$ROOT/benchmarks/grid_lib.sh"
OUT=${OUT:-results/ml1m-loo-fixed}
grid_check_out "$OUT" || { echo "OUT must be results/NAME (its runs/ is git-ignored)" >&2; exit 2; }
PY=${PY:-$ROOT/.venv/bin/python}
SEEDS=${SEEDS:-0 1 2 3}
LOSSES=${LOSSES:-inbatch-logq-official inbatch-corrected mns-logq-official mns-corrected}
DATA=(--data-dir "$ROOT/../shared/data/ml-1m-sasrec" --data-format sasrec)
[ $# -gt 0 ] && DATA=("$@")
grid_pin "$OUT" || exit 2
echo "fixed_grid.sh: every run trains from commit $PIN"

run() {  # loss seed
  local loss=$1 seed=$2
  grid_has_row "$OUT" "ml-1m,gsasrec,$loss,$seed,fixed," &&
    { echo "skip $loss seed $seed: in $OUT/results.csv"; return 0; }
  local snap rc; snap=$(mktemp -d)
  trap 'rm -rf "${snap:-}"' EXIT  # snap is local: unset when the script exits
  grid_snapshot "$PIN" "$snap" || return 1
  # --losses: the pinned commit's name of the flag (the lab's experiment now takes --loss;
  # a grid pinned to such a commit needs --loss here).
  grid_python "$snap" -m "$(grid_lab "$snap")" experiment \
    --output-dir "$ROOT/$OUT" --preset fixed --datasets ml-1m --splits gsasrec \
    --losses "$loss" --seeds "$seed" "${DATA[@]}"
  rc=$?
  rm -rf "$snap"
  [ -f "$OUT/results.csv" ] && "$PY" benchmarks/paired_report.py "$OUT" >/dev/null
  grid_commit "$OUT" "at the fixed preset (code $PIN)"
  return $rc
}

for seed in $SEEDS; do
  for loss in $LOSSES; do run "$loss" "$seed" || exit; done
done
