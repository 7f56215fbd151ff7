#!/usr/bin/env bash
# The ML-1M leave-one-out column of the paper's table at the `long` preset (issue 10),
# on the CPU: seed 0 of every row first (the logQ rows first), then seeds 1 and 2 of
# in-batch and MNS standard vs improved logQ. Resumable: run it again and finished runs
# are reused, an interrupted one resumes from its last epoch. Each run trains from a
# copy of the committed code (git archive HEAD), so editing the work tree meanwhile
# does not touch it. With COMMIT=1 the results directory (results.csv, table.md,
# table.png, curves.csv, curves.png) is committed each time a run finishes, so a
# stopped session loses at most the running epoch.
#
#   COMMIT=1 benchmarks/long_grid.sh [--data-dir ABSOLUTE_DIR --data-format sasrec]
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-results/ml1m-loo-long}
case "$OUT" in results/*/*|/*) echo "OUT must be results/NAME (its runs/ is git-ignored)" >&2; exit 2;; esac
PY=${PY:-$ROOT/.venv/bin/python}
DATA=(--data-dir "$ROOT/../shared/data/ml-1m-sasrec" --data-format sasrec)
[ $# -gt 0 ] && DATA=("$@")
FIRST="inbatch-logq inbatch-corrected mns-logq mns-corrected inbatch-none mns-none uniform full-softmax bce gbce"
MORE="inbatch-logq inbatch-corrected mns-logq mns-corrected"

commit() {
  [ "${COMMIT:-0}" = 1 ] && [ -f "$OUT/results.csv" ] || return 0
  git add -- "$OUT" >/dev/null 2>&1 || return 0
  git diff --cached --quiet -- "$OUT" && return 0
  local n; n=$(($(wc -l < "$OUT/results.csv") - 1))
  for _ in 1 2 3 4 5; do  # another git command may hold the index lock
    git commit -q -m "$OUT: $n finished run(s) at the long preset" -- "$OUT" && return 0
    sleep 5
  done
  echo "long_grid.sh: could not commit $OUT" >&2
  return 1
}

run() {  # loss seed
  local snap rc; snap=$(mktemp -d)
  trap 'rm -rf "$snap"' EXIT
  git archive HEAD tfrs_logq pipelines serving | tar -x -C "$snap" &&
    mv "$snap/pipelines" "$snap/tfrs_logq/pipelines" &&
    mv "$snap/serving" "$snap/tfrs_logq/serving" || { echo "no snapshot of HEAD" >&2; return 1; }
  # From inside the snapshot, with -P: neither the work tree nor the current directory
  # is on sys.path, so the committed code trains.
  (cd "$snap" && PYTHONPATH="$snap" "$PY" -P -m tfrs_logq.cli experiment \
    --output-dir "$ROOT/$OUT" --preset long --datasets ml-1m --splits gsasrec \
    --losses "$1" --seeds "$2" "${DATA[@]}")
  rc=$?
  rm -rf "$snap"
  commit
  return $rc
}

for loss in $FIRST; do run "$loss" 0 || exit; done
for seed in 1 2; do for loss in $MORE; do run "$loss" "$seed" || exit; done; done
