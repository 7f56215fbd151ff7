#!/usr/bin/env bash
# The next piece of the 1,000,000-item learning curve, sized for one
# 10-minute accelerator job: 10,000 topics, sigma 8, mixed 4,096 + 4,096, mixture
# and unigram proposals, corrections corrected / logq-tfrs / logq-official /
# corrected-w1 / none, evaluated at 3k, 10k, 30k and 100k steps, seeds 0, 1, 2 in
# that order (benchmarks/accelerator/runs.py, preset "curve").
#
# Each call trains for at most MAX_SECONDS (default 540) and stops with its state in
# DIR/runs/ (ignored by git); the next call on the same machine goes on from there.
# Rows are appended to DIR/results.csv as each evaluation finishes. When $OUT is set
# (the device machine's return folder) results.csv, truth.json, the log and the hits per
# user (hits/) are copied there at the end.
#
# On the accelerator image (JAX 0.11, Python 3.12, no keras), carry the wheels:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 -d .accelerator-wheels \
#     keras==3.15.1 namex==0.1.0 optree==0.20.0          # 2.9 MB in all
#   (.accelerator-wheels/ listed in .git/info/exclude; run with carry [".accelerator-wheels"];
#   they are installed into $SITE, default /tmp/accelerator-site, with --no-deps)
# The image already has the rest of keras's dependencies (absl-py, h5py, ml-dtypes,
# numpy, packaging, rich); keras-logq is taken from this checkout.
#
#   DIR=results/accelerator-study benchmarks/accelerator_curve.sh [--seeds 0 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-results/accelerator-study}
MAX_SECONDS=${MAX_SECONDS:-540}
WHEELS=${WHEELS:-.accelerator-wheels}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
# A fresh DIR (a fresh device machine) starts from the committed rows, so that finished
# evaluations are not run again; results.csv returned is then the whole file.
FROM=${FROM:-results/accelerator-study}
if [ ! -f "$DIR/results.csv" ] && [ "$(cd "$FROM" 2>/dev/null && pwd)" != "$(cd "$DIR" && pwd)" ]; then
    for f in results.csv truth.json; do
        [ -f "$FROM/$f" ] && cp "$FROM/$f" "$DIR/$f"
    done
fi
export KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false
# Installed outside the tree, afresh when keras does not import whole: a second call on a
# warm device machine found a stale in-tree copy ("module 'keras' has no attribute
# 'saving'"), and the tree is re-sent on every call.
SITE=${SITE:-/tmp/accelerator-site}
if ! "$PY" -c "import keras.saving" 2>/dev/null; then
    rm -rf "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="keras-logq${PYTHONPATH:+:$PYTHONPATH}"
status=0
"$PY" benchmarks/accelerator_study.py --preset curve --output-dir "$DIR" \
    --max-seconds "$MAX_SECONDS" --chunk-floats $((1 << 28)) "$@" 2>&1 | tee -a "$DIR/curve.log" || status=$?
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    for f in results.csv truth.json curve.log; do
        [ -f "$DIR/$f" ] && cp "$DIR/$f" "$OUT/"
    done
    [ -d "$DIR/hits" ] && cp -r "$DIR/hits" "$OUT/"
fi
exit "$status"
