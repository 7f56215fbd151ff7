"""Update and query throughput (ids/s) of the item-frequency estimators.

    python benchmarks/bench_frequency.py [--batch 4096 --synthetic-items 10000000]
"""

import argparse

import numpy as np
import tensorflow as tf  # noqa: E402
from common import machine, time_fn

from tfrs_logq import CountMinSketch, ExactFrequency, StreamingFrequency  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--synthetic-items", type=int, default=10_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batches = [tf.constant(rng.zipf(1.1, size=args.batch) % args.synthetic_items, tf.int64)
               for _ in range(16)]
    estimators = {
        f"ExactFrequency({args.synthetic_items:,})": ExactFrequency(args.synthetic_items),
        "CountMinSketch(4 x 2^20)": CountMinSketch(depth=4, width=1 << 20),
        "StreamingFrequency(2 x 2^20)": StreamingFrequency(num_buckets=1 << 20, num_hashes=2),
    }
    print(f"machine: {machine()}")
    print(f"batch of {args.batch} ids per call, in a tf.function")
    print(f"| {'estimator':<30} | update ids/s | log_q ids/s |")
    print(f"|{'-' * 32}|--------------|-------------|")
    for name, est in estimators.items():
        update = tf.function(est.update)
        log_q = tf.function(est.log_q)
        state = {"i": 0}

        def do_update():
            update(batches[state["i"] % 16])
            state["i"] += 1
            tf.reduce_sum(log_q(batches[0][:1])).numpy()  # block

        def do_query():
            log_q(batches[state["i"] % 16]).numpy()
            state["i"] += 1

        t_update = time_fn(do_update, repeats=30)[0]
        t_query = time_fn(do_query, repeats=30)[0]
        print(f"| {name:<30} | {args.batch / t_update:12,.0f} | {args.batch / t_query:11,.0f} |")


if __name__ == "__main__":
    main()
