"""The report of `tfrs-logq compare`: paired differences against the baseline, with
intervals, the number of pairs a target interval needs, a multiple-comparison check,
the regime, a one-line verdict per metric, and two charts."""

from __future__ import annotations

import math
import os
from typing import Callable

import numpy as np

from tfrs_logq._util.atomic import save_figure, write_text
from tfrs_logq.stats import paired_difference, pairs_needed
from tfrs_logq.studies.compare import Plan, metric_names

TARGET_HALF_WIDTH = 0.003  # the half-width the ML-1M fixed-length pilot aimed at
SMALL_SHARE = 0.05  # below it, standard and corrected logQ are nearly the same loss


def paired(rows: list[dict], plan: Plan, loss: str, metric: str,
           confidence: float = 0.95) -> dict:
    """``loss - baseline`` of ``metric``, paired by seed (seeds both have)."""
    by = {(r["loss"], int(r["seed"])): float(r[metric]) for r in rows if metric in r}
    seeds = [s for s in plan.seeds if (loss, s) in by and (plan.baseline, s) in by]
    if not seeds:
        return {"n": 0}
    return paired_difference([by[(plan.baseline, s)] for s in seeds],
                             [by[(loss, s)] for s in seeds], confidence)


def verdict(diff: dict) -> str:
    if diff.get("n", 0) < 2 or diff.get("low") is None:
        return "not enough pairs (need 2 or more seeds)"
    if diff["within_noise"]:
        return "within noise"
    return "better" if diff["mean"] > 0 else "worse"


def _fmt(x, digits=4) -> str:
    return "" if x is None else f"{x:+.{digits}f}"


def _share_text(share: float) -> str:
    if share < SMALL_SHARE:
        return (f"small (median {share:.3f} < {SMALL_SHARE}): the positive's term is a "
                f"small part of the standard denominator and w = 1 - P is near 1, so the "
                f"standard and corrected losses nearly coincide; expect differences "
                f"within noise")
    return (f"large enough to matter (median {share:.3f}): the standard loss's positive "
            f"term is a visible part of its denominator, where the corrected loss can "
            f"differ from it")


def format_report(plan: Plan, rows: list[dict], curves: list[dict]) -> str:
    metrics = metric_names(rows)
    others = [loss for loss in plan.losses if loss != plan.baseline]
    comparisons = len(others) * len(metrics)
    strict = 1 - 0.05 / max(comparisons, 1)
    config = plan.config
    seeds_done = sorted({int(r["seed"]) for r in rows})
    lines = [
        "# Paired comparison", "",
        f"Source: {plan.source or '(not recorded)'}. Model: {plan.model}, "
        f"{config.steps:,} steps of {config.batch_size}, embedding {config.embedding_dim}, "
        f"history {config.history_length}, {config.optimizer}, learning rate "
        f"{config.learning_rate}. Test metrics: the mean of the last {plan.window} "
        f"evaluations (every {config.eval_every} steps). Seeds: "
        f"{', '.join(map(str, seeds_done))} (common random numbers: a seed's runs share "
        f"batches, initial weights and negatives). Machine: "
        f"{rows[0].get('machine', '?')}.", "",
        "## Means over seeds", "",
        "| loss | runs | " + " | ".join(metrics) + " | positive share (median) | s/step |",
        "|---|---|" + "---|" * len(metrics) + "---|---|",
    ]
    for loss in plan.losses:
        mine = [r for r in rows if r["loss"] == loss]
        if not mine:
            continue
        cells = [f"{np.mean([float(r[m]) for r in mine]):.4f}" for m in metrics]
        share = np.median([float(r.get("positive_share_q50", "nan") or "nan") for r in mine])
        sps = np.mean([float(r.get("seconds_per_step") or "nan") for r in mine])
        lines.append(f"| {loss} | {len(mine)} | " + " | ".join(cells)
                     + f" | {share:.3f} | {sps:.4f} |")
    lines += ["", f"## Against the baseline ({plan.baseline}), paired by seed", "",
              "Difference = loss minus baseline; 95 % t interval over the seeds; "
              f"\"pairs for ±{TARGET_HALF_WIDTH}\": the pairs a 95 % interval of half-width "
              f"{TARGET_HALF_WIDTH} would need at this spread.", "",
              "| loss | metric | pairs | difference | 95 % interval | pairs for "
              f"±{TARGET_HALF_WIDTH} | verdict |", "|---|---|---|---|---|---|---|"]
    surviving = []
    for loss in others:
        for metric in metrics:
            diff = paired(rows, plan, loss, metric)
            need = (pairs_needed(diff["sd"], TARGET_HALF_WIDTH) if diff.get("sd") is not None
                    else "")
            interval = (f"[{_fmt(diff['low'])}, {_fmt(diff['high'])}]"
                        if diff.get("low") is not None else "")
            lines.append(f"| {loss} | {metric} | {diff.get('n', 0)} | "
                         f"{_fmt(diff.get('mean'))} | {interval} | {need} | "
                         f"{verdict(diff)} |")
            strict_diff = paired(rows, plan, loss, metric, confidence=strict)
            if strict_diff.get("low") is not None and not strict_diff["within_noise"]:
                surviving.append(f"{loss} {metric}")
    if comparisons > 1:
        lines += ["", f"Multiple comparisons: {comparisons} differences are reported. With "
                  f"Bonferroni's correction (each at {strict:.4f} confidence) "
                  + (f"these stay outside noise: {', '.join(surviving)}." if surviving
                     else "none stays outside noise.")]
    lines += ["", "## Verdicts", ""]
    for loss in others:
        for metric in metrics:
            lines.append(f"- {loss} against {plan.baseline}, {metric}: "
                         f"{verdict(paired(rows, plan, loss, metric))}.")
    base_rows = [r for r in rows if r["loss"] == plan.baseline and r.get("positive_share_q50")]
    if base_rows:
        share = float(np.median([float(r["positive_share_q50"]) for r in base_rows]))
        lines += ["", "## The regime", "",
                  f"The trained baseline's positive share of the standard denominator, "
                  f"(P/Q) / (P/Q + n) over the test targets, is {_share_text(share)}."]
    lines += ["", "Charts: [learning curves](learning_curves.png), "
              "[paired differences](paired.png).", ""]
    return "\n".join(lines)


def write_charts(plan: Plan, rows: list[dict], curves: list[dict], output_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = metric_names(rows)
    # SASRec's curves are its validation metric per epoch (test only over the window).
    shown = metric_names(curves)[:4] or (["validation_monitor"] if any(
        "validation_monitor" in r for r in curves) else metrics[:1])
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], shown):
        for loss in plan.losses:
            points: dict = {}
            for r in curves:
                if r["loss"] == loss and r.get(metric) not in (None, ""):
                    points.setdefault(int(r["steps"]), []).append(float(r[metric]))
            if points:
                steps = sorted(points)
                ax.plot(steps, [np.mean(points[s]) for s in steps], marker="o", label=loss)
        ax.set_title(f"{'test ' if '@' in metric else ''}{metric} (mean over seeds)")
        ax.set_xlabel("training steps")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, os.path.join(output_dir, "learning_curves.png"))
    plt.close(fig)

    others = [loss for loss in plan.losses if loss != plan.baseline]
    fig, axes = plt.subplots(1, len(others), figsize=(4.5 * len(others), 3.4), squeeze=False)
    for ax, loss in zip(axes[0], others):
        for x, metric in enumerate(metrics):
            diff = paired(rows, plan, loss, metric)
            if diff.get("n", 0) == 0:
                continue
            half = diff.get("half_width")
            ax.errorbar([x], [diff["mean"]], yerr=None if half is None or math.isnan(half)
                        else [[half], [half]], fmt="o", capsize=4)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(metrics)), metrics, rotation=45, fontsize=8)
        ax.set_title(f"{loss} − {plan.baseline} (95 % interval)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, os.path.join(output_dir, "paired.png"))
    plt.close(fig)


def write_report(plan: Plan, rows: list[dict], curves: list[dict], output_dir: str,
                 say: Callable[[str], None] = print) -> str:
    text = format_report(plan, rows, curves)
    write_text(os.path.join(output_dir, "report.md"), text)
    write_charts(plan, rows, curves, output_dir)
    verdicts = [line[2:] for line in text.splitlines() if line.startswith("- ")
                and " against " in line]
    for line in verdicts:
        say(f"compare: {line}")
    say(f"compare: report in {os.path.join(output_dir, 'report.md')}")
    return text


__all__ = ["TARGET_HALF_WIDTH", "format_report", "paired", "verdict", "write_charts",
           "write_report"]
