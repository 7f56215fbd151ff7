"""Input pipeline and full-catalog evaluation throughput on ML-1M (or a stand-in).

Prints training sequences/s of `training_dataset` (one example = one user's
window of L positions; positions/s also shown) and evaluation users/s over the
full catalog with seen items excluded. The comparison with a SASRec training
step belongs with the SASRec model (issue 4); the query tower here is a mean of
embeddings, so the evaluation figure is the ranking cost, not a model's.

    python benchmarks/bench_data.py [--data-dir ../shared/data/ml-1m-sasrec]
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf  # noqa: E402
from common import machine
from tfrs_logq.pipelines.datasets import load_movielens_1m  # noqa: E402
from tfrs_logq.pipelines.interactions import build_interactions  # noqa: E402
from tfrs_logq.pipelines.sequential import evaluate, evaluation_arrays, training_dataset  # noqa
from tfrs_logq.pipelines.splits import leave_one_out  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=os.path.join(here, "..", "..", "shared", "data",
                                                           "ml-1m-sasrec"))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=200)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    if os.path.isdir(args.data_dir):
        inter = load_movielens_1m(args.data_dir, fmt="sasrec", download_ok=False)
        source = f"ML-1M (SASRec ml-1m.txt, {len(inter):,} interactions)"
    else:
        rng = np.random.default_rng(0)
        n = 1_000_000
        inter = build_interactions(rng.integers(0, 6000, n), rng.zipf(1.2, n) % 3400 + 1,
                                   np.arange(n), min_item_interactions=1)
        source = "synthetic stand-in (../shared/data absent)"
    split = leave_one_out(inter)

    start = time.perf_counter()
    ds = training_dataset(split, batch_size=args.batch, max_length=args.max_length, seed=0)
    build_s = time.perf_counter() - start
    n_examples = 0
    start = time.perf_counter()
    for _ in range(3):
        for batch in ds:
            n_examples += int(batch["user"].shape[0])
    elapsed = time.perf_counter() - start
    rate = n_examples / elapsed
    print(f"{source}: training pipeline {rate:,.0f} sequences/s "
          f"({rate * args.max_length:,.0f} positions/s, batch {args.batch}, L={args.max_length}; "
          f"built in {build_s:.1f} s)")

    items = tf.random.normal([inter.num_items + 1, args.dim])
    emb = tf.random.normal([inter.num_items + 1, args.dim])

    @tf.function
    def query_fn(history):
        return tf.reduce_mean(tf.gather(emb, history), axis=1)

    arrays = evaluation_arrays(split, split.test, max_length=args.max_length)
    evaluate(query_fn, items, {k: (v[:256] if v is not None else None)
                               for k, v in arrays.items()})
    start = time.perf_counter()
    evaluate(query_fn, items, arrays, ks=(10, 20))
    eval_s = time.perf_counter() - start
    print(f"full-catalog evaluation ({inter.num_items:,} items, seen items excluded, d={args.dim}):"
          f" {len(arrays['targets']) / eval_s:,.0f} users/s")


if __name__ == "__main__":
    main()
