"""The cross-check table: the JAX study against the TF study on one cell of the sweep.

    python -m benchmarks.accelerator.crosscheck \\
        --tf results/synthetic-study-sweep/results.csv \\
        --jax results/accelerator-study/results.csv \\
        --output results/accelerator-study/crosscheck.csv

For every correction present in both files at the cell (the JAX rows' fields, matched on
world, sampler, proposal, budget and seeds), each metric's mean over the seeds in each
study, the difference JAX - TF, each study's seed standard deviation (ddof 1) and the
standard error of the difference of the two means, ``sqrt(sd_tf^2/n_tf + sd_jax^2/n_jax)``.
The truth columns (oracle recall, truth quantiles, band counts) are compared too: they
do not depend on training, so they must agree to rounding.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys

import numpy as np

CELL = ("num_items", "num_users", "num_topics", "topic_sharpness", "zipf_exponent",
        "history_length", "sampler", "num_in_batch", "num_uniform", "proposal", "steps",
        "batch_size", "embedding_dim", "learning_rate", "optimizer", "num_eval_users",
        "world_seed")
METRICS = tuple(f"exact_recall@{k}" for k in (10, 100, 1000)) + tuple(
    f"observed_recall@{k}" for k in (10, 100, 1000)) + tuple(
    f"{b}_recall@{k}" for b in ("head", "torso", "tail") for k in (10, 100, 1000)) + (
    "model_p_q50", "model_p_over_q_q50")
TRUTH = ("oracle_exact_recall@10", "oracle_exact_recall@100", "oracle_exact_recall@1000",
         "truth_p_q50", "truth_p_over_q_q50", "head_targets", "torso_targets", "tail_targets")
TOLERANCE = 0.003  # the target on exact Recall@k


def _key(row) -> tuple:
    return tuple(str(float(row[c])) if c in ("topic_sharpness", "zipf_exponent",
                                             "learning_rate") else str(row[c]) for c in CELL)


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(tf_rows, jax_rows) -> list[dict]:
    out = []
    cells = {(_key(r), r["correction"]) for r in jax_rows}
    for cell, correction in sorted(cells, key=lambda c: c[1]):
        jax = [r for r in jax_rows if _key(r) == cell and r["correction"] == correction]
        seeds = {r["seed"] for r in jax}
        tf = [r for r in tf_rows if _key(r) == cell and r["correction"] == correction
              and r["seed"] in seeds]
        if not tf:
            continue
        for metric in METRICS + TRUTH:
            a = np.array([float(r[metric]) for r in tf])
            b = np.array([float(r[metric]) for r in jax])
            sd_a = float(a.std(ddof=1)) if len(a) > 1 else float("nan")
            sd_b = float(b.std(ddof=1)) if len(b) > 1 else float("nan")
            se = math.sqrt(sd_a ** 2 / len(a) + sd_b ** 2 / len(b))
            diff = float(b.mean() - a.mean())
            out.append({
                "correction": correction, "metric": metric,
                "tf_value": f"{a.mean():.6g}", "jax_value": f"{b.mean():.6g}",
                "difference": f"{diff:.6g}", "tf_seed_sd": f"{sd_a:.3g}",
                "jax_seed_sd": f"{sd_b:.3g}", "se_difference": f"{se:.3g}",
                "seeds": f"{len(a)}/{len(b)}",
                "within_0.003": ("yes" if abs(diff) <= TOLERANCE else "no")
                if metric.startswith("exact_recall") else ""})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tf", default="results/synthetic-study-sweep/results.csv")
    p.add_argument("--jax", default="results/accelerator-study/results.csv")
    p.add_argument("--output", default="results/accelerator-study/crosscheck.csv")
    args = p.parse_args(argv)
    rows = table(_read(args.tf), _read(args.jax))
    if not rows:
        print("no cell in common", file=sys.stderr)
        return 1
    tmp = args.output + ".tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, args.output)
    for r in rows:
        if r["metric"].startswith("exact_recall") or r["metric"].startswith("oracle"):
            print(f"{r['correction']:>11} {r['metric']:>24}: TF {r['tf_value']:>9} "
                  f"JAX {r['jax_value']:>9} diff {float(r['difference']):+.4f} "
                  f"(sd {r['tf_seed_sd']}/{r['jax_seed_sd']}, se {r['se_difference']}) "
                  f"{r['within_0.003']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
