"""The study's report: table.md (means and paired differences), paired.png and regime.png.

Reads the rows of `lab.study`'s results.csv. A *scenario* is every field of
a run but its proposal, correction and seed; within a scenario, each ``corrected``
variant (one per proposal) is compared with each standard variant (``none``,
``logq-tfrs``, ``logq-official``, any proposal) seed by seed:
`tfrs_logq.stats.paired_difference` gives the mean difference and its 95 % t
interval. "within noise" means the interval holds 0. Where a correction ran with more
than one proposal, each other proposal is compared with the unigram one (the paper's
convention) the same way (`proposal_comparisons`).
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

from tfrs_logq._util.atomic import save_figure, write_text
from tfrs_logq.proposal import standard_positive_share
from tfrs_logq.stats import paired_difference

KS = (10, 100, 1000)
# A run's own fields, not its scenario's (resumed_from_step: where a killed run went on;
# machine: what it ran on, `tfrs_logq._util.hostinfo`).
VARIANT_FIELDS = ("proposal", "correction", "seed", "run_id", "resumed_from_step", "machine")
SCENARIO_LABEL = ("num_items", "num_topics", "topic_sharpness", "sampler", "num_in_batch",
                  "num_uniform", "steps", "batch_size", "optimizer")
METRIC_PREFIXES = ("exact_", "observed_", "head_", "torso_", "tail_", "oracle_", "truth_",
                   "model_", "seconds_", "train_", "eval_")


def _is_metric(field: str) -> bool:
    return field.startswith(METRIC_PREFIXES) or field.endswith("_targets")


def scenarios(rows: list[dict]) -> dict:
    """scenario key -> {(proposal, correction): {seed: row}}."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        key = tuple((f, row[f]) for f in row if f not in VARIANT_FIELDS and not _is_metric(f))
        out[key][(row["proposal"], row["correction"])][int(row["seed"])] = row
    return out


def label(key: tuple) -> str:
    d = dict(key)
    negatives = {"in-batch": f"in-batch {d['num_in_batch']}",
                 "uniform": f"uniform {d['num_uniform']}",
                 "mixed": f"mixed {d['num_uniform']} uniform + {d['num_in_batch']} in-batch"}
    return (f"V={int(d['num_items']):,}, C={d['num_topics']}, sigma={d['topic_sharpness']}, "
            f"{negatives[d['sampler']]}, {d['steps']} steps x {d['batch_size']}, "
            f"{d['optimizer']}")


def comparisons(variants: dict, metric: str) -> list[tuple]:
    """``(corrected variant, standard variant, paired_difference)`` for every pair."""
    out = []
    for (p_c, c_c), corrected in sorted(variants.items()):
        if c_c != "corrected":
            continue
        for (p_s, c_s), standard in sorted(variants.items()):
            if c_s == "corrected":
                continue
            seeds = sorted(set(corrected) & set(standard))
            if not seeds:
                continue
            diff = paired_difference([float(standard[s][metric]) for s in seeds],
                                     [float(corrected[s][metric]) for s in seeds])
            out.append(((p_c, c_c), (p_s, c_s), diff))
    return out


def proposal_comparisons(variants: dict, metric: str, baseline: str = "unigram") -> list[tuple]:
    """``(correction, proposal, paired_difference)``: ``proposal`` minus ``baseline``
    with the same correction, seed by seed, for every correction run with both."""
    out = []
    for (proposal, correction), runs in sorted(variants.items(), key=lambda kv: kv[0][::-1]):
        base = variants.get((baseline, correction))
        seeds = sorted(set(runs) & set(base or ()))
        if proposal == baseline or not seeds:
            continue
        diff = paired_difference([float(base[s][metric]) for s in seeds],
                                 [float(runs[s][metric]) for s in seeds])
        out.append((correction, proposal, diff))
    return out


def _interval(diff: dict) -> str:
    if diff["half_width"] is None:
        return f"{diff['mean']:+.4f} (n=1)"
    mark = " (within noise)" if diff["within_noise"] else ""
    return f"{diff['mean']:+.4f} ± {diff['half_width']:.4f}{mark}"


def _mean(rows: dict, field: str) -> float:
    """Mean over seeds, NaN and empty cells left out (a run resumed after its last step
    has no seconds per step); NaN when none is left."""
    values = [float(r[field]) for r in rows.values() if r.get(field) not in (None, "")]
    values = [v for v in values if not np.isnan(v)]
    return float(np.mean(values)) if values else float("nan")


def _machines(variants: dict) -> str:
    """" Ran on: ..." naming each machine of the scenario's runs (rows that name one)."""
    names = sorted({row.get("machine") for runs in variants.values() for row in runs.values()}
                   - {None, ""})
    return f" Ran on: {'; '.join(names)}." if names else ""


def format_table(rows: list[dict]) -> str:
    lines = ["# Synthetic large-catalog study", "",
             "Exact = expected Recall@k (sum of the true P(d|u) over the model's top-k); "
             "observed = held-out targets; bands by the target's popularity (thirds of the "
             "interaction mass). Paired differences: corrected minus the standard variant, "
             "seed by seed, mean ± half-width of the 95 % t interval (tfrs_logq.stats).", ""]
    lines += format_summary(rows)
    for key, variants in scenarios(rows).items():
        any_row = next(iter(next(iter(variants.values())).values()))
        lines += [f"## {label(key)}", "",
                  "Oracle exact Recall@10/100/1000: "
                  + " / ".join(f"{float(any_row[f'oracle_exact_recall@{k}']):.4f}" for k in KS)
                  + f". Truth at the held-out pairs: P(p|u) median "
                  f"{float(any_row['truth_p_q50']):.2e}, P/Q quantiles 10/50/90 % "
                  + " / ".join(f"{float(any_row[f'truth_p_over_q_q{q}']):.3g}"
                               for q in (10, 50, 90))
                  + f"; the positive's median share of the standard loss's denominator "
                  f"(P/Q) / (P/Q + {num_negatives(key)}), with the unigram Q, is "
                  f"{truth_positive_share(key, any_row):.3f}."
                  + _machines(variants), "",
                  "| proposal | correction | seeds | exact R@10 | exact R@100 | exact R@1000 "
                  "| obs. R@100 | head / torso / tail R@100 | model P/Q median | s/step |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for (proposal, correction), runs in sorted(variants.items()):
            lines.append(
                f"| {proposal} | {correction} | {len(runs)} | "
                + " | ".join(f"{_mean(runs, f'exact_recall@{k}'):.4f}" for k in KS)
                + f" | {_mean(runs, 'observed_recall@100'):.4f} | "
                + " / ".join(f"{_mean(runs, f'{b}_recall@100'):.3f}"
                             for b in ("head", "torso", "tail"))
                + f" | {_mean(runs, 'model_p_over_q_q50'):.3g}"
                + f" | {_mean(runs, 'seconds_per_step'):.3f} |")
        lines += ["", "| corrected (proposal) minus | Δ exact R@10 | Δ exact R@100 "
                  "| Δ exact R@1000 | Δ observed R@1000 |", "|---|---|---|---|---|"]
        per_metric = {m: comparisons(variants, m) for m in
                      [f"exact_recall@{k}" for k in KS] + ["observed_recall@1000"]}
        first = per_metric["exact_recall@10"]
        for i, (corr, std, _) in enumerate(first):
            cells = [_interval(per_metric[m][i][2]) for m in per_metric]
            lines.append(f"| corrected ({corr[0]}) − {std[1]} ({std[0]}) | "
                         + " | ".join(cells) + " |")
        by_proposal = {m: proposal_comparisons(variants, m) for m in per_metric}
        if by_proposal["exact_recall@10"]:
            lines += ["", "| proposal minus unigram, same correction | Δ exact R@10 "
                      "| Δ exact R@100 | Δ exact R@1000 | Δ observed R@1000 |",
                      "|---|---|---|---|---|"]
            for i, (correction, proposal, _) in enumerate(by_proposal["exact_recall@10"]):
                cells = [_interval(by_proposal[m][i][2]) for m in by_proposal]
                lines.append(f"| {proposal} − unigram ({correction}) | "
                             + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_chart(rows: list[dict], path: str) -> None:
    """One panel per scenario: paired difference of exact Recall@k (corrected minus each
    standard variant) with its 95 % interval, against k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(scenarios(rows).items())[:12]
    cols = min(2, len(groups))
    nrows = -(-len(groups) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 3.6 * nrows), squeeze=False)
    for ax, (key, variants) in zip(axes.flat, groups):
        per_k = [comparisons(variants, f"exact_recall@{k}") for k in KS]
        for j, (corr, std, _) in enumerate(per_k[0]):
            means = [per_k[i][j][2]["mean"] for i in range(len(KS))]
            halves = [per_k[i][j][2]["half_width"] or 0.0 for i in range(len(KS))]
            x = np.arange(len(KS)) + 0.08 * (j - (len(per_k[0]) - 1) / 2)
            ax.errorbar(x, means, yerr=halves, marker="o", capsize=3,
                        label=f"corrected ({corr[0]}) − {std[1]} ({std[0]})")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(KS)), [f"R@{k}" for k in KS])
        ax.set_ylabel("Δ exact expected recall")
        ax.set_title(label(key), fontsize=8)
        if per_k[0]:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle("Corrected minus standard logQ, paired by seed (95 % t intervals)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # the format from the extension, as savefig did
    plt.close(fig)


def num_negatives(key_or_row) -> int:
    d = dict(key_or_row)
    return ((int(d["num_in_batch"]) if d["sampler"] in ("in-batch", "mixed") else 0)
            + (int(d["num_uniform"]) if d["sampler"] in ("uniform", "mixed") else 0))


def truth_positive_share(key, any_row: dict) -> float:
    """Median over held-out pairs of the positive's share of the standard loss's
    denominator at the truth, ``(P/Q) / (P/Q + n)`` (monotone in ``P/Q``, so the share
    at the median ``P/Q`` is the median share)."""
    return float(standard_positive_share(float(any_row["truth_p_over_q_q50"]),
                                         num_negatives(key)))


def regime_points(rows: list[dict], metric: str) -> list[dict]:
    """One point per scenario and (corrected, standard) pair with the same proposal:
    the truth's median positive share and the paired difference of ``metric``."""
    points = []
    for key, variants in scenarios(rows).items():
        any_row = next(iter(next(iter(variants.values())).values()))
        for corr, std, diff in comparisons(variants, metric):
            if std[0] == corr[0]:
                points.append({"share": truth_positive_share(key, any_row),
                               "model_share": model_positive_share(key, variants[std]),
                               "sampler": dict(key)["sampler"], "standard": std[1],
                               "proposal": std[0],
                               "scenario": label(key), **diff})
    return points


def model_positive_share(key, runs: dict) -> float:
    """The same share at the trained standard-variant model (its median `P/Q`, mean over
    seeds): what `tfrs-logq diagnose` reports for a user's own model, so a user can find
    their model's row in the summary."""
    return float(standard_positive_share(_mean(runs, "model_p_over_q_q50"),
                                         num_negatives(key)))


def format_summary(rows: list[dict]) -> list[str]:
    """table.md's first section: every scenario's corrected-minus-standard differences of
    exact Recall@k (same proposal) in one table, ordered by the truth's positive share
    (the data of regime.png)."""
    by_k = {k: regime_points(rows, f"exact_recall@{k}") for k in KS}
    if not by_k[KS[0]]:
        return []
    lines = ["## Where the correction matters", "",
             "Corrected minus the standard variant with the same proposal, exact Recall@k, "
             "one row per scenario and standard variant, by the truth's median share of the "
             "positive in the standard loss's denominator (unigram Q); *model share* is "
             "the same at the trained standard-variant model (its median P/Q; what "
             "`tfrs-logq diagnose` reports for a user's model).", "",
             "| share | model share | scenario | corrected minus | seeds | Δ R@10 | Δ R@100 "
             "| Δ R@1000 |",
             "|---|---|---|---|---|---|---|---|"]
    order = sorted(range(len(by_k[KS[0]])), key=lambda i: (by_k[KS[0]][i]["share"],
                                                            by_k[KS[0]][i]["scenario"]))
    for i in order:
        pt = by_k[KS[0]][i]
        lines.append(f"| {pt['share']:.3f} | {pt['model_share']:.3f} | {pt['scenario']} "
                     f"| {pt['standard']} "
                     f"({pt['proposal']}) | {pt['n']} | "
                     + " | ".join(_interval(by_k[k][i]) for k in KS) + " |")
    return lines + [""]


SHARE_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def write_regime_chart(rows: list[dict], path: str) -> None:
    """Where does the correction matter: paired difference of exact Recall@k
    (corrected minus logq-tfrs / logq-official, same proposal) against the truth's
    median positive share of the standard loss's denominator, one panel per k."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KS), figsize=(5.0 * len(KS), 3.8), squeeze=False)
    colours = {"logq-tfrs": "tab:blue", "logq-official": "tab:orange", "none": "tab:grey"}
    markers = {"mixed": "o", "in-batch": "s", "uniform": "^"}
    for ax, k in zip(axes.flat, KS):
        seen = set()
        for pt in regime_points(rows, f"exact_recall@{k}"):
            name = f"corrected − {pt['standard']}, {pt['sampler']}"
            ax.errorbar(pt["share"], pt["mean"], yerr=pt["half_width"] or 0.0, capsize=3,
                        color=colours.get(pt["standard"], "black"),
                        marker=markers.get(pt["sampler"], "x"), linestyle="none",
                        label=None if name in seen else name)
            seen.add(name)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        # Shares lie in (0, 1): plain tick labels, none on the minor ticks (matplotlib's
        # default labels every minor tick of a sub-decade log axis, which overlap).
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(SHARE_TICKS))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter(
            [f"{t:g}" for t in SHARE_TICKS]))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("truth: median share of the positive in the standard denominator")
        ax.set_ylabel(f"Δ exact Recall@{k}")
        if seen:
            ax.legend(fontsize=6)
    fig.suptitle("Where the correction matters (paired by seed, 95 % t intervals; x from the "
                 "unigram P/Q, approximate for the mixture proposal)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def write_report(rows: list[dict], output_dir: str) -> None:
    write_text(os.path.join(output_dir, "table.md"), format_table(rows))
    write_chart(rows, os.path.join(output_dir, "paired.png"))
    write_regime_chart(rows, os.path.join(output_dir, "regime.png"))


__all__ = ["comparisons", "format_summary", "format_table", "model_positive_share",
           "num_negatives", "regime_points",
           "scenarios", "truth_positive_share", "write_chart", "write_regime_chart",
           "write_report"]
