"""The learning curve's tables: levels, and corrected against each form, by step count.

    python -m benchmarks.accelerator.curve_report results/accelerator-study/results.csv \\
        [--synthetic-items 1000000] [--proposal mixture]

Reads the rows of one world (its catalog size, the rows' ``num_items``) and proposal from
the study's ``results.csv`` and prints two markdown tables: every row's exact
Recall@10/100/1000, model median ``P`` and ms per step, by step count, correction and seed;
then, at each step count, corrected minus each other correction paired by seed (common
random numbers), every seed's difference and, from two seeds on, the mean with its 95 % t
interval (`tfrs_logq.studies.compare.stats.paired_by_seed`).
No TensorFlow, no JAX: the CSV and SciPy.
"""

from __future__ import annotations

import argparse
import csv
import sys

from tfrs_logq.studies.compare.stats import (
    format_interval,
    format_signed,
    paired_by_seed,
    values_by_seed,
)

KS = (10, 100, 1000)
ORDER = ("corrected", "logq-tfrs", "logq-official", "none", "corrected-w1")


def _order(correction: str) -> tuple:
    return (ORDER.index(correction) if correction in ORDER else len(ORDER), correction)


def read_rows(path: str, num_items: int, proposal: str) -> list:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if int(r["num_items"]) == num_items and r["proposal"] == proposal]
    if not rows:
        raise SystemExit(f"{path}: no rows with num_items={num_items} and "
                         f"proposal={proposal!r}")
    return rows


def levels_table(rows: list) -> str:
    out = ["| steps | correction | seed | exact R@10 | R@100 | R@1000 | model `P` median "
           "| ms / step |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (int(r["steps"]), _order(r["correction"]),
                                         int(r["seed"]))):
        recall = " | ".join(f"{float(r[f'exact_recall@{k}']):.4f}" for k in KS)
        step = float(r["seconds_per_step"]) * 1e3 if r["seconds_per_step"] else float("nan")
        out.append(f"| {int(r['steps']):,} | {r['correction']} | {r['seed']} | {recall} "
                   f"| {float(r['model_p_q50']):.4f} | {step:.2f} |")
    return "\n".join(out)


def paired_table(rows: list, reference: str = "corrected") -> str:
    out = [f"| steps | {reference} minus | seeds | per seed (R@10 / R@100 / R@1000) "
           "| mean, 95 % interval R@10 | R@100 | R@1000 |", "|---|---|---|---|---|---|---|"]
    others = sorted({r["correction"] for r in rows if r["correction"] != reference}, key=_order)
    for steps in sorted({int(r["steps"]) for r in rows}):
        for other in others:
            pairs = [(values_by_seed(rows, f"exact_recall@{k}", correction=reference,
                                     steps=steps),
                      values_by_seed(rows, f"exact_recall@{k}", correction=other, steps=steps))
                     for k in KS]
            seeds = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs)))
            if not seeds:
                continue
            diffs = [paired_by_seed(a, b, seeds=seeds) for a, b in pairs]
            per_seed = "; ".join(" / ".join(format_signed(d["differences"][i]) for d in diffs)
                                 for i in range(len(seeds)))
            cells = [format_interval(d, plus_minus=True) for d in diffs]
            out.append(f"| {steps:,} | {other} | {','.join(map(str, seeds))} | {per_seed} "
                       f"| {' | '.join(cells)} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="?", default="results/accelerator-study/results.csv")
    p.add_argument("--synthetic-items", type=int, default=1_000_000,
                   help="the world's catalog size (the rows' num_items)")
    p.add_argument("--proposal", default="mixture")
    args = p.parse_args(argv)
    rows = read_rows(args.results, args.synthetic_items, args.proposal)
    print(levels_table(rows))
    print()
    print(paired_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
