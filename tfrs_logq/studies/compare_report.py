"""The report of `tfrs-logq compare`: the answer first, then the evidence.

- **The verdict**, one sentence per comparison and Recall@k: the corrected loss
  against each standard form in the plan (otherwise each loss against the baseline),
  with its paired 95 % interval, read by `tfrs_logq.stats.classify` against an
  equivalence margin (``--margin``: relative to the reference's value by default, so
  Recall@10 and Recall@1000 are read alike).
- **The run facts**: test targets and users, the share of repeat and cold targets,
  duplicates dropped, diverged runs (left out of the pairs, and named), the trained
  baseline's positive share.
- The table of every metric, the same differences by the popularity band of the
  target (head, torso, tail of the training counts), the pairs a test with 80 %
  power against the margin needs (at the pilot's spread and at its upper 95 % limit),
  the multiple-comparison line over what was actually compared, and the charts.

`write_report` writes ``report.md``, ``paired.png`` and ``learning_curves.png``; it is
a function of ``results.csv``, ``curves.csv`` and the plan alone (``tfrs-logq compare
--report-only`` rebuilds them), so a reader can check a report by hand.
"""

from __future__ import annotations

import math
import os
import re
from typing import Callable, Optional

import numpy as np

from tfrs_logq._util.atomic import save_figure, write_text
from tfrs_logq.metrics import BANDS
from tfrs_logq.stats import (
    MIN_PAIRS,
    classify,
    finite_float,
    format_interval,
    format_signed,
    paired_by_seed,
    pairs_for_power,
    sd_upper_limit,
    values_by_seed,
)
from tfrs_logq.studies.compare import Plan, metric_names

DEFAULT_MARGIN = "2%"
POWER = 0.8
FORM_WORDS = {
    "logq-tfrs": "TFRS's logQ",
    "logq-official": "the official code's logQ",
    "corrected": "corrected logQ",
    "none": "no correction",
}
FORM_NOTES = {
    "logq-tfrs": "the positive's logit corrected too, as TFRS's Retrieval computes it",
    "logq-official": "the positive uncorrected, as the paper's official code computes it",
    "corrected": "the positive out of the denominator, weighted by 1 - P",
    "none": "plain sampled softmax",
}


class Margin:
    """An equivalence margin: ``"2%"`` (of the reference's value) or ``"0.003"``."""

    def __init__(self, text: str = DEFAULT_MARGIN) -> None:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE]-?[0-9]+)?)\s*(%?)\s*", str(text))
        value = float(match.group(1)) if match else float("nan")
        if not match or not 0 < value < (100 if match.group(2) else 1):
            raise ValueError(f"--margin must be a percentage of the reference's value in "
                             f"(0%, 100%) or an absolute difference in (0, 1), such as 2% or "
                             f"0.003; received {str(text)[:40]!r}.")
        self.text = f"{value:g}%" if match.group(2) else f"{value:g}"
        self.relative = bool(match.group(2))
        self.value = value / 100 if self.relative else value

    def of(self, reference_value: float) -> Optional[float]:
        if not self.relative:
            return self.value
        return self.value * reference_value if reference_value > 0 else None

    def describe(self) -> str:
        return (f"{self.text} of the reference's value" if self.relative
                else f"±{self.text} absolute")


def form_of(loss: str) -> str:
    """``inbatch-logq-tfrs`` -> ``logq-tfrs``; a SASRec objective without a form (bce,
    ...) is its own name."""
    return loss.split("-", 1)[1] if loss.startswith(("inbatch-", "mns-")) else loss


def describe(loss: str) -> str:
    words = FORM_WORDS.get(form_of(loss))
    return f"{words} ({loss})" if words else loss


def _finite(value) -> bool:
    return finite_float(value) is not None


def diverged_runs(rows: list[dict]) -> list[tuple]:
    """``(loss, seed)`` of the runs that diverged: flagged by training (a non-finite loss
    or weight) or with a non-finite metric."""
    metrics = metric_names(rows)
    out = []
    for r in rows:
        flagged = str(r.get("diverged", "0")).strip() not in ("", "0", "False", "false")
        if flagged or not all(_finite(r.get(m)) for m in metrics if r.get(m) not in (None, "")):
            out.append((r["loss"], int(r["seed"])))
    return out


def comparisons(plan: Plan) -> list[tuple]:
    """``(subject, reference)`` pairs: each corrected loss against every other loss (the
    baseline first), or, without a corrected loss, each loss against the baseline."""
    corrected = [x for x in plan.losses if form_of(x) == "corrected" and x != plan.baseline]
    if corrected:
        references = [plan.baseline] + [x for x in plan.losses
                                        if x != plan.baseline and x not in corrected]
        return [(s, r) for s in corrected for r in references]
    return [(x, plan.baseline) for x in plan.losses if x != plan.baseline]


def paired(rows: list[dict], plan: Plan, loss: str, metric: str, confidence: float = 0.95,
           reference: Optional[str] = None) -> dict:
    """``loss - reference`` (default the baseline) of ``metric``, paired by seed over the
    seeds both have finished without diverging (`tfrs_logq.stats.paired_by_seed`, in the
    plan's order of seeds)."""
    reference = reference or plan.baseline
    bad = set(diverged_runs(rows))

    def healthy(name):
        # A non-finite value of a healthy run (a popularity band with no target) pairs nothing.
        return {s: v for s, v in values_by_seed(rows, metric, loss=name).items()
                if (name, s) not in bad}

    return paired_by_seed(healthy(loss), healthy(reference), confidence, seeds=plan.seeds)


def verdict(diff: dict, margin: Optional[float] = None) -> str:
    return classify(diff, margin)


def sentence(subject: str, reference: str, metric: str, diff: dict,
             margin: Optional[float]) -> str:
    """The verdict of one comparison, in words, with its interval."""
    kind = classify(diff, margin)
    name = metric.replace("recall@", "Recall@").replace("ndcg@", "NDCG@")
    s, r = form_of(subject), describe(reference)
    if kind == "no pairs":
        return f"{s} against {r}, {name}: no finished pair to compare"
    mean = diff["mean"]
    if kind == "direction only":
        return (f"{s} {mean:+.4f} {name} against {r} over {diff['n']} pair(s): a direction, "
                f"not a verdict (an interval needs {MIN_PAIRS} pairs or more)")
    if kind == "zero spread":
        return (f"{s} against {r}, {name}: every pair differs by exactly {mean:+.4f}; zero "
                f"spread gives no interval (runs that do not vary with the seed cannot be "
                f"tested), not a significant difference")
    interval = format_interval(diff)
    small = (f", less than the margin ({margin:.4f})" if margin is not None
             and -margin < diff["low"] and diff["high"] < margin else "")
    if kind == "better":
        return f"{s} gains {mean:.4f} {name} over {r} {interval}{small}"
    if kind == "worse":
        return f"{s} loses {-mean:.4f} {name} to {r} {interval}{small}"
    if kind == "equivalent":
        return (f"no difference larger than {margin:.4f} {name} between {s} and {r} "
                f"({mean:+.4f} {interval})")
    open_sides = [] if margin is None else (
        (["a gain"] if diff["high"] >= margin else []) + (["a loss"] if -diff["low"] >= margin
                                                           else []))
    return (f"{s} against {r}, {name}: within noise, {mean:+.4f} {interval}: the interval "
            f"rules out a gain above {max(diff['high'], 0.0):.4f} and a loss above "
            f"{max(-diff['low'], 0.0):.4f}"
            + (f"; {' or '.join(open_sides)} as large as the margin ({margin:.4f}) is not ruled "
               f"out" if open_sides else "")
            + ("; no relative margin applies to a reference of 0 (give --margin as an "
               "absolute difference)" if margin is None else ""))


def _power_cell(diff: dict, margin: Optional[float]) -> str:
    if diff.get("sd") is None or margin is None or diff.get("zero_spread"):
        return ""
    at_sd = pairs_for_power(margin, diff["sd"], POWER)
    upper = pairs_for_power(margin, sd_upper_limit(diff["sd"], diff["n"]), POWER)
    show = (lambda n: "> 10,000" if n is None else str(n))
    return f"{show(at_sd)} ({show(upper)})"


def _facts(plan: Plan, rows: list[dict], diverged: list[tuple]) -> list[str]:
    first = next((r for r in rows if r.get("num_targets") not in (None, "")), None)
    lines = []
    if first is not None:
        def share(key):
            value = first.get(key)
            return "?" if value in (None, "") else f"{float(value):.3f}"

        lines.append(
            f"- Test split: {int(float(first['num_targets'])):,} targets of "
            f"{int(float(first.get('num_users') or 0)):,} users. Shares of the test targets: "
            f"repeats (the user had the item before) {share('repeat_share')}; in the history "
            f"a request sends (misses under the exclude-seen policy) "
            f"{share('sent_repeat_share')}; cold (no training interaction) "
            f"{share('cold_share')}.")
        if first.get("duplicate_rows") not in (None, ""):
            lines.append(
                f"- After preprocessing: {int(float(first['duplicate_rows'])):,} rows repeat an "
                f"earlier row exactly, {int(float(first['repeated_pairs'])):,} repeat an earlier "
                f"(user, item) pair" + (" (--deduplicate kept the first of each)"
                                        if (plan.data or {}).get("deduplicate") else "") + ".")
    policy = "exclude-seen" if plan.config.exclude_seen else "keep-seen"
    lines.append(f"- Evaluation policy: {policy} (the served `top_k` "
                 f"{'leaves out' if plan.config.exclude_seen else 'keeps'} the items of "
                 f"the history it is sent; offline metrics rank the same way).")
    if diverged:
        lines.append("- Diverged runs, left out of the pairs: " + ", ".join(
            f"{loss} seed {seed}" for loss, seed in diverged) + ".")
    else:
        lines.append("- Diverged runs: none.")
    base = [float(r["positive_share_q50"]) for r in rows if r["loss"] == plan.baseline
            and _finite(r.get("positive_share_q50"))]
    if base:
        lines.append(
            f"- Positive share of the trained baseline ({plan.baseline}), median over the "
            f"test targets: {float(np.median(base)):.3f}. It measures how large a part of "
            f"the standard loss's denominator the positive's own term is, (P/Q) / (P/Q + "
            f"n): where the standard and corrected losses differ. It describes the regime "
            f"and does not predict the verdict (this project has measured differences "
            f"outside noise at shares from 0.005 to 0.04, and inside noise at the same "
            f"shares).")
    return lines


def format_report(plan: Plan, rows: list[dict], curves: list[dict],
                  margin: Optional[Margin] = None) -> str:
    margin = margin or Margin()
    metrics = metric_names(rows)
    recalls = [m for m in metrics if m.startswith("recall@")]
    pairs = comparisons(plan)
    diverged = diverged_runs(rows)
    config = plan.config
    seeds_done = sorted({int(r["seed"]) for r in rows})

    def compared(subject, reference, metric):
        diff = paired(rows, plan, subject, metric, reference=reference)
        return diff, margin.of(diff.get("reference_mean", float("nan")))

    lines = ["# Paired comparison", "", "## Verdict", ""]
    verdicts = []
    for metric in recalls:
        for subject, reference in pairs:
            diff, m = compared(subject, reference, metric)
            verdicts.append(sentence(subject, reference, metric, diff, m))
    lines += ["On this log, " + "; ".join(verdicts) + "." if verdicts
              else "No metric was recorded.", "",
              f"Intervals: paired 95 % t over the seeds; equivalence margin "
              f"{margin.describe()} (--margin). Losses: " + "; ".join(
                  f"{describe(x)}: {FORM_NOTES[form_of(x)]}" if form_of(x) in FORM_NOTES
                  else x for x in plan.losses) + ".", "", "## Run facts", ""]
    lines += _facts(plan, rows, diverged)
    lines += [
        "", f"Source: {plan.source or '(not recorded)'}. Model: {plan.model}, "
        f"{config.steps:,} steps of {config.batch_size}, embedding {config.embedding_dim}, "
        f"history {config.history_length}, {config.optimizer}, learning rate "
        f"{config.learning_rate}. Test metrics: the mean of the last {plan.window} "
        f"evaluations (every {config.eval_every} steps). Seeds: "
        f"{', '.join(map(str, seeds_done))} (common random numbers: a seed's runs share "
        f"batches, initial weights and negatives). Machine: "
        f"{rows[0].get('machine', '?') if rows else '?'}.", "",
        "## Means over seeds", "",
        "| loss | runs | " + " | ".join(metrics) + " | positive share (median) | s/step |",
        "|---|---|" + "---|" * len(metrics) + "---|---|",
    ]
    bad = set(diverged)
    for loss in plan.losses:
        mine = [r for r in rows if r["loss"] == loss and (loss, int(r["seed"])) not in bad]
        if not mine:
            continue
        cells = [f"{np.mean(values):.4f}" if (values := [float(r[m]) for r in mine
                                                         if _finite(r.get(m))]) else ""
                 for m in metrics]
        share = np.median([float(r.get("positive_share_q50") or "nan") for r in mine])
        sps = np.mean([float(r.get("seconds_per_step") or "nan") for r in mine])
        lines.append(f"| {loss} | {len(mine)} | " + " | ".join(cells)
                     + f" | {share:.3f} | {sps:.4f} |")
    lines += ["", "## Paired differences", "",
              f"Difference = first minus second, paired by seed; 95 % t interval. Pairs "
              f"for {int(POWER * 100)} % power: the pairs a two-sided paired t-test at 5 % "
              f"needs to detect a true difference as large as the margin, at this spread "
              f"(in brackets: at the spread's upper 95 % limit, as a pilot's spread is "
              f"itself uncertain).", "",
              "| comparison | metric | pairs | difference | 95 % interval | margin | pairs "
              f"for {int(POWER * 100)} % power | reading |", "|---|---|---|---|---|---|---|---|"]
    tested = []
    for subject, reference in pairs:
        for metric in metrics:
            diff, m = compared(subject, reference, metric)
            kind = classify(diff, m)
            lines.append(f"| {subject} − {reference} | {metric} | {diff.get('n', 0)} | "
                         f"{format_signed(diff.get('mean'))} | {format_interval(diff)} | "
                         f"{'' if m is None else f'{m:.4f}'} | {_power_cell(diff, m)} | "
                         f"{kind} |")
            if kind in ("better", "worse", "equivalent", "within noise"):
                tested.append((subject, reference, metric))
    if len(tested) > 1:
        strict = 1 - 0.05 / len(tested)
        surviving = []
        for subject, reference, metric in tested:
            diff = paired(rows, plan, subject, metric, confidence=strict, reference=reference)
            if not diff["within_noise"]:
                surviving.append(f"{subject} − {reference} {metric}")
        lines += ["", f"Multiple comparisons: {len(tested)} differences have an interval. "
                  f"With Bonferroni's correction (each at {strict:.4f} confidence) "
                  + (f"these stay outside noise: {', '.join(surviving)}." if surviving
                     else "none stays outside noise.")]
    elif not tested:
        lines += ["", f"No difference has an interval yet (each needs {MIN_PAIRS} finished "
                  f"pairs or more, with some spread)."]
    band_metrics = [m for m in recalls if any(f"{b}:{m}" in r for r in rows for b in BANDS)]
    if band_metrics:
        lines += ["", "## By popularity of the target", "",
                  "Head: the most popular items holding the first third of the training "
                  "interactions; torso: the next third; tail: the rest (cold items "
                  "included). The same paired differences over the test targets of each "
                  "band.", "", "| comparison | metric | " + " | ".join(
                      f"{b} (share)" for b in BANDS) + " |", "|---|---|" + "---|" * len(BANDS)]
        for subject, reference in pairs:
            for metric in band_metrics:
                cells = []
                for band in BANDS:
                    diff = paired(rows, plan, subject, f"{band}:{metric}", reference=reference)
                    shares = [float(r[f"{band}:share"]) for r in rows
                              if _finite(r.get(f"{band}:share"))]
                    share = f" ({np.mean(shares):.2f})" if shares else ""
                    cells.append(f"{format_signed(diff.get('mean'))} {format_interval(diff)}{share}"
                                 if diff.get("n") else "")
                lines.append(f"| {subject} − {reference} | {metric} | " + " | ".join(cells)
                             + " |")
    lines += ["", "## Verdicts", ""]
    for subject, reference in pairs:
        for metric in metrics:
            diff, m = compared(subject, reference, metric)
            shown = (f" {format_signed(diff['mean'])} {format_interval(diff)}"
                     if diff.get("n") else "")
            lines.append(f"- {subject} against {reference}, {metric}: {classify(diff, m)}"
                         f"{shown.rstrip()}.")
    lines += ["", "Charts: [paired differences](paired.png), "
              "[learning curves](learning_curves.png).", ""]
    return "\n".join(lines)


def write_charts(plan: Plan, rows: list[dict], curves: list[dict], output_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = metric_names(rows)
    pairs = comparisons(plan)
    # The main chart: every paired difference with its interval.
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.8 * len(pairs), 3.6), squeeze=False)
    for ax, (subject, reference) in zip(axes[0], pairs):
        for x, metric in enumerate(metrics):
            diff = paired(rows, plan, subject, metric, reference=reference)
            if diff.get("n", 0) == 0:
                continue
            half = diff.get("half_width")
            ax.errorbar([x], [diff["mean"]], yerr=None if half is None or math.isnan(half)
                        else [[half], [half]], fmt="o", capsize=4)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(metrics)), metrics, rotation=45, fontsize=8)
        ax.set_title(f"{form_of(subject)} − {form_of(reference)} (95 % interval)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, os.path.join(output_dir, "paired.png"))
    plt.close(fig)

    # Learning curves: every Recall@k, the mean over seeds with a band (min to max).
    shown = [m for m in metric_names(curves) if m.startswith("recall@")] or (
        ["validation_monitor"] if any("validation_monitor" in r for r in curves) else [])
    if not shown:
        shown = metrics[:1]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], shown):
        for loss in plan.losses:
            points: dict = {}
            for r in curves:
                if r["loss"] == loss and _finite(r.get(metric)):
                    points.setdefault(int(r["steps"]), []).append(float(r[metric]))
            if points:
                steps = sorted(points)
                mean = [np.mean(points[s]) for s in steps]
                line, = ax.plot(steps, mean, marker="o", label=loss)
                ax.fill_between(steps, [min(points[s]) for s in steps],
                                [max(points[s]) for s in steps], alpha=0.2,
                                color=line.get_color())
        ax.set_title(f"{'test ' if '@' in metric else ''}{metric} (band: seeds' range)",
                     fontsize=9)
        ax.set_xlabel("training steps")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, os.path.join(output_dir, "learning_curves.png"))
    plt.close(fig)


def write_report(plan: Plan, rows: list[dict], curves: list[dict], output_dir: str,
                 say: Callable[[str], None] = print, margin: Optional[Margin] = None) -> str:
    text = format_report(plan, rows, curves, margin)
    write_text(os.path.join(output_dir, "report.md"), text)
    write_charts(plan, rows, curves, output_dir)
    verdict_line = next((line for line in text.splitlines() if line.startswith("On this log")),
                        None)
    if verdict_line:
        say(f"compare: {verdict_line}")
    say(f"compare: report in {os.path.join(output_dir, 'report.md')}")
    return text


__all__ = ["DEFAULT_MARGIN", "Margin", "comparisons", "diverged_runs", "format_report",
           "paired", "sentence", "verdict", "write_charts", "write_report"]
