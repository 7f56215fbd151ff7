#!/usr/bin/env bash
# Issue 26 part 1: the large-catalog study (`tfrs-logq study`, tfrs_logq/study.py) run by
# run, resumable, optionally committed after every run.
#
#   PRESET=pilot|headline|sweep COMMIT=1 benchmarks/synthetic_study.sh [extra study flags]
#
# Presets (tfrs_logq/study.py PRESETS): `headline` is Table 2's analogue (1,000,000 items,
# 4,096 uniform + 4,096 in-batch negatives and pure in-batch, every proposal and correction,
# 3 seeds); `sweep` maps catalog size x negatives x sharpness at smaller budgets; `pilot`
# is the small grid committed in results/synthetic-study-pilot/. See docs/study.md for
# their expected durations.
#
# Every run trains from one pinned snapshot of the code: the commit in OUT/code_commit
# (written by the first run; PIN=<commit> overrides it for a new grid), so all runs of a
# grid use the same code whatever is committed meanwhile. Resumable: a run whose run_id is
# in OUT/results.csv is skipped (the study writes a row only when a run has finished; a
# killed run starts again from step 0). With COMMIT=1, OUT is committed after every run.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PRESET=${PRESET:-pilot}
case "$PRESET" in
  pilot) DEFAULT_OUT=results/synthetic-study-pilot;;
  headline) DEFAULT_OUT=results/synthetic-study;;
  *) DEFAULT_OUT=results/synthetic-study-$PRESET;;
esac
OUT=${OUT:-$DEFAULT_OUT}
case "$OUT" in results/*/*|/*) echo "OUT must be results/NAME" >&2; exit 2;; esac
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"
if [ -n "${PIN:-}" ]; then
  echo "$PIN" > "$OUT/code_commit"
elif [ ! -f "$OUT/code_commit" ]; then
  git rev-parse HEAD > "$OUT/code_commit"
fi
PIN=$(cat "$OUT/code_commit")
git cat-file -e "$PIN^{commit}" 2>/dev/null || { echo "pinned commit $PIN not found" >&2; exit 2; }
echo "synthetic_study.sh: preset $PRESET into $OUT, every run from commit $PIN"

commit() {
  [ "${COMMIT:-0}" = 1 ] && [ -f "$OUT/results.csv" ] || return 0
  git add -- "$OUT" >/dev/null 2>&1 || return 0
  git diff --cached --quiet -- "$OUT" && return 0
  local n; n=$(($(wc -l < "$OUT/results.csv") - 1))
  for _ in 1 2 3 4 5; do  # another git command may hold the index lock
    git commit -q -m "$OUT: $n finished run(s) of the $PRESET study (code $PIN)" -- "$OUT" &&
      return 0
    sleep 5
  done
  echo "synthetic_study.sh: could not commit $OUT" >&2
  return 1
}

snap=$(mktemp -d)
trap 'rm -rf "$snap"' EXIT
git archive "$PIN" tfrs_logq pipelines serving | tar -x -C "$snap" &&
  mv "$snap/pipelines" "$snap/tfrs_logq/pipelines" &&
  mv "$snap/serving" "$snap/tfrs_logq/serving" || { echo "no snapshot of $PIN" >&2; exit 1; }
study() {  # from inside the snapshot, with -P: the pinned code runs, not the work tree
  (cd "$snap" && PYTHONPATH="$snap" "$PY" -P -m tfrs_logq.cli study --preset "$PRESET" \
    --output-dir "$ROOT/$OUT" "$@")
}
while :; do
  left=$(study --pending "$@" | tail -n 1) || exit 1
  [ "$left" -gt 0 ] 2>/dev/null || { echo "synthetic_study.sh: $OUT complete"; break; }
  echo "synthetic_study.sh: $left run(s) left"
  study --max-runs 1 "$@" || exit 1
  commit || exit 1
done
