#!/usr/bin/env bash
# The large-catalog study (`python -m lab study`, lab/study.py) run by run, resumable,
# optionally committed after every run.
#
#   PRESET=pilot|headline|sweep|samplers|scale COMMIT=1 benchmarks/synthetic_study.sh [extra study flags]
#
# Presets (lab/study.py PRESETS; docs/study.md says what each holds and how long it
# takes): `headline` is Table 2's analogue (1,000,000 items, 10,000 topics, 2,048 uniform +
# 2,048 in-batch negatives, unigram and mixture proposals, every correction, 3 seeds);
# `sweep` maps the regime (topics 10,000 / 1,000 / 100 at 100,000 items, mixed and
# in-batch); `samplers` compares samplers and proposals at 10,000 topics; `scale` moves
# the catalog (100k -> 1M) and the sharpness (8 -> 4) from the sweep's largest-share cell; `pilot` is the
# small grid committed in results/synthetic-study-pilot/.
#
# Every run trains from one pinned snapshot of the code: the commit in OUT/code_commit
# (written by the first run; PIN=<commit> overrides it for a new grid), so all runs of a
# grid use the same code whatever is committed meanwhile. Resumable: a run whose run_id is
# in OUT/results.csv is skipped (the study writes a row when a run has finished), and a run
# killed while training goes on from its checkpoint in OUT/runs/ (code from this commit
# on; earlier pins restart it from step 0). With COMMIT=1, OUT is committed after every run.
# (Pinning, snapshots, commits: grid_lib.sh.)
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GRID_NAME=synthetic_study.sh
# shellcheck source=benchmarks/grid_lib.sh
. "$ROOT/benchmarks/grid_lib.sh"
PRESET=${PRESET:-pilot}
case "$PRESET" in
  pilot) DEFAULT_OUT=results/synthetic-study-pilot;;
  headline) DEFAULT_OUT=results/synthetic-study;;
  *) DEFAULT_OUT=results/synthetic-study-$PRESET;;
esac
OUT=${OUT:-$DEFAULT_OUT}
grid_check_out "$OUT" || { echo "OUT must be results/NAME" >&2; exit 2; }
PY=${PY:-$ROOT/.venv/bin/python}
grid_pin "$OUT" || exit 2
echo "synthetic_study.sh: preset $PRESET into $OUT, every run from commit $PIN"

snap=$(mktemp -d)
trap 'rm -rf "$snap"' EXIT
grid_snapshot "$PIN" "$snap" || exit 1
LAB=$(grid_lab "$snap")
study() {  # from inside the snapshot: the pinned code runs, not the work tree
  grid_python "$snap" -m "$LAB" study --preset "$PRESET" --output-dir "$ROOT/$OUT" "$@"
}
while :; do
  left=$(study --pending "$@" | tail -n 1) || exit 1
  [ "$left" -gt 0 ] 2>/dev/null || { echo "synthetic_study.sh: $OUT complete"; break; }
  echo "synthetic_study.sh: $left run(s) left"
  study --max-runs 1 "$@" || exit 1
  grid_commit "$OUT" "of the $PRESET study (code $PIN)" || exit 1
done
