"""Paired standard-vs-improved logQ report of a results directory.

Reads OUT/results.csv (rows of `python -m lab experiment`), pairs the runs of each
(standard, improved) loss pair by seed, and writes OUT/paired.md: per pair of
losses and metric, the paired mean difference improved - standard, its standard
error and 95% t interval, whether it is within noise, and how many pairs a paired
t-test needs for 80% power against a difference of TARGET at this standard deviation.

    python benchmarks/paired_report.py results/ml1m-loo-fixed [--target 0.003]
"""

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tfrs_logq.studies.compare.stats import (  # noqa: E402
    format_interval,
    format_signed,
    paired_by_seed,
    pairs_for_power,
    values_by_seed,
)

PAIRS = (("inbatch-logq-official", "inbatch-corrected"), ("mns-logq-official", "mns-corrected"))
METRICS = ("window_test_recall@20", "window_test_ndcg@20")


def report(rows: list, target: float) -> str:
    lines = ["| losses (improved - standard) | metric | pairs | mean diff | s.e. | 95% interval "
             f"| reading | pairs for 80% power at +-{target:.3f} |",
             "|---|---|---|---|---|---|---|---|"]
    for standard, improved in PAIRS:
        for metric in METRICS:
            d = paired_by_seed(values_by_seed(rows, metric, loss=improved),
                               values_by_seed(rows, metric, loss=standard))
            if not d["n"]:
                continue
            if d["n"] < 2:
                lines.append(f"| {improved} - {standard} | {metric} | 1 | "
                             f"{format_signed(d['mean'])} | - | - | one pair: no interval | - |")
                continue
            reading = "within noise" if d["within_noise"] else (
                "improved better" if d["mean"] > 0 else "standard better")
            needed = pairs_for_power(target, d["sd"])  # 80 % power against +-target
            lines.append(f"| {improved} - {standard} | {metric} | {d['n']} | "
                         f"{format_signed(d['mean'])} | {d['se']:.4f} | {format_interval(d)} "
                         f"| {reading} | {needed} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--target", type=float, default=0.003,
                        help="the difference to detect with 80%% power (default 0.003)")
    args = parser.parse_args()
    path = os.path.join(args.output_dir, "results.csv")
    if not os.path.exists(path):
        sys.exit(f"paired_report.py: {path} not found")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    text = report(rows, args.target)
    out = os.path.join(args.output_dir, "paired.md")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    print(text, end="")


if __name__ == "__main__":
    main()
