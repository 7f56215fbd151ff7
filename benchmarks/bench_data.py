"""Input pipeline and full-catalog evaluation throughput on ML-1M (or a stand-in).

Prints training sequences/s of `training_dataset` (one example = one user's
window of L positions; positions/s also shown) and evaluation users/s over the
full catalog with seen items excluded. The comparison with a SASRec training
step belongs with the SASRec model; the query tower here is a mean of
embeddings, so the evaluation figure is the ranking cost, not a model's.

    python benchmarks/bench_data.py [--data-dir ../shared/data/ml-1m-sasrec]
"""

import argparse
import time

import tensorflow as tf  # noqa: E402
from common import DEFAULT_ML1M, machine, ml1m_or_stand_in

from tfrs_logq.pipelines.sequential import evaluate, evaluation_arrays, training_dataset  # noqa
from tfrs_logq.pipelines.splits import leave_one_out  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=DEFAULT_ML1M)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=200)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    inter, source = ml1m_or_stand_in(args.data_dir)
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
