"""Synthetic stream throughput vs the training step that consumes it.

Prints examples/s of the stream at V = 10M items and examples/s of a two-tower
training step (CorrectedRetrieval, in-batch negatives) at the same batch size
on a smaller catalog; the ratio says whether the input could be a bottleneck.

    python benchmarks/bench_synthetic.py [--synthetic-items 10000000 --batch 4096]
"""

import argparse
import time

import tensorflow as tf  # noqa: E402
from common import machine

from tfrs_logq import CorrectedRetrieval, CountMinSketch  # noqa: E402
from tfrs_logq.pipelines.synthetic import SyntheticStream  # noqa: E402
from tfrs_logq.two_tower import TwoTowerModel  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthetic-items", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--batches", type=int, default=60)
    args = parser.parse_args()
    print(f"machine: {machine()}")

    start = time.perf_counter()
    stream = SyntheticStream(num_items=args.synthetic_items, num_users=100_000)
    build = time.perf_counter() - start
    it = iter(stream.dataset(args.batch))
    next(it)
    start = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    stream_rate = args.batches * args.batch / (time.perf_counter() - start)
    print(f"stream: V={args.synthetic_items:,}, history 10, batch {args.batch}: "
          f"{stream_rate:,.0f} examples/s (build {build:.1f} s)")

    train_items = 1_000_000
    small = SyntheticStream(num_items=train_items, num_users=100_000)
    data = small.dataset(args.batch).take(args.batches + 5).cache()
    for _ in data:
        pass
    model = TwoTowerModel(train_items + 1, 64, CorrectedRetrieval(),
                          frequency=CountMinSketch(depth=4, width=1 << 20))
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
    model.fit(data.take(5), verbose=0)
    start = time.perf_counter()
    model.fit(data.skip(5), verbose=0)
    train_rate = args.batches * args.batch / (time.perf_counter() - start)
    print(f"training step (two-tower, d=64, V={train_items:,}, batch {args.batch}, "
          f"corrected, count-min log Q): {train_rate:,.0f} examples/s")
    print(f"stream / training = {stream_rate / train_rate:.1f}x "
          f"({'never the bottleneck' if stream_rate > train_rate else 'INPUT-BOUND'})")


if __name__ == "__main__":
    main()
