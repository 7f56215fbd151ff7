"""How many of the synthetic study's corrected-vs-standard intervals survive a
false-discovery correction.

Recomputes, from each study's committed results.csv, every interval of its table.md
summary ("Where the correction matters"): within a scenario (every field of a run but
its proposal, correction and seed), ``corrected`` minus ``logq-tfrs`` and minus
``logq-official`` with the same proposal, exact Recall@10/100/1000, paired by seed with
`tfrs_logq.studies.compare.stats.paired_by_seed` (95 % t interval). The default studies (sweep,
headline, scale, samplers) hold 90 such intervals; `none` is not a standard form here,
and the pilot and negatives presets are left out unless named with --studies.

Each interval gives a two-sided paired t test (``t = mean / se``, ``n - 1`` degrees of
freedom); Benjamini-Hochberg at --q over all of them says how many differences are
discoveries. Each recomputed mean and half-width is checked against the table.md row it
reproduces (4 decimals). Printed also: the count without the cells that re-run another
study's cell (the scale preset's 100,000-item reference re-runs the sweep's `C = 10,000`
in-batch cell; the samplers' two in-batch unigram cells re-run the sweep's `C = 10,000`
and `C = 1,000` in-batch cells): near-duplicate tests that a false-discovery count should
not count twice.

    python benchmarks/fdr_synthetic.py [--q 0.05] [--studies sweep headline scale samplers]

Reads only CSV files; needs numpy-free Python with SciPy (via tfrs_logq.studies.compare.stats), no
TensorFlow.
"""

import argparse
import csv
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from tfrs_logq.studies.compare.stats import (  # noqa: E402
    format_interval,
    paired_by_seed,
    paired_t_p_value,
    values_by_seed,
)

STUDIES = {"sweep": "results/synthetic-study-sweep",
           "headline": "results/synthetic-study",
           "scale": "results/synthetic-study-scale",
           "samplers": "results/synthetic-study-samplers",
           "negatives": "results/synthetic-study-negatives",
           "pilot": "results/synthetic-study-pilot"}
DEFAULT_STUDIES = ("sweep", "headline", "scale", "samplers")
STANDARD = ("logq-tfrs", "logq-official")
KS = (10, 100, 1000)
# Fields that tell the runs of one scenario apart (and the metrics): the rest is the scenario.
VARIANT_FIELDS = {"run_id", "proposal", "correction", "seed", "resumed_from_step", "machine"}
METRIC_PREFIXES = ("exact_", "observed_", "head_", "torso_", "tail_", "oracle_", "truth_",
                   "model_", "seconds_", "train_", "eval_")
# Cells that re-run another study's cell (same world, sampler, budget): (study, items,
# topics, sharpness, sampler, proposal).
RERUNS = {("scale", "100000", "10000", "8.0", "in-batch", "unigram"),
          ("samplers", "100000", "10000", "8.0", "in-batch", "unigram"),
          ("samplers", "100000", "1000", "8.0", "in-batch", "unigram")}


def _scenario(row: dict) -> tuple:
    return tuple((f, v) for f, v in row.items()
                 if f not in VARIANT_FIELDS and not f.startswith(METRIC_PREFIXES)
                 and not f.endswith("_targets"))


def _label(scenario: dict) -> str:
    """The scenario as the study's report wrote it in table.md (lab/study_report.py at d9f8357)."""
    d = scenario
    negatives = {"in-batch": f"in-batch {d['num_in_batch']}",
                 "uniform": f"uniform {d['num_uniform']}",
                 "mixed": f"mixed {d['num_uniform']} uniform + {d['num_in_batch']} in-batch"}
    return (f"V={int(d['num_items']):,}, C={d['num_topics']}, sigma={d['topic_sharpness']}, "
            f"{negatives[d['sampler']]}, {d['steps']} steps x {d['batch_size']}, "
            f"{d['optimizer']}")


def intervals(study: str) -> list[dict]:
    path = os.path.join(ROOT, STUDIES[study], "results.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    cells: dict = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        cells[_scenario(row)][(row["proposal"], row["correction"])][int(row["seed"])] = row
    out = []
    for key, variants in cells.items():
        scenario = dict(key)
        for (proposal, correction), corrected in sorted(variants.items()):
            if correction != "corrected":
                continue
            for standard_form in STANDARD:
                standard = variants.get((proposal, standard_form), {})
                for k in KS:
                    metric = f"exact_recall@{k}"
                    d = paired_by_seed(values_by_seed(corrected.values(), metric),
                                       values_by_seed(standard.values(), metric))
                    if d["n"] < 2:
                        continue
                    p = paired_t_p_value(d)
                    rerun = (study, scenario["num_items"], scenario["num_topics"],
                             scenario["topic_sharpness"], scenario["sampler"],
                             proposal) in RERUNS
                    out.append({"study": study, "scenario": _label(scenario),
                                "standard": f"{standard_form} ({proposal})", "k": k,
                                "p": p, "rerun": rerun, **d})
    return out


def table_md_intervals(study: str) -> dict:
    """(scenario label, 'form (proposal)', k) -> (mean, half-width) as table.md prints them."""
    path = os.path.join(ROOT, STUDIES[study], "table.md")
    out = {}
    with open(path) as f:
        for line in f:
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) != 8 or not re.fullmatch(r"[0-9.]+", cols[0]):
                continue
            for k, cell in zip(KS, cols[5:8]):
                m = re.match(r"([+-][0-9.]+) ± ([0-9.]+)", cell)
                if m:
                    out[(cols[2], cols[3], k)] = (float(m.group(1)), float(m.group(2)))
    return out


def benjamini_hochberg(pvalues: list[float], q: float) -> list[bool]:
    """Which hypotheses BH rejects at false-discovery rate ``q``."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    cutoff = 0
    for rank, i in enumerate(order, start=1):
        if pvalues[i] <= rank * q / m:
            cutoff = rank
    rejected = [False] * m
    for rank, i in enumerate(order, start=1):
        rejected[i] = rank <= cutoff
    return rejected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--q", type=float, default=0.05, help="false-discovery rate (0.05)")
    parser.add_argument("--studies", nargs="+", default=list(DEFAULT_STUDIES),
                        choices=sorted(STUDIES))
    parser.add_argument("--list", action="store_true", help="print every interval")
    args = parser.parse_args()

    all_rows, mismatches, checked = [], [], 0
    for study in args.studies:
        rows = intervals(study)
        printed = table_md_intervals(study)
        for r in rows:
            key = (r["scenario"], r["standard"], r["k"])
            if key in printed:
                checked += 1
                mean, half = printed[key]
                if (abs(round(r["mean"], 4) - mean) > 1e-9
                        or abs(round(r["half_width"], 4) - half) > 1e-9):
                    mismatches.append((study, key, printed[key], r["mean"], r["half_width"]))
        all_rows += rows

    def report(rows: list[dict], what: str) -> None:
        excl = sum(not r["within_noise"] for r in rows)
        bh = benjamini_hochberg([r["p"] for r in rows], args.q)
        kept = sum(bh)
        # BH rejects exactly the p-values at or below its cutoff; report the largest kept.
        largest = max((r["p"] for r, b in zip(rows, bh) if b), default=float("nan"))
        lost = [r for r, b in zip(rows, bh) if not b and not r["within_noise"]]
        print(f"{what}: {len(rows)} intervals; {excl} exclude 0 at 95 % (uncorrected); "
              f"{kept} survive Benjamini-Hochberg at q = {args.q} "
              f"(largest p kept {largest:.4f}); {len(lost)} exclude 0 but do not survive")
        for r in lost:
            print(f"    lost: {r['study']}: {r['scenario']} | corrected - {r['standard']} | "
                  f"R@{r['k']} {format_interval(r, plus_minus=True)} (p = {r['p']:.4f})")

    print(f"studies: {', '.join(args.studies)}; corrected minus {' / '.join(STANDARD)}, "
          "same proposal, exact Recall@10/100/1000, paired by seed "
          "(tfrs_logq.studies.compare.stats.paired_by_seed, two-sided t)")
    print(f"checked against table.md: {checked} of {len(all_rows)} intervals, "
          f"{len(mismatches)} differ at 4 decimals")
    for m in mismatches:
        print("    differs:", m)
    for study in args.studies:
        rows = [r for r in all_rows if r["study"] == study]
        print(f"  {study}: {len(rows)} intervals, "
              f"{sum(not r['within_noise'] for r in rows)} exclude 0")
    report(all_rows, "all")
    report([r for r in all_rows if not r["rerun"]],
           "without the re-run cells (scale's 100k reference, samplers' in-batch unigram)")
    if args.list:
        for r in sorted(all_rows, key=lambda r: r["p"]):
            print(f"{r['p']:.5f} {r['study']:9s} {r['scenario']} | {r['standard']} | "
                  f"R@{r['k']} {format_interval(r, plus_minus=True)}")


if __name__ == "__main__":
    main()
