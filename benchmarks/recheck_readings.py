"""Recomputes, from the committed rows, every figure the published readings were corrected to.

Each section prints one reading's figures with `tfrs_logq.studies.compare.stats` (paired
95 % t intervals over seeds, the paired t-test's p-value, Holm, power, equivalence power),
from the CSV files the READMEs cite:

1. The 1M-item curve's six headline comparisons (100k steps, exact Recall@10/100/1000,
   corrected minus logq-tfrs and logq-official, 3 seeds): p-values, Bonferroni and Holm;
   seed 1 (whose pairs cross machines and code) per difference, and every difference
   without it; the check across the two commits (results/accelerator-study/crosscommit.csv).
2. The same runs' band rows (observed single-target recall) against the "all" row (exact
   expected recall), the tail-minus-head contrast per seed, and a tail difference in users.
3. The checkpoints of the curve (12/41/123/410 examples per item are evaluations of the
   same runs).
4. The sweep's small-share cells (`C = 100`): how many of the 12 intervals exclude 0.
5. The JAX study against the TF study on the sweep's `C = 10,000` mixed cell: an
   equivalence check at +-0.003 (unpaired, Welch).
6. The false-discovery counts over the synthetic studies and the budget map.
7. ML-1M fixed-length pairs for 80 % power at the spreads' upper limits.
8. `compare` on ML-1M: the spread of the paired differences with the last evaluation
   against the mean of the last 3 (the `--window`).
9. The ML-1M parity rows: how many seeds each rests on.

    python benchmarks/recheck_readings.py [--shared ../shared]

Reads only CSV files (numpy and SciPy through tfrs_logq.studies.compare.stats; no TensorFlow). Every
interval here is over seeds alone with a fixed set of test users (the held-out users of
each study): it says how the training draw moves a figure, not how another sample of
users would.
"""

import argparse
import csv
import math
import os
import sys

import numpy as np
from scipy import stats as _scipy_stats

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from tfrs_logq.studies.compare.stats import (  # noqa: E402
    format_interval,
    format_signed,
    holm,
    paired_by_seed,
    paired_t_p_value,
    pairs_for_equivalence,
    pairs_for_power,
    sd_upper_limit,
    seed_outliers,
    values_by_seed,
)

KS = (10, 100, 1000)
CURVE = "results/accelerator-study/results.csv"


def _rows(path: str) -> list[dict]:
    with open(os.path.join(ROOT, path), newline="") as f:
        return list(csv.DictReader(f))


def _diff(rows, metric, subject, reference, seeds=None, **match):
    return paired_by_seed(values_by_seed(rows, metric, correction=subject, **match),
                          values_by_seed(rows, metric, correction=reference, **match),
                          seeds=seeds)


def _show(d: dict, digits: int = 4) -> str:
    return f"{format_signed(d['mean'], digits)} {format_interval(d, digits)}".rstrip()


def headline(shared: str) -> None:
    print("== 1. The 1M-item curve at 100k steps (410 examples per item), exact Recall, "
          "corrected minus each standard form, seeds 0-2 ==")
    rows = [r for r in _rows(CURVE) if r["num_items"] == "1000000"]
    evidence = os.path.join(shared, "evidence", "curve-1m-h200.csv")
    if os.path.exists(evidence):
        with open(evidence, newline="") as f:
            h200 = list(csv.DictReader(f))
        ours = {r["run_id"].replace("logq-paper", "logq-tfrs"): r for r in rows}
        same = sum(1 for r in h200
                   if all(ours.get(r["run_id"].replace("logq-paper", "logq-tfrs"), {}).get(k)
                          == r[k] for k in ("exact_recall@10", "exact_recall@100",
                                            "exact_recall@1000")))
        print(f"the H200 evidence file's {len(h200)} rows: {same} equal to the committed rows "
              f"(logq-paper is logq-tfrs's former name)")
    else:
        print(f"({evidence} absent: the committed rows alone)")
    machine = {(r["correction"], int(r["seed"]), int(r["steps"])): r["device"].split(":")[-1]
               for r in rows}
    tests = []
    for reference in ("logq-tfrs", "logq-official"):
        for k in KS:
            d = _diff(rows, f"exact_recall@{k}", "corrected", reference, steps=100000)
            tests.append((reference, k, d, paired_t_p_value(d)))
    adjusted = holm([t[3] for t in tests])
    m = len(tests)
    print(f"{'minus':<14}{'k':>5}  difference [95 % t]          p       Holm    "
          f"Bonferroni(<{0.05 / m:.4f})  per seed (0, 1, 2)          seed-1 outlier?")
    for (reference, k, d, p), p_holm in zip(tests, adjusted):
        per_seed = ", ".join(format_signed(x) for x in d["differences"])
        extreme = max(range(3), key=lambda i: abs(d["differences"][i] - d["mean"]))
        print(f"{reference:<14}{k:>5}  {_show(d):<28} {p:.4f}  {p_holm:.4f}  "
              f"{'survives' if p <= 0.05 / m else 'does not':<24} {per_seed}  "
              f"extreme seed {extreme}, flagged {seed_outliers(d['differences'])[1]}")
    print("Holm at 5 %: " + "; ".join(
        f"{ref} R@{k} {'survives' if ph <= 0.05 else 'does not'}"
        for (ref, k, _, _), ph in zip(tests, adjusted)))
    print("Machines of seed 1's pairs at 100k steps: corrected "
          f"{machine[('corrected', 1, 100000)]}, logq-tfrs {machine[('logq-tfrs', 1, 100000)]}, "
          f"logq-official {machine[('logq-official', 1, 100000)]}; seed 0 all "
          f"{machine[('corrected', 0, 100000)]}, seed 2 all {machine[('corrected', 2, 100000)]}")
    print("Without seed 1 (seeds 0 and 2: 2 pairs, 1 degree of freedom, t = 12.7; a direction, "
          "not a verdict):")
    for reference in ("logq-tfrs", "logq-official"):
        cells = []
        for k in KS:
            d = _diff(rows, f"exact_recall@{k}", "corrected", reference, seeds=[0, 2],
                      steps=100000)
            cells.append(f"R@{k} {_show(d)}")
        print(f"  minus {reference}: " + "; ".join(cells))
    print("The two code versions (H100 rows 6ca138781fa8, H200 rows 23c9c68e5576) give "
          "bit-equal numbers on one small world, seed 1, on CPU "
          "(results/accelerator-study/crosscommit.csv); the two machines are not checked.")
    print()


def bands() -> None:
    print("== 2. Band rows (observed single-target recall) and the 'all' row (exact expected "
          "recall), 100k steps, corrected minus logq-tfrs ==")
    rows = [r for r in _rows(CURVE) if r["num_items"] == "1000000"]
    targets = {b: int(rows[-1][f"{b}_targets"]) for b in ("head", "torso", "tail")}
    print(f"band sizes (held-out users by their target's band): {targets}")
    for k in KS:
        exact = _diff(rows, f"exact_recall@{k}", "corrected", "logq-tfrs", steps=100000)
        observed = _diff(rows, f"observed_recall@{k}", "corrected", "logq-tfrs", steps=100000)
        print(f"R@{k}: all users, exact {_show(exact)}; all users, observed {_show(observed)}")
    for k in (10, 100):
        head = values_by_seed(rows, f"head_recall@{k}", correction="corrected", steps=100000)
        head_ref = values_by_seed(rows, f"head_recall@{k}", correction="logq-tfrs",
                                  steps=100000)
        tail = values_by_seed(rows, f"tail_recall@{k}", correction="corrected", steps=100000)
        tail_ref = values_by_seed(rows, f"tail_recall@{k}", correction="logq-tfrs",
                                  steps=100000)
        tail_d = {s: tail[s] - tail_ref[s] for s in tail}
        head_d = {s: head[s] - head_ref[s] for s in head}
        contrast = paired_by_seed(tail_d, head_d)
        print(f"R@{k}: tail minus head of (corrected - logq-tfrs), per seed "
              f"{', '.join(format_signed(x) for x in contrast['differences'])}: "
              f"{_show(contrast, 3)}")
    print("A tail difference in users (observed recall of one target per user: a difference "
          "d is d x users net users):")
    for steps, reference, k in ((30000, "logq-official", 10), (100000, "logq-tfrs", 10)):
        d = _diff(rows, f"tail_recall@{k}", "corrected", reference, steps=steps)
        users = [x * targets["tail"] for x in d["differences"]]
        print(f"  {steps // 1000}k steps, corrected - {reference}, tail R@{k}: {_show(d)} = "
              f"{abs(d['mean']) * targets['tail']:.1f} of {targets['tail']:,} tail users "
              f"(per seed {', '.join(f'{u:+.0f}' for u in users)})")
    print()


def checkpoints() -> None:
    print("== 3. The curve's step counts are evaluations of the same runs ==")
    rows = [r for r in _rows(CURVE) if r["num_items"] == "1000000"]
    runs = {}
    for r in rows:
        runs.setdefault((r["correction"], r["seed"]), []).append(int(r["steps"]))
    print("runs (correction, seed) and the steps each was evaluated at: "
          + "; ".join(f"{c} {s}: {sorted(v)}" for (c, s), v in sorted(runs.items())))
    print("resumed_from_step of the 100k rows: "
          + ", ".join(sorted({r["resumed_from_step"] for r in rows if r["steps"] == "100000"})))
    print()


def small_share() -> None:
    import fdr_synthetic
    print("== 4. The sweep's small-share cells (C = 100, truth's share 0.04-0.07) ==")
    cells = [x for x in fdr_synthetic.intervals("sweep") if ", C=100," in x["scenario"]]
    for x in cells:
        print(f"  {x['scenario'].split(', ')[3]:<36} minus {x['standard']:<26} R@{x['k']:<5}"
              f"{_show(x)}  p = {x['p']:.4f}{'  excludes 0' if not x['within_noise'] else ''}")
    widest = max(max(abs(x["low"]), abs(x["high"])) for x in cells)
    print(f"{sum(not x['within_noise'] for x in cells)} of {len(cells)} intervals exclude 0; "
          f"the widest reaches {widest:.4f}")
    print()


def jax_tf() -> None:
    print("== 5. JAX against TF on the sweep's C = 10,000 mixed cell (unpaired: JAX seed s is "
          "not TF seed s), Welch ==")
    tf = [r for r in _rows("results/synthetic-study-sweep/results.csv")
          if r["num_topics"] == "10000" and r["sampler"] == "mixed"
          and r["proposal"] == "mixture"]
    jax = [r for r in _rows(CURVE) if r["num_items"] == "100000"]
    margin = 0.003
    for correction in ("corrected", "logq-tfrs"):
        for k in KS:
            metric = f"exact_recall@{k}"
            a = np.array([float(r[metric]) for r in tf if r["correction"] == correction])
            b = np.array([float(r[metric]) for r in jax if r["correction"] == correction])
            va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
            se = math.sqrt(va + vb)
            df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
            mean = float(b.mean() - a.mean())
            h95 = float(_scipy_stats.t.ppf(0.975, df)) * se
            h90 = float(_scipy_stats.t.ppf(0.95, df)) * se
            inside = -margin < mean - h90 and mean + h90 < margin
            print(f"  {correction:<10} R@{k:<5} JAX - TF {mean:+.4f}, 95 % [{mean - h95:+.4f}, "
                  f"{mean + h95:+.4f}], 90 % [{mean - h90:+.4f}, {mean + h90:+.4f}] (df "
                  f"{df:.1f}): {'equivalent' if inside else 'NOT shown equivalent'} at "
                  f"+-{margin} (two one-sided tests at 5 %)")
    print()


def false_discoveries() -> None:
    import fdr_synthetic
    print("== 6. Benjamini-Hochberg (q = 0.05) over the synthetic intervals ==")
    fdr_synthetic.STUDIES["budget"] = "results/synthetic-study-budget"
    four = [x for s in ("sweep", "headline", "scale", "samplers")
            for x in fdr_synthetic.intervals(s)]
    budget = fdr_synthetic.intervals("budget")
    both = four + budget
    joint = fdr_synthetic.benjamini_hochberg([x["p"] for x in both], 0.05)
    alone4 = sum(fdr_synthetic.benjamini_hochberg([x["p"] for x in four], 0.05))
    alone_b = sum(fdr_synthetic.benjamini_hochberg([x["p"] for x in budget], 0.05))
    joint4, joint_b = sum(joint[:len(four)]), sum(joint[len(four):])
    print(f"the four studies: {len(four)} intervals, "
          f"{sum(not x['within_noise'] for x in four)} exclude 0, {alone4} survive BH alone")
    print(f"the budget map: {len(budget)} intervals, "
          f"{sum(not x['within_noise'] for x in budget)} exclude 0, {alone_b} survive BH alone")
    print(f"all {len(both)} together: {sum(not x['within_noise'] for x in both)} exclude 0, "
          f"{sum(joint)} survive one BH over all: {joint4} of the four studies' + {joint_b} of "
          f"the budget map's")
    print()


def ml1m_pairs() -> None:
    print("== 7. ML-1M fixed length (4 pairs): pairs for 80 % power against 0.003 Recall@20 ==")
    rows = _rows("results/ml1m-loo-fixed/results.csv")
    for negatives in ("inbatch", "mns"):
        d = paired_by_seed(
            values_by_seed(rows, "window_test_recall@20", loss=f"{negatives}-corrected"),
            values_by_seed(rows, "window_test_recall@20", loss=f"{negatives}-logq-official"))
        upper = sd_upper_limit(d["sd"], d["n"])
        print(f"  {negatives:<8} {_show(d)} p = {paired_t_p_value(d):.4f}; sd {d['sd']:.5f}, "
              f"one-sided 95 % upper limit {upper:.5f}: pairs_for_power(0.003) "
              f"{pairs_for_power(0.003, d['sd'])} at the sd, {pairs_for_power(0.003, upper)} at "
              f"its upper limit; pairs_for_equivalence(0.003) "
              f"{pairs_for_equivalence(0.003, d['sd'])} / "
              f"{pairs_for_equivalence(0.003, upper)}")
    print()


def window() -> None:
    print("== 8. compare on ML-1M: spread of the paired differences, last evaluation (3,000 "
          "steps) against the mean of the last 3 (2,000-3,000) ==")
    curves = _rows("results/compare-ml1m/curves.csv")
    results = _rows("results/compare-ml1m/results.csv")
    rose = 0
    for reference in ("inbatch-logq-tfrs", "inbatch-logq-official"):
        for k in KS:
            metric = f"recall@{k}"
            last = paired_by_seed(values_by_seed(curves, metric, loss="inbatch-corrected",
                                                 steps=3000),
                                  values_by_seed(curves, metric, loss=reference, steps=3000))
            win = paired_by_seed(values_by_seed(results, metric, loss="inbatch-corrected"),
                                 values_by_seed(results, metric, loss=reference))
            ratio = win["sd"] / last["sd"]
            rose += k != 10 and ratio > 1
            print(f"  corrected - {reference:<22} R@{k:<5} sd last {last['sd']:.5f}, window "
                  f"{win['sd']:.5f} (x{ratio:.2f}); last {_show(last)}, window {_show(win)}")
    print(f"the window's spread is larger at R@100/1000 in {rose} of 4 cases")
    print()


def parity() -> None:
    print("== 9. ML-1M parity at the cpu budget: seeds per row ==")
    path = os.path.join(ROOT, "results/parity-cpu/parity.md")
    with open(path) as f:
        for line in f:
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) >= 3 and cols[1] and cols[1][0].isdigit():
                print(f"  {cols[0]:<24} seeds {cols[1]} ({len(cols[1].split(','))})")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"),
                        help="the shared folder holding evidence/curve-1m-h200.csv")
    args = parser.parse_args()
    print("Every interval below is over seeds alone, with a fixed set of test users.\n")
    headline(args.shared)
    bands()
    checkpoints()
    small_share()
    jax_tf()
    false_discoveries()
    ml1m_pairs()
    window()
    parity()


if __name__ == "__main__":
    main()
