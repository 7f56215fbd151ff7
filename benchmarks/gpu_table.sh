#!/usr/bin/env bash
# The ML-1M leave-one-out column of the paper's Table 1 at the paper's protocol, on one GPU.
#
# gSASRec's split of SASRec's ml-1m.txt; SASRec d=128, 2 blocks, 1 head, dropout 0.5, L=200,
# batch 128, 256 negatives; an epoch is one pass over the users (48 steps), validation NDCG@10
# after each, early stopping with the paper's 200 epochs of patience, capped at MAX_EPOCHS so the
# whole column (10 losses, one seed) fits in about 30 minutes on one H100: PARALLEL runs share
# the GPU (the model is far too small to fill it), each under XLA with mixed float16.
#
#   bash benchmarks/gpu_table.sh [DATA_DIR] [OUTPUT_DIR]
#
# The grid is the lab's (`python -m lab experiment`, lab/experiment.py: run from a checkout,
# not installed); PY is the Python with tfrs-logq installed.
#
# Resumable: rerun the same command and finished runs are reused, interrupted ones resume from
# their last epoch. Step times go to OUTPUT_DIR/runs/*/epochs.json ("seconds" per epoch).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${1:-../shared/data/ml-1m-sasrec}
OUTPUT_DIR=${2:-results/ml1m-loo-paper-gpu}
PARALLEL=${PARALLEL:-5}
MAX_EPOCHS=${MAX_EPOCHS:-300}
SEEDS=${SEEDS:-0}
LOSSES=${LOSSES:-bce,gbce,uniform,inbatch-none,inbatch-logq-official,inbatch-corrected,mns-none,mns-logq-official,mns-corrected,full-softmax}
PY=${PY:-.venv/bin/python}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi"
start=$(date +%s)
IFS=', ' read -r -a LOSS_LIST <<< "$LOSSES"  # commas or spaces: the lab takes a list
IFS=', ' read -r -a SEED_LIST <<< "$SEEDS"
"$PY" -m lab experiment --output-dir "$OUTPUT_DIR" --datasets ml-1m --splits gsasrec \
    --data-dir "$DATA_DIR" --data-format sasrec --preset paper --loss "${LOSS_LIST[@]}" \
    --seeds "${SEED_LIST[@]}" --parallel "$PARALLEL" --jit-compile --mixed-precision float16 \
    --max-epochs "$MAX_EPOCHS" --json
echo "wall seconds: $(( $(date +%s) - start ))"
cat "$OUTPUT_DIR/table.md"
