#!/usr/bin/env bash
# Issue 26's powered ML-1M comparison of standard vs improved logQ: fixed-length runs
# (`--preset fixed`: the long preset's model and data, 80 epochs, no early stop), each
# scored by the mean test Recall@20 / NDCG@20 of all 6,040 users over its last 20 epochs.
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
# committed after every finished run.
#
#   COMMIT=1 SEEDS="0 1 2 3" benchmarks/fixed_grid.sh [--data-dir ABSOLUTE_DIR --data-format sasrec]
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-results/ml1m-loo-fixed}
case "$OUT" in results/*/*|/*) echo "OUT must be results/NAME (its runs/ is git-ignored)" >&2; exit 2;; esac
PY=${PY:-$ROOT/.venv/bin/python}
SEEDS=${SEEDS:-0 1 2 3}
LOSSES=${LOSSES:-inbatch-logq inbatch-corrected mns-logq mns-corrected}
DATA=(--data-dir "$ROOT/../shared/data/ml-1m-sasrec" --data-format sasrec)
[ $# -gt 0 ] && DATA=("$@")
mkdir -p "$OUT"
if [ -n "${PIN:-}" ]; then
  echo "$PIN" > "$OUT/code_commit"
elif [ ! -f "$OUT/code_commit" ]; then
  git rev-parse HEAD > "$OUT/code_commit"
fi
PIN=$(cat "$OUT/code_commit")
git cat-file -e "$PIN^{commit}" 2>/dev/null || { echo "pinned commit $PIN not found" >&2; exit 2; }
echo "fixed_grid.sh: every run trains from commit $PIN"

commit() {
  [ "${COMMIT:-0}" = 1 ] && [ -f "$OUT/results.csv" ] || return 0
  git add -- "$OUT" >/dev/null 2>&1 || return 0
  git diff --cached --quiet -- "$OUT" && return 0
  local n; n=$(($(wc -l < "$OUT/results.csv") - 1))
  for _ in 1 2 3 4 5; do  # another git command may hold the index lock
    git commit -q -m "$OUT: $n finished run(s) at the fixed preset (code $PIN)" -- "$OUT" && return 0
    sleep 5
  done
  echo "fixed_grid.sh: could not commit $OUT" >&2
  return 1
}

finished() {  # loss seed: its row is in results.csv
  [ -f "$OUT/results.csv" ] && grep -q "^ml-1m,gsasrec,$1,$2,fixed," "$OUT/results.csv"
}

run() {  # loss seed
  local loss=$1 seed=$2
  finished "$loss" "$seed" && { echo "skip $loss seed $seed: in $OUT/results.csv"; return 0; }
  local snap rc; snap=$(mktemp -d)
  trap 'rm -rf "$snap"' EXIT
  git archive "$PIN" tfrs_logq pipelines serving | tar -x -C "$snap" &&
    mv "$snap/pipelines" "$snap/tfrs_logq/pipelines" &&
    mv "$snap/serving" "$snap/tfrs_logq/serving" || { echo "no snapshot of $PIN" >&2; return 1; }
  # From inside the snapshot, with -P: neither the work tree nor the current directory
  # is on sys.path, so the pinned code trains.
  (cd "$snap" && PYTHONPATH="$snap" "$PY" -P -m tfrs_logq.cli experiment \
    --output-dir "$ROOT/$OUT" --preset fixed --datasets ml-1m --splits gsasrec \
    --losses "$loss" --seeds "$seed" "${DATA[@]}")
  rc=$?
  rm -rf "$snap"
  [ -f "$OUT/results.csv" ] && "$PY" benchmarks/paired_report.py "$OUT" >/dev/null
  commit
  return $rc
}

for seed in $SEEDS; do
  for loss in $LOSSES; do run "$loss" "$seed" || exit; done
done
