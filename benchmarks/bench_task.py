"""Step time of CorrectedRetrieval vs stock tfrs.tasks.Retrieval with logQ.

Forward + backward (gradients w.r.t. both embedding matrices) of the task at
batch B queries + N extra negatives, dimension d, in a tf.function. Variants are
interleaved round-robin so that machine noise hits all of them alike.

    python benchmarks/bench_task.py [--batch 4096 --extra 4096 --dim 64 --rounds 5 --xla]
"""

import argparse
import statistics

import numpy as np
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402
from common import machine, time_fn

from tfrs_logq import CorrectedRetrieval  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--extra", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--xla", action="store_true")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    n = args.batch + args.extra
    q = tf.constant(rng.normal(size=(args.batch, args.dim)).astype(np.float32))
    c = tf.constant(rng.normal(size=(n, args.dim)).astype(np.float32))
    ids = tf.constant(rng.zipf(1.2, size=n) % 200_000, tf.int64)
    prob = tf.constant(rng.uniform(1e-5, 1e-2, size=n).astype(np.float32))

    def make(task):
        @tf.function(jit_compile=args.xla)
        def step(q, c):
            with tf.GradientTape() as tape:
                tape.watch([q, c])
                loss = task(q, c, candidate_ids=ids, candidate_sampling_probability=prob,
                            compute_metrics=False, compute_batch_metrics=False)
            gq, gc = tape.gradient(loss, [q, c])
            return loss, gq, gc

        return lambda: [t.numpy() for t in step(q, c)]

    variants = {
        "stock TFRS logQ": make(tfrs.tasks.Retrieval()),
        "stock TFRS logQ + hit removal": make(tfrs.tasks.Retrieval(remove_accidental_hits=True)),
        "ours logq": make(CorrectedRetrieval(correction="logq")),
        "ours logq + hit removal": make(
            CorrectedRetrieval(correction="logq", remove_accidental_hits=True)),
        "ours corrected": make(CorrectedRetrieval(correction="corrected")),
        "ours corrected + dedup": make(
            CorrectedRetrieval(correction="corrected", deduplicate_candidates=True)),
    }
    times = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(time_fn(fn, warmup=1, repeats=args.repeats)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"machine: {machine()}")
    print(f"task forward+backward, batch {args.batch} + {args.extra} extra negatives, "
          f"d={args.dim}, {'XLA' if args.xla else 'graph'}; median of {args.rounds} rounds "
          f"x {args.repeats} steps")
    base = med["stock TFRS logQ"]
    base_hits = med["stock TFRS logQ + hit removal"]
    print(f"| {'variant':<32} | ms/step | vs stock logQ | vs stock logQ + hits |")
    print(f"|{'-' * 34}|---------|---------------|----------------------|")
    for name, t in med.items():
        print(f"| {name:<32} | {t * 1e3:7.1f} | {t / base:13.3f} | {t / base_hits:20.3f} |")


if __name__ == "__main__":
    main()
