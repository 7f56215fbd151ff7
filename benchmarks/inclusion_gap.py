"""How far deduplicated in-batch draws are from per-draw draws in a synthetic study world.

For batches of the world's training stream: the share of distinct targets in a batch, the
share of batch positions whose target repeats, and, over the distinct targets, the gap
``log pi(d) - log(B Q(d))`` between the inclusion probability (`proposal.inclusion_log_q`,
what `sampling_probability="per_draw_to_inclusion"` corrects with) and ``B`` times the
per-draw unigram ``Q(d)`` (the item's true marginal, `SyntheticStream.item_log_marginal`).
A constant gap cancels in a softmax over the batch; only where ``B Q(d)`` nears 1 do the
two proposals differ. The study's `samplers` preset compares them on quality (research/study.md).

    python benchmarks/inclusion_gap.py --num-topics 10000 1000 --batches 30
"""

import argparse

from common import machine  # first: sets TF_USE_LEGACY_KERAS before TFRS

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfrs_logq.pipelines.synthetic import SyntheticConfig, SyntheticStream  # noqa: E402
from tfrs_logq.proposal import inclusion_log_q  # noqa: E402


def gap_row(config: SyntheticConfig, batch_size: int, batches: int) -> dict:
    stream = SyntheticStream(config)
    log_q = stream.item_log_marginal()  # index 0 is padding (-inf); items are 1..V
    distinct, repeats, gaps = [], [], []
    for batch in stream.dataset(batch_size, num_batches=batches):
        ids, counts = np.unique(batch["target"].numpy(), return_counts=True)
        distinct.append(len(ids) / batch_size)
        repeats.append(counts[counts > 1].sum() / batch_size)
        per_draw = np.log(batch_size) + log_q[ids]
        gaps.append(inclusion_log_q(tf.constant(log_q[ids]), batch_size).numpy() - per_draw)
    gap = np.concatenate(gaps)
    return {"topics": config.num_topics, "distinct": np.mean(distinct),
            "repeats": np.mean(repeats), "gap_mean": gap.mean(),
            "gap_q01": np.quantile(gap, 0.01), "gap_min": gap.min(),
            "max_bq": batch_size * float(np.exp(log_q[1:].max()))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic-items", type=int, default=100_000)
    parser.add_argument("--synthetic-users", type=int, default=20_000)
    parser.add_argument("--num-topics", type=int, nargs="+", default=[10_000, 1_000])
    parser.add_argument("--topic-sharpness", type=float, default=8.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"V = {args.synthetic_items:,}, {args.synthetic_users:,} users, "
          f"sigma {args.topic_sharpness:g}, batch {args.batch_size:,}, {args.batches} batches "
          "of the training stream")
    print("| topics | distinct / B | positions repeated | log pi - log BQ: mean | 1 % | min "
          "| max B Q |")
    print("|---|---|---|---|---|---|---|")
    for topics in args.num_topics:
        config = SyntheticConfig(num_items=args.synthetic_items, num_users=args.synthetic_users,
                                 num_topics=topics, topic_sharpness=args.topic_sharpness)
        r = gap_row(config, args.batch_size, args.batches)
        print(f"| {r['topics']:,} | {r['distinct']:.3f} | {r['repeats']:.3f} | "
              f"{r['gap_mean']:+.3f} | {r['gap_q01']:+.3f} | {r['gap_min']:+.2f} | "
              f"{r['max_bq']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
