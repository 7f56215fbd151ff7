"""The pipeline's count-min Statistics on synthetic data: throughput and the sketch's error.

    python benchmarks/bench_beam_statistics.py [--interactions 100000000 --num-workers 2]

Runs `SyntheticStatistics` (``--dataset synthetic --statistics count-min``: chunk
indices in, a per-chunk bincount folded into a sparse sketch, no per-interaction
element) on the local FnApiRunner with ``--num-workers`` worker processes, then the
same chunks with ``mode="exact"`` for the exact counts, and prints interactions/s,
wall time, and the sketch's error against the exact counts on the top items.
The wall time includes starting the workers and writing the artifact.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from tfrs_logq._util.hostinfo import cpu_description
from tfrs_logq.pipelines.beam import load_item_statistics, run_components
from tfrs_logq.pipelines.beam.statistics import SyntheticStatistics
from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec


def machine() -> str:
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} CPU cores ({cpu_description()}), load average {load:.1f} at start"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interactions", type=float, default=1e8,
                        help="training interactions (users x history length)")
    parser.add_argument("--history-length", type=int, default=100)
    parser.add_argument("--synthetic-items", type=int, default=1_000_000)
    parser.add_argument("--users-per-chunk", type=int, default=10_000)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=1 << 20)
    parser.add_argument("--top", type=int, default=100, help="items the error is measured on")
    parser.add_argument("--no-exact", action="store_true", help="skip the exact run")
    args = parser.parse_args()
    users = int(round(args.interactions / args.history_length))
    spec = SyntheticSpec(num_users=users, num_items=args.synthetic_items,
                         history_length=args.history_length, seed=0,
                         users_per_chunk=args.users_per_chunk)
    print(f"machine: {machine()}")
    print(f"synthetic: {spec.train_interactions:,} training interactions ({users:,} users x "
          f"{args.history_length}), {args.synthetic_items:,} items, {spec.num_chunks} chunks; "
          f"sketch {args.depth} x {args.width:,}; FnApiRunner, {args.num_workers} workers")
    results = {}
    for mode in ("count-min",) if args.no_exact else ("count-min", "exact"):
        with tempfile.TemporaryDirectory() as root:
            start = time.perf_counter()
            run_components([SyntheticStatistics(spec, depth=args.depth, width=args.width,
                                                mode=mode)], root,
                           num_workers=args.num_workers)
            seconds = time.perf_counter() - start
            results[mode] = load_item_statistics(os.path.join(root, "Statistics"))
        rate = spec.train_interactions / seconds
        print(f"{mode:>9}: {seconds:8.1f} s wall, {rate:,.0f} interactions/s")
    if "exact" in results:
        counts = results["exact"].counts
        sketch = results["count-min"]
        assert sketch.total == counts.sum() == spec.train_interactions
        np.testing.assert_array_equal(sketch.sketch, results["exact"].sketch)
        top = np.argsort(-counts, kind="stable")[:args.top]
        estimate = sketch.sketch_counts(top)
        relative = (estimate - counts[top]) / counts[top]
        every = sketch.sketch_counts()
        over = (every - counts)[1:]
        print(f"top {args.top} items (exact counts {counts[top[0]]:,} .. "
              f"{counts[top[-1]]:,}): relative overestimate max {relative.max():.2e}, mean "
              f"{relative.mean():.2e}; exact on {int((relative == 0).sum())} of {args.top}")
        print(f"all {spec.num_items:,} items: mean overestimate {over.mean():.2f} counts "
              f"(bound e N / width = {np.e * spec.train_interactions / args.width:,.0f}), "
              f"max {over.max():,}")


if __name__ == "__main__":
    main()
