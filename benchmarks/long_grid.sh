#!/usr/bin/env bash
# The ML-1M leave-one-out column of the paper's table at the `long` preset (issue 10),
# on the CPU: seed 0 of every row first (the logQ rows first), then seeds 1 and 2 of
# in-batch and MNS standard vs improved logQ, and gBCE once more with a longer patience
# (GBCE_OUT, below), then with the paper's patience (GBCE200_OUT). Resumable: run it again
# and a run whose row is already in the committed results.csv is skipped (its run directory is git-ignored, so a fresh clone
# has only the row), an interrupted one resumes from its last epoch. Each run trains from a
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
# gBCE sits on a plateau (validation NDCG@10 about 0.02) for its first ~1,000 steps, in
# the official code as in ours (results/parity-cpu), and the long preset's patience of
# 10 epochs stops it there. This run gives it patience 30 and up to 150 epochs.
GBCE_OUT=${GBCE_OUT:-results/ml1m-loo-long-gbce}
GBCE_FLAGS=(--patience 30 --max-epochs 150)
# It stayed there for 45 epochs (best epoch 14). This run gives it the paper's patience of
# 200 epochs, capped at 200 epochs (9,600 steps, about an hour here).
GBCE200_OUT=${GBCE200_OUT:-results/ml1m-loo-long-gbce200}
GBCE200_FLAGS=(--patience 200 --max-epochs 200)

commit() {  # out
  [ "${COMMIT:-0}" = 1 ] && [ -f "$1/results.csv" ] || return 0
  git add -- "$1" >/dev/null 2>&1 || return 0
  git diff --cached --quiet -- "$1" && return 0
  local n; n=$(($(wc -l < "$1/results.csv") - 1))
  for _ in 1 2 3 4 5; do  # another git command may hold the index lock
    git commit -q -m "$1: $n finished run(s) at the long preset" -- "$1" && return 0
    sleep 5
  done
  echo "long_grid.sh: could not commit $1" >&2
  return 1
}

finished() {  # out loss seed: its row is in out/results.csv
  [ -f "$1/results.csv" ] && grep -q "^ml-1m,gsasrec,$2,$3,long," "$1/results.csv"
}

run() {  # out loss seed [flags...]
  local out=$1; shift
  local loss=$1 seed=$2; shift 2
  finished "$out" "$loss" "$seed" && { echo "skip $loss seed $seed: in $out/results.csv"; return 0; }
  local snap rc; snap=$(mktemp -d)
  trap 'rm -rf "$snap"' EXIT
  git archive HEAD tfrs_logq pipelines serving | tar -x -C "$snap" &&
    mv "$snap/pipelines" "$snap/tfrs_logq/pipelines" &&
    mv "$snap/serving" "$snap/tfrs_logq/serving" || { echo "no snapshot of HEAD" >&2; return 1; }
  # From inside the snapshot, with -P: neither the work tree nor the current directory
  # is on sys.path, so the committed code trains.
  (cd "$snap" && PYTHONPATH="$snap" "$PY" -P -m tfrs_logq.cli experiment \
    --output-dir "$ROOT/$out" --preset long --datasets ml-1m --splits gsasrec \
    --losses "$loss" --seeds "$seed" "${DATA[@]}" "$@")
  rc=$?
  rm -rf "$snap"
  commit "$out"
  return $rc
}

for d in "$GBCE_OUT" "$GBCE200_OUT"; do
  case "$d" in results/*/*|/*) echo "GBCE_OUT and GBCE200_OUT must be results/NAME" >&2; exit 2;; esac
done
for loss in $FIRST; do run "$OUT" "$loss" 0 || exit; done
for loss in $MORE; do run "$OUT" "$loss" 1 || exit; done
run "$GBCE_OUT" gbce 0 "${GBCE_FLAGS[@]}" || exit
for loss in $MORE; do run "$OUT" "$loss" 2 || exit; done
run "$GBCE200_OUT" gbce 0 "${GBCE200_FLAGS[@]}" || exit
