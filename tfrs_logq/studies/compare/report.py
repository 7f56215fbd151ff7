"""The report of `tfrs-logq compare`: the answer first, then the evidence.

- **The verdict**, at most three sentences on one primary comparison named before the
  runs (`primary_comparison`: the corrected loss against the loss the user runs now,
  TFRS's logQ by default, at one metric, Recall@100 by default): its 95 % interval over
  seeds and test users where the runs saved their hits per user (`interval`; the seeds
  alone otherwise), the decision (switch, keep, no difference larger than the margin, or
  how many more seeds or test users), and what it rests on (the interval, the seeds,
  divergence with an exact interval, a trade-off across k that survives Holm's
  correction).
- **One multiplicity rule**: the primary comparison at 5 %, every other difference of
  the table under Holm's correction, the popularity bands exploratory.
- **The run facts**: test targets and users, the share of repeat and cold targets,
  duplicates dropped, diverged runs (left out of the pairs, and named), runs of the plan
  still missing, the trained baseline's positive share.
- The table of every metric; every paired difference with its p-value and the pairs for
  80 % power to detect a difference of the margin and to read a true 0 as no difference;
  each seed's difference at the primary metric with an outlier flag; the differences by
  popularity band of the target with a tail - head contrast; the charts.

`write_report` writes ``report.md``, ``paired.png`` and ``learning_curves.png``, all
made before any is written; it is a function of ``results.csv``, ``curves.csv``, the
runs' hits per test user (``hits/``) and the plan alone (``tfrs-logq compare
--report-only`` rebuilds them), so a reader can check a report by hand.
"""

from __future__ import annotations

import math
import os
import re
from typing import Callable, Optional

import numpy as np

from tfrs_logq._util.atomic import write_bytes, write_text
from tfrs_logq.corrections import parse_loss_name
from tfrs_logq.metrics import BANDS
from tfrs_logq.studies._grid import read_rows
from tfrs_logq.studies.compare.plan import (
    CompareError,
    Plan,
    ReportError,
    _tables,
    check_results,
    load_plan,
    metric_names,
    missing_runs,
    plan_runs,
)
from tfrs_logq.studies.compare.runner import (
    hits_path,
    load_hits,
    load_served,
    load_timings,
    time_words,
)
from tfrs_logq.studies.compare.stats import (
    MIN_PAIRS,
    ZERO_SPREAD_RTOL,
    classify,
    divergence_rate,
    finite_float,
    format_interval,
    format_signed,
    holm,
    paired_by_seed,
    paired_t_p_value,
    pairs_for_equivalence,
    pairs_for_power,
    sd_upper_limit,
    seed_outliers,
    seed_user_difference,
    seeds_and_users_for,
    values_by_seed,
)

DEFAULT_MARGIN = "0.002"
"""Absolute, below the smallest differences outside noise in results/README.md, so "no
difference larger than the margin" rules out effects of that size; docs/compare.md says
why not 2 %."""
DEFAULT_PRIMARY_METRIC = "recall@100"
DEFAULT_PRIMARY_BASELINE = "logq-tfrs"
POWER = 0.8
NARROW_SHARE = 1.959964 / (1.959964 + 1.281552)
"""The half-width, as a share of the margin, at which a true 0 reads as no difference
larger than the margin 80 % of the time (normal approximation: ``margin - h`` must exceed
``z_0.9 se``, ``h = z_0.975 se``): the interval over seeds and test users aims at it."""
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
    """An equivalence margin: ``"0.002"`` (absolute) or ``"2%"`` (of the reference's
    value); 0 or below, or a non-number, is refused in one line."""

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
    return parse_loss_name(loss, None).correction or loss


def describe(loss: str) -> str:
    words = FORM_WORDS.get(form_of(loss))
    return f"{words} ({loss})" if words else loss


def _check_rows(rows: list[dict]) -> None:
    for number, row in enumerate(rows, 2):  # line 1 of results.csv is its header
        seed = str(row.get("seed", "")).strip()
        if not row.get("loss") or not re.fullmatch(r"-?[0-9]+", seed):
            raise ReportError(f"results.csv line {number} has no loss or no integer seed "
                              f"(loss {row.get('loss')!r}, seed {row.get('seed')!r}): remove "
                              f"the line, then rebuild with `tfrs-logq compare --report-only`.")


def _recorded(rows: list[dict], metric: str) -> bool:
    return any(metric in r for r in rows)


def primary_comparison(plan: Plan, rows: list[dict], primary_metric: Optional[str] = None,
                       primary_baseline: Optional[str] = None) -> dict:
    """The one comparison the verdict answers: ``subject`` (the corrected loss, of the
    reference's negatives where the plan has several) against ``reference`` (the loss
    the user runs now: a loss of the plan or its form, `DEFAULT_PRIMARY_BASELINE` by
    default) at ``metric`` (`DEFAULT_PRIMARY_METRIC` by default), with ``notes`` on a
    default that did not apply.

    Raises:
      ReportError: a named metric the comparison did not record, or a named baseline
        that is not one of its losses.
    """
    notes = []
    recalls = [m for m in metric_names(rows) if m.startswith("recall@")]
    if primary_metric is not None:
        metric = str(primary_metric).strip().lower()
        metric = f"recall@{metric}" if metric.isdigit() else metric
        if not _recorded(rows, metric):
            raise ReportError(
                f"the primary metric {primary_metric!r} was not recorded by this comparison "
                f"(recorded: {', '.join(metric_names(rows)) or 'none'}): pass "
                f"--primary-metric one of them.")
    elif _recorded(rows, DEFAULT_PRIMARY_METRIC) or not recalls:
        metric = DEFAULT_PRIMARY_METRIC
    else:
        metric = min(recalls, key=lambda m: abs(math.log(int(m.split("@")[1]) / 100)))
        notes.append(f"{DEFAULT_PRIMARY_METRIC} was not recorded; the primary metric is "
                     f"{metric}, the nearest k")
    wanted = primary_baseline or DEFAULT_PRIMARY_BASELINE
    candidates = [x for x in plan.losses if wanted in (x, form_of(x))]
    if candidates:
        reference = candidates[0]
    elif primary_baseline:
        raise ReportError(f"the primary baseline {primary_baseline!r} is not a loss of this "
                          f"comparison ({', '.join(plan.losses)}): pass --primary-baseline "
                          f"one of them.")
    else:
        reference = plan.baseline
        notes.append(f"{describe(DEFAULT_PRIMARY_BASELINE)} was not compared; the primary "
                     f"baseline is the plan's, {reference}")
    corrected = [x for x in plan.losses if form_of(x) == "corrected" and x != reference]
    negatives = parse_loss_name(reference, None).negatives
    same_negatives = [x for x in corrected if parse_loss_name(x, None).negatives == negatives]
    others = [x for x in plan.losses if x != reference]
    subject = (same_negatives or corrected or others)[0]
    return {"subject": subject, "reference": reference, "metric": metric, "notes": notes}


def _decide(diff: dict, margin: Optional[float]) -> tuple[str, str]:
    """The decision on the primary comparison and why, in words."""
    n = diff.get("n", 0)
    if n >= 2 and diff.get("zero_spread"):
        return "no decision from seeds", diff.get("zero_words") or (
            f"every pair differs by exactly {diff['mean']:+.4f}: the runs do not vary with "
            f"the seed, so more seeds cannot test it")
    if n < MIN_PAIRS:
        more = MIN_PAIRS - n
        need = _pairs_needed(diff, margin)
        if need is not None:
            more = max(more, need - n)
        return (f"not enough seeds: run {more} more", f"an interval needs {MIN_PAIRS} "
                f"finished pairs" + (f"; {need} give 80 % power at this spread"
                                     if need else ""))
    inside = margin is not None and -margin < diff["low"] and diff["high"] < margin
    if inside:
        real = ("" if diff["within_noise"] else
                f"; the {'gain' if diff['mean'] > 0 else 'loss'} is outside noise but smaller "
                f"than the margin")
        return (f"no difference larger than {margin:.4f}", f"the 95 % interval lies inside "
                f"±{margin:.4f}{real}")
    if not diff["within_noise"]:
        if diff["mean"] > 0:
            return "switch", "the gain's interval excludes 0, at the 5 % level"
        return "keep", "the loss's interval excludes 0, at the 5 % level"
    if margin is None:
        return ("not enough seeds", "the interval holds 0, and no relative margin applies "
                "to a reference of 0: give --margin as an absolute difference")
    if "user_variance" in diff:
        return _more_seeds_or_users(diff, margin)
    need = _pairs_needed(diff, margin)
    if need is None:
        return ("not enough seeds: more than 10,000 pairs", f"at this spread no feasible "
                f"number of seeds resolves ±{margin:.4f}: widen --margin")
    return (f"not enough seeds: run {max(need - diff['n'], 1)} more",
            f"the interval holds 0 and reaches past ±{margin:.4f}; {need} pairs give 80 % "
            f"power both to detect a difference of {margin:.4f} and to read a true 0 as no "
            f"difference larger than it, at this spread")


def _more_seeds_or_users(diff: dict, margin: float) -> tuple[str, str]:
    """The decision when an interval over seeds and test users holds 0 and reaches past
    the margin: the seeds (at these test users) or the test users (at these seeds) that
    narrow it to `NARROW_SHARE` of the margin."""
    target = NARROW_SHARE * margin
    need = seeds_and_users_for(diff, target)
    n, users = diff["n"], diff["users"]
    aim = (f"an interval of ±{target:.4f}, 80 % power to read a true 0 as no difference "
           f"larger than ±{margin:.4f}")
    if need["seeds"] is not None:
        alt = (f", or about {need['users']:,} test users at these {n} seeds"
               if need["users"] else "")
        return (f"not enough seeds: run {max(need['seeds'] - n, 1)} more",
                f"the interval holds 0 and reaches past ±{margin:.4f}; {need['seeds']} seeds "
                f"at these {users:,} test users{alt} give {aim}")
    if need["users"] is not None:
        return (f"not enough test users: about {need['users']:,} (now {users:,})",
                f"the interval holds 0 and reaches past ±{margin:.4f}, and its test users' "
                f"part alone (±{need['user_part']:.4f}) keeps it wider than ±{target:.4f} at "
                f"any number of seeds: {need['users']:,} test users at these {n} seeds give "
                f"{aim}")
    return ("not enough seeds or test users", f"the interval holds 0 and reaches past "
            f"±{margin:.4f}, and no feasible number of seeds or test users narrows it to "
            f"±{target:.4f}: widen --margin")


def _pairs_needed(diff: dict, margin: Optional[float]) -> Optional[int]:
    """Pairs for 80 % power on both questions (a difference of the margin; a true 0 read
    as no difference larger than it) at the observed spread; None without one (for an
    interval over seeds and test users: the seeds that narrow it to `NARROW_SHARE` of the
    margin at these test users)."""
    if diff.get("sd") is None or margin is None or diff.get("zero_spread"):
        return None
    if "user_variance" in diff:
        return seeds_and_users_for(diff, NARROW_SHARE * margin)["seeds"]
    found = [pairs_for_power(margin, diff["sd"], POWER),
             pairs_for_equivalence(margin, diff["sd"], POWER)]
    return None if None in found else max(found)


def _divergence(rows: list[dict], loss: str, diverged: list[tuple]) -> dict:
    runs = len({int(r["seed"]) for r in rows if r["loss"] == loss})
    bad = len({seed for name, seed in diverged if name == loss})
    return divergence_rate(bad, runs) if runs else {"diverged": 0, "runs": 0}


def _rate_words(loss: str, d: dict) -> str:
    return (f"{form_of(loss)} diverged in {d['diverged']} of {d['runs']} seeds "
            f"({100 * d['rate']:.0f} %, exact 95 % interval {100 * d['low']:.0f}-"
            f"{100 * d['high']:.0f} %)")


def _name(metric: str) -> str:
    return metric.replace("recall@", "Recall@").replace("ndcg@", "NDCG@")


def verdict_paragraph(plan: Plan, rows: list[dict], primary: dict, margin: Margin,
                      secondary: dict, hits: Optional[dict] = None) -> str:
    """The report's first paragraph, three sentences at most: the primary comparison's
    answer, the decision, and what it rests on (the interval: over seeds and test users
    where the runs saved their hits per user, else over the seeds; divergence; the
    trade-off across k that Holm's correction supports)."""
    subject, reference, metric = primary["subject"], primary["reference"], primary["metric"]
    diff = interval(rows, plan, subject, metric, reference, hits)
    m = margin.of(diff.get("reference_mean", float("nan")))
    n = diff.get("n", 0)
    users = diff.get("users")
    what = (f"Primary comparison, {describe(subject)} against {describe(reference)} at "
            f"{_name(metric)}: ")
    if n == 0:
        what += "no finished pair"
    elif diff.get("half_width") is None or n < MIN_PAIRS:
        what += (f"{diff['mean']:+.4f} over {n} pair{'s' if n > 1 else ''}, a direction, "
                 f"not a verdict")
    elif diff.get("zero_spread"):
        what += f"{diff['mean']:+.4f} in every one of {n} pairs, no interval"
    elif users:
        p = paired_t_p_value(diff)
        alone = format_interval(diff["seed_only"]) or "none, every pair differs alike"
        alone = "" if alone == format_interval(diff) else f" (seeds alone: {alone})"
        what += (f"{diff['mean']:+.4f}, 95 % interval {format_interval(diff)} over seeds and "
                 f"test users{alone}, p = {p:.3g} over {n} seeds and {users:,} test users")
    else:
        p = paired_t_p_value(diff)
        what += (f"{diff['mean']:+.4f}, 95 % interval {format_interval(diff)}, p = "
                 f"{p:.3g} over {n} seeds")
    decision, why = _decide(diff, m)
    diverged = diverged_runs(rows)
    div_s, div_r = (_divergence(rows, x, diverged) for x in (subject, reference))
    if div_s.get("diverged") and div_s["rate"] > div_r.get("rate", 0.0) \
            and decision != "keep":
        decision, why = "keep", (f"{form_of(subject)} diverged where "
                                 f"{form_of(reference)} did not")
    basis = (f"the 95 % interval over seeds and test users (it counts the noise of drawing "
             f"{users:,} test users, not only the seeds')" if users else
             "the 95 % interval over the seeds alone (" + (
                 "no hits per user saved: the test users' noise is not counted)"
                 if not _has_hits(hits, plan, subject, reference) else
                 "the test users held fixed)"))
    rests = [basis, f"{n} paired seed{'' if n == 1 else 's'} of {_steps_words(plan, rows)}, "
             f"a margin "
             + ("(none: a relative margin of a reference of 0)" if m is None else
                f"of ±{m:.4f}" + (f" ({margin.describe()})" if margin.relative else ""))]
    for loss, d in ((subject, div_s), (reference, div_r)):
        if d.get("diverged"):
            rests.append(_rate_words(loss, d))
    if not (div_s.get("diverged") or div_r.get("diverged")) and div_s.get("runs"):
        rests.append(f"no run of either diverged ({div_s['runs']} and {div_r['runs']} "
                     f"seeds; exact 95 % upper limit {100 * div_s['high']:.0f} %)")
    across = [(k, s) for (sub, ref, k), s in secondary.items()
              if (sub, ref) == (subject, reference) and k.startswith("recall@") and s]
    gains = [_name(k) for k, s in across if s == "better"]
    losses = [_name(k) for k, s in across if s == "worse"]
    primary_sign = "better" if decision == "switch" else "worse" if decision == "keep" else ""
    if gains and losses or (primary_sign == "better" and losses) or (
            primary_sign == "worse" and gains):
        rests.append("a trade-off across k: " + "; ".join(
            x for x in (f"it gains at {', '.join(gains)}" if gains else "",
                        f"it loses at {', '.join(losses)}" if losses else "") if x)
            + " (Holm, 5 %)")
    elif gains or losses:
        rests.append(f"at other k it {'gains' if gains else 'loses'} at "
                     f"{', '.join(gains or losses)} (Holm, 5 %)")
    return (f"{what}. Decision: {decision} ({why}). It rests on " + "; ".join(rests) + ".")


def _index_words(record: dict, k: int) -> str:
    """The served index and what a search for ``k`` items uses, in words."""
    kind, p = record.get("kind"), record.get("parameters") or {}
    used = (record.get("settings") or {}).get(str(k)) or {}
    if kind == "faiss":
        return (f"faiss {p.get('type', 'IVF')} ({p.get('nlist')} lists, nprobe "
                f"{used.get('nprobe', p.get('nprobe'))} for k = {k})")
    if kind == "scann":
        tree = (f"{p.get('num_leaves')} leaves, {used.get('leaves')} searched" if p.get("tree")
                else "no tree")
        return f"ScaNN ({tree}, {used.get('reorder_factor')} x k reordered for k = {k})"
    return str(kind)


def served_sentence(served: Optional[dict], primary: dict) -> str:
    """One sentence on how far a served figure can move from this report's exact one: the
    index ``tfrs-logq export --index auto`` builds (``served_index.json``:
    `tfrs_logq.studies.compare.runner.load_served`) and the share of the exact top-k it finds for
    the primary comparison's losses, at the primary metric's k where it was measured (else
    the largest k measured); empty without a record."""
    records = {loss: r for loss, r in ((served or {}).get("losses") or {}).items()
               if r.get("recall")}
    if not records:
        return ""
    chosen = [x for x in (primary["subject"], primary["reference"]) if x in records] \
        or sorted(records)
    want = primary["metric"].split("@")[1] if "@" in primary["metric"] else None
    ks = {k for x in chosen for k in records[x]["recall"]}
    k = int(want) if want in ks else max(int(k) for k in ks)
    found = {x: float(records[x]["recall"][str(k)]) for x in chosen
             if str(k) in records[x]["recall"]}
    first = records[chosen[0]]
    seed = first.get("seed")
    export = f"`tfrs-logq export --index {first.get('index') or 'auto'}`"
    if first.get("kind") == "brute-force":
        return (f"Served: {export} builds no approximate index here, so brute force serves "
                f"the exact top-k this report measures.")
    shares = " and ".join(f"{v:.3f} for {x}" for x, v in found.items())
    worst = min(found.values())
    move = ("so a served Recall@k should match this report's exact figure"
            if worst >= 0.9995 else
            f"so a served Recall@{k} can sit up to about {100 * (1 - worst):.1f} % below "
            f"this report's exact figure")
    refused = [x for x in chosen if records[x].get("reached") is False]
    target = first.get("target_recall")
    short = (f"; its tuning missed the export's --target-recall {target:g} (export "
             + ("refuses such a faiss index" if first.get("kind") == "faiss" else "warns of it")
             + ")" if refused and target is not None else "")
    return (f"Served: {export} would serve "
            f"{_index_words(first, k)}, whose top-{k} holds {shares} of the exact top-{k} "
            f"(raw top-k overlap, history not left out; final model at seed {seed}), {move}"
            f"{short}.")


def _power_cells(diff: dict, margin: Optional[float]) -> tuple[str, str]:
    """Pairs for 80 % power to detect a difference of the margin, and to read a true 0 as
    no difference larger than it; each at the spread and (in brackets) at its upper 95 %
    limit."""
    if diff.get("sd") is None or margin is None or diff.get("zero_spread"):
        return "", ""
    if "user_variance" in diff:  # seeds at these test users, else the test users
        def cell(share: float) -> str:
            need = seeds_and_users_for(diff, share * margin)
            if need["seeds"] is not None:
                return str(need["seeds"])
            return (f"none: {need['users']:,} test users" if need["users"] is not None
                    else "none")

        return (cell(1.959964 / (1.959964 + 0.841621)), cell(NARROW_SHARE))
    upper = sd_upper_limit(diff["sd"], diff["n"])
    show = (lambda n: "> 10,000" if n is None else str(n))
    return (f"{show(pairs_for_power(margin, diff['sd'], POWER))} "
            f"({show(pairs_for_power(margin, upper, POWER))})",
            f"{show(pairs_for_equivalence(margin, diff['sd'], POWER))} "
            f"({show(pairs_for_equivalence(margin, upper, POWER))})")


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
    seeds both have finished without diverging
    (`tfrs_logq.studies.compare.stats.paired_by_seed`, in the plan's order of seeds)."""
    reference = reference or plan.baseline
    bad = set(diverged_runs(rows))

    def healthy(name):
        # A non-finite value of a healthy run (a popularity band with no target) pairs nothing.
        return {s: v for s, v in values_by_seed(rows, metric, loss=name).items()
                if (name, s) not in bad}

    return paired_by_seed(healthy(loss), healthy(reference), confidence, seeds=plan.seeds)


def run_hits(output_dir: str, rows: list[dict]) -> dict:
    """``{(loss, seed): hits}`` of the finished runs of ``rows`` that saved their hits per
    test user (`tfrs_logq.studies.compare.runner.save_hits`); a run finished before compare saved
    them has none."""

    out = {}
    for row in rows:
        key = (row["loss"], int(row["seed"]))
        found = load_hits(hits_path(output_dir, *key))
        if found is not None:
            out[key] = found
    return out


def _hit_arrays(hits: Optional[dict], subject: str, reference: str, metric: str,
                seeds) -> Optional[tuple]:
    """``(subject, reference)`` `[seeds, users]` values per test user at ``metric`` (hits,
    or DCG gains for NDCG, over the mean targets per user: their mean over users is the
    metric), over the ``seeds`` whose runs of both saved them for the same users; None
    without any (or for a popularity band's metric)."""
    match = re.fullmatch(r"(recall|ndcg)@([0-9]+)", metric)
    if not hits or not match:
        return None
    field = f"{'hits' if match.group(1) == 'recall' else 'gain'}@{match.group(2)}"
    subject_rows, reference_rows, users, targets = [], [], None, None
    for seed in seeds:
        a, b = hits.get((reference, seed)), hits.get((subject, seed))
        if a is None or b is None or field not in a or field not in b:
            continue
        if users is None:
            users, targets = a["users"], a["targets"]
        if all(np.array_equal(x["users"], users) and np.array_equal(x["targets"], targets)
               for x in (a, b)):
            subject_rows.append(b[field])
            reference_rows.append(a[field])
    if not subject_rows or len(users) < 2:
        return None
    scale = float(np.mean(targets))
    return (np.asarray(subject_rows, float) / scale, np.asarray(reference_rows, float) / scale)


def _has_hits(hits: Optional[dict], plan: Plan, subject: str, reference: str) -> bool:
    return bool(hits) and any((loss, seed) in hits for loss in (subject, reference)
                              for seed in plan.seeds)


def interval(rows: list[dict], plan: Plan, subject: str, metric: str, reference: str,
             hits: Optional[dict] = None) -> dict:
    """``subject - reference`` at ``metric`` with the interval the report reads: over seeds
    *and* test users (`tfrs_logq.studies.compare.stats.seed_user_difference`: the seeds'
    differences of results.csv, the users' part from the hits per user at the last evaluation) where
    both losses' runs saved their hits, else `paired`'s over the seeds alone. The first
    also holds ``seed_only`` (`paired`'s), ``seeds``, ``differences``, ``reference_mean``;
    either holds ``zero_words``: what identical differences mean here."""
    diff = paired(rows, plan, subject, metric, reference=reference)
    arrays = (_hit_arrays(hits, subject, reference, metric, diff["seeds"])
              if diff.get("n", 0) >= 2 else None)
    if arrays is not None:
        both = seed_user_difference(diff["differences"], *arrays)
        both.update(seeds=diff["seeds"], differences=diff["differences"],
                    reference_mean=diff["reference_mean"], seed_only=diff,
                    hit_seeds=len(arrays[0]))
        diff = both
    if diff.get("zero_spread"):
        diff["zero_words"] = _zero_words(rows, subject, metric, diff, arrays)
    return diff


def _zero_words(rows: list[dict], subject: str, metric: str, diff: dict,
                arrays: Optional[tuple]) -> str:
    """Why every pair differs alike: runs that do not vary with the seed, losses that hit
    the same test targets, or losses whose results move together."""
    values = values_by_seed(rows, metric, loss=subject)
    mine = [values[s] for s in diff["seeds"] if s in values]
    scale = max([abs(v) for v in mine] + [abs(diff["mean"]), 1e-300])
    vary = len(mine) > 1 and float(np.ptp(mine)) > ZERO_SPREAD_RTOL * scale
    mean = diff["mean"]
    if abs(mean) <= ZERO_SPREAD_RTOL * scale and (vary or arrays is not None):
        if arrays is not None and np.array_equal(*arrays):
            return ("the losses hit the same test targets in every seed: their difference "
                    "is 0 in each pair, for every test user, so no number of seeds or test "
                    "users tells them apart here")
        return ("the losses score the same in every seed while the seed moves both: their "
                "difference is 0 in each pair, so more seeds cannot tell them apart")
    if vary:
        return (f"the runs vary with the seed but every pair differs by exactly {mean:+.4f}: "
                f"the losses move together, so the seeds give no spread to test it")
    return (f"every pair differs by exactly {mean:+.4f}: the runs do not vary with the seed, "
            f"so more seeds cannot test it")


def _common(values: list) -> Optional[str]:
    values = [str(v).strip() for v in values if str(v).strip() not in ("", "None")]
    return max(set(values), key=values.count) if values else None


def _steps_words(plan: Plan, rows: list[dict]) -> str:
    """The steps each run trained, as results.csv records them (SASRec's epochs stop at a
    pass over the training users, so they may be fewer than the plan's)."""
    steps = _common([r.get("steps", "") for r in rows])
    try:
        return f"{int(float(steps)):,} steps" if steps else f"{plan.config.steps:,} steps"
    except ValueError:
        return f"{plan.config.steps:,} steps"


def _evaluation_words(plan: Plan, rows: list[dict], curves: list[dict]) -> str:
    """Which evaluations a run's test metrics average: the steps of its window, among
    those evaluated (from results.csv and curves.csv; the plan's when they hold none)."""
    window = _common([r.get("window_steps", "") for r in rows])
    window = [int(x) for x in window.split()] if window else list(
        plan.config.eval_steps[-plan.window:])
    done = {(r["loss"], str(r["seed"])) for r in rows}
    tested = [r for r in curves if (r.get("loss"), str(r.get("seed"))) in done]
    if plan.model == "sasrec":
        evaluated = sorted({int(r["steps"]) for r in tested}) or window
        plural = "s" if len(window) > 1 else ""
        return (f"Test metrics: the mean of the test evaluations at step{plural} "
                f"{', '.join(map(str, window))} (the test users scored after each of the last "
                f"{len(window)} epoch{plural}; the validation users after every epoch, at "
                f"steps {', '.join(map(str, evaluated))})")
    evaluated = sorted({int(r["steps"]) for r in tested if any(
        k.startswith("recall@") for k in r)}) or list(plan.config.eval_steps)
    if len(evaluated) == 1 and len(window) == 1:
        return f"Test metrics: the evaluation at step {window[0]:,}, the only one"
    shown = ', '.join(f'{w:,}' for w in window)
    return ((f"Test metrics: the mean of the evaluations at steps {shown}" if len(window) > 1
             else f"Test metrics: the evaluation at step {shown}")
            + f" (of those at steps {', '.join(f'{e:,}' for e in evaluated)})")


def _model_words(plan: Plan, rows: list[dict]) -> str:
    """The model and its training, in the plan's own terms."""
    config = plan.config
    if plan.model == "sasrec":
        sasrec = plan.sasrec_config(plan.losses[0], plan.seeds[0])
        return (f"Model: SASRec (preset {plan.sasrec_preset}), {_steps_words(plan, rows)} in "
                f"{sasrec.max_epochs} epochs of at most {sasrec.steps_per_epoch} steps (an "
                f"epoch is at most one pass over the training users) of "
                f"{sasrec.batch_size} users, embedding {sasrec.embedding_dim}, history "
                f"{sasrec.max_length}, {sasrec.num_blocks} blocks, dropout {sasrec.dropout}, "
                f"Adam, learning rate {sasrec.learning_rate}")
    return (f"Model: {plan.model}, {_steps_words(plan, rows)} of {config.batch_size}, "
            f"embedding {config.embedding_dim}, history {config.history_length}, "
            f"{config.optimizer}, learning rate {config.learning_rate}")


def _time_sentence(timings: Optional[list]) -> str:
    """" Time: ..." of the processes that trained the runs (`timings.json`), or ""."""
    totals: dict = {}
    wall = 0.0
    for entry in timings or []:
        try:
            wall += float(entry["wall_seconds"])
            for name, seconds in entry["seconds"].items():
                totals[name] = totals.get(name, 0.0) + float(seconds)
        except (KeyError, TypeError, ValueError, AttributeError):
            return ""  # a damaged timings.json costs the sentence alone
    if wall <= 0:
        return ""
    processes = len(timings)
    return (f" Time: {time_words(totals, wall)}"
            + (f" ({processes} processes or reruns)" if processes > 1 else "") + ".")


def check_curves(curves: list[dict], path: str = "curves.csv") -> None:
    """Refuses, in one line naming ``path``, the line and the fix, a damaged curves table
    (a row with more or fewer cells than the header, no loss, a seed or step that is not
    an integer, a metric that is not a number), before anything of the report is
    written."""
    fix = (f"restore {path} (or delete that line), then rebuild with `tfrs-logq compare "
           f"--report-only`")
    for number, row in enumerate(curves, 2):  # line 1 is the header
        where = f"{path} line {number}"
        if None in row or any(value is None for value in row.values()):
            raise ReportError(f"{where} has {'more' if None in row else 'fewer'} cells than "
                              f"the header (a damaged row): {fix}.")
        for name in ("seed", "steps"):
            if not re.fullmatch(r"[0-9]+", str(row.get(name, "")).strip()):
                raise ReportError(f"{where}: {name} is {str(row.get(name))[:20]!r}, not an "
                                  f"integer: {fix}.")
        if not str(row.get("loss", "")).strip():
            raise ReportError(f"{where} has no loss: {fix}.")
        for name, text in row.items():
            if name.split(":", 1)[-1].startswith(("recall@", "ndcg@")) \
                    or name == "validation_monitor":
                if str(text).strip() == "":
                    continue
                try:
                    float(text)
                except ValueError:
                    raise ReportError(f"{where}: {name} is {str(text)[:20]!r}, not a number: "
                                      f"{fix}.") from None


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
        why = diff.get("zero_words") or (f"every pair differs by exactly {mean:+.4f}: the "
                                         f"runs do not vary with the seed")
        return (f"{s} against {r}, {name}: {why}; zero spread gives no interval, not a "
                f"significant difference")
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
            f"and does not predict the verdict (results/README.md lists differences outside "
            f"noise and inside noise at the same shares).")
    return lines


def _missing_runs(plan: Plan, rows: list[dict]) -> list[str]:
    have = {(r["loss"], int(r["seed"])) for r in rows}
    out = []
    for loss in plan.losses:
        absent = [s for s in plan.seeds if (loss, s) not in have]
        if absent:
            out.append(f"{loss} seed{'s' if len(absent) > 1 else ''} "
                       f"{', '.join(map(str, absent))}")
    return out


def _tested(diff: dict) -> bool:
    return diff.get("n", 0) >= MIN_PAIRS and not diff.get("zero_spread")


def _intervals_words(plan: Plan, rows: list[dict], hits: Optional[dict],
                     primary: tuple) -> str:
    """What the intervals are over, which runs saved hits per user, and for the primary
    comparison the seeds and test users a narrower interval needs."""
    finished = {(r["loss"], int(r["seed"])) for r in rows}
    saved = len(finished & set(hits or {}))
    if not saved:
        return ("Intervals: paired 95 % t over the seeds, the test users held fixed. Hits "
                "per user: none saved (these runs finished before compare saved them), so "
                "no interval counts the noise of drawing the test users; a comparison run "
                "into a new --output-dir saves them.")
    text = ("Intervals: 95 %, over seeds and test users where both losses' runs saved their "
            "hits per test user (the spread of each pair's reported difference over the "
            "seeds, plus the spread of drawing the test users, from their hits at the last "
            "evaluation: `tfrs_logq.studies.compare.stats.seed_user_difference`), the "
            "seeds-only t interval (the test users held fixed) beside it.")
    if saved < len(finished):
        text += (f" Hits per user: saved by {saved} of {len(finished)} finished runs (the "
                 f"others finished before compare saved them); a comparison without them "
                 f"uses the seeds-only interval.")
    diff, margin = primary
    if "user_variance" not in diff or diff.get("zero_spread") or margin is None:
        return text
    target = NARROW_SHARE * margin
    need = seeds_and_users_for(diff, target)
    n, users = diff["n"], diff["users"]
    seeds_words = (f"{need['seeds']} seeds at these {users:,} test users" if need["seeds"]
                   else "no number of seeds at these test users (the test users' part alone "
                        "is wider)")
    users_words = (f"{need['users']:,} test users at these {n} seeds" if need["users"]
                   else "no number of test users at these seeds (the seeds' part alone is "
                        "wider)")
    return text + (f" Seeds and test users, primary comparison: its half-width "
                   f"±{diff['half_width']:.4f} has a seeds' part ±{need['seed_part']:.4f} "
                   f"(more seeds narrow it) and a test users' part ±{need['user_part']:.4f} "
                   f"({users:,} test users; only more test users narrow it), each alone at "
                   f"this t; an interval of ±{target:.4f} (80 % power to read a true 0 as no "
                   f"difference larger than ±{margin:.4f}) needs {seeds_words}, or "
                   f"{users_words}.")


def format_report(plan: Plan, rows: list[dict], curves: list[dict],
                  margin: Optional[Margin] = None, primary_metric: Optional[str] = None,
                  primary_baseline: Optional[str] = None,
                  hits: Optional[dict] = None, served: Optional[dict] = None,
                  timings: Optional[list] = None) -> str:
    """``report.md``'s text. ``margin``: a `Margin` (or its text), default
    `DEFAULT_MARGIN`; ``primary_metric`` (``"recall@100"`` or ``"100"``) and
    ``primary_baseline`` (a loss of the plan or its form, ``"logq-tfrs"``) name the
    primary comparison (`primary_comparison`); ``hits``: the runs' hits per test user
    (`run_hits`), for intervals over seeds and test users (`interval`); ``served``: the
    served index's record (`tfrs_logq.studies.compare.runner.load_served`), said in one sentence
    after the verdict (`served_sentence`; None: no sentence); ``timings``: where the
    processes' time went (`tfrs_logq.studies.compare.runner.load_timings`), one sentence
    after the machine (None or []: none)."""
    if margin is None or isinstance(margin, str):
        margin = Margin(DEFAULT_MARGIN if margin is None else margin)
    _check_rows(rows)
    primary = primary_comparison(plan, rows, primary_metric, primary_baseline)
    metrics = metric_names(rows)
    pairs = comparisons(plan)
    if (primary["subject"], primary["reference"]) not in pairs:
        pairs = [(primary["subject"], primary["reference"])] + pairs
    diverged = diverged_runs(rows)
    seeds_done = sorted({int(r["seed"]) for r in rows})

    cache: dict = {}

    def compared(subject, reference, metric):
        if (subject, reference, metric) not in cache:
            diff = interval(rows, plan, subject, metric, reference, hits)
            cache[subject, reference, metric] = (
                diff, margin.of(diff.get("reference_mean", float("nan"))))
        return cache[subject, reference, metric]

    is_primary = (lambda s, r, k: (s, r, k) == (primary["subject"], primary["reference"],
                                               primary["metric"]))
    # The multiplicity rule: the primary comparison at 5 %; every other difference with
    # an interval is secondary, under Holm's correction.
    family = [(s, r, k) for s, r in pairs for k in metrics
              if not is_primary(s, r, k) and _tested(compared(s, r, k)[0])]
    adjusted = dict(zip(family, holm([paired_t_p_value(compared(*key)[0])
                                      for key in family])))
    secondary = {key: (("better" if compared(*key)[0]["mean"] > 0 else "worse")
                       if p <= 0.05 else None) for key, p in adjusted.items()}
    surviving = [f"{s} − {r} {k} ({secondary[(s, r, k)]})" for s, r, k in family
                 if secondary[(s, r, k)]]
    p_name = f"{form_of(primary['subject'])} − {form_of(primary['reference'])} at " \
             f"{_name(primary['metric'])}"
    lines = ["# Paired comparison", ""]
    planned = len(plan.losses) * len(plan.seeds)
    finished = len({(r["loss"], int(r["seed"])) for r in rows
                    if r["loss"] in plan.losses and int(r["seed"]) in plan.seeds})
    if finished < planned:
        lines += [f"**Provisional: {planned - finished} of {planned} runs of the plan are "
                  f"pending (no row in results.csv yet); this verdict reads the {finished} "
                  f"finished and may change when the rest finish (rerun the same `tfrs-logq "
                  f"compare` command).**", ""]
    lines += ["## Verdict", "",
              verdict_paragraph(plan, rows, primary, margin, secondary, hits), ""]
    served_words = served_sentence(served, primary)
    if served_words:
        lines += [served_words, ""]
    lines += [
             f"Multiplicity: the primary comparison ({p_name}, named before the runs: "
             f"--primary-metric, --primary-baseline) is tested at 5 %; the "
             f"{len(family)} other difference{'' if len(family) == 1 else 's'} with an "
             f"interval {'is' if len(family) == 1 else 'are'} secondary, under "
             f"Holm's correction (5 % family-wise): " + (
                 f"{', '.join(surviving)} stay outside noise" if surviving
                 else "none stays outside noise") + "; the popularity bands are "
             "exploratory (no test). The verdict names only what this rule supports.", "",
             _intervals_words(plan, rows, hits, compared(
                 primary["subject"], primary["reference"], primary["metric"])), "",
             f"Equivalence margin {margin.describe()} (--margin). Losses: " + "; ".join(
                 f"{describe(x)}: {FORM_NOTES[form_of(x)]}" if form_of(x) in FORM_NOTES
                 else x for x in plan.losses) + "."]
    if primary["notes"]:
        lines += ["", "Defaults that did not apply: " + "; ".join(primary["notes"]) + "."]
    lines += ["", "## Run facts", ""]
    lines += _facts(plan, rows, diverged)
    missing_runs = _missing_runs(plan, rows)
    if missing_runs:
        lines.append("- Runs of the plan without a row in results.csv: "
                     + "; ".join(missing_runs) + ". Rerun the same `tfrs-logq compare` "
                     "command (finished runs are skipped) to complete the pairs.")
    lines += [
        "", f"Source: {plan.source or '(not recorded)'}. {_model_words(plan, rows)}. "
        f"{_evaluation_words(plan, rows, curves)}. Seeds: "
        f"{', '.join(map(str, seeds_done))} (common random numbers: a seed's runs share "
        f"batches, initial weights and negatives). Machine: "
        f"{rows[0].get('machine', '?') if rows else '?'}.{_time_sentence(timings)}", "",
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
    pct = int(POWER * 100)
    lines += ["", "## Paired differences", "",
              f"Difference = first minus second, paired by seed; 95 % interval over seeds "
              f"and test users where the runs saved their hits per user (the seeds-only t "
              f"interval beside it), else over the seeds; p: that interval's t-test, "
              f"Holm-adjusted for the secondary rows. Pairs for {pct} % "
              f"power, at this spread (in brackets: at the spread's upper 95 % limit, as a "
              f"pilot's spread is itself uncertain), for two questions: *difference*, the "
              f"t-test at 5 % detects a true difference as large as the margin; *no "
              f"difference*, a true 0 gives an interval inside ±margin (this needs more "
              f"pairs: at the first column's pairs it happens only about 60 % of the "
              f"time). Over seeds and test users: the seeds it needs at these test users "
              f"(normal approximation), or *none* and the test users it needs when the "
              f"users' part alone is too wide.", "",
              "| comparison | metric | role | pairs | difference | 95 % interval | seeds-only "
              f"interval | p | margin | pairs for {pct} % power: difference | pairs for "
              f"{pct} % power: no difference | reading |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    readings = []
    for subject, reference in pairs:
        for metric in metrics:
            diff, m = compared(subject, reference, metric)
            kind = classify(diff, m)
            key = (subject, reference, metric)
            if is_primary(*key):
                role, p = "primary", paired_t_p_value(diff) if _tested(diff) else None
            else:
                role, p = "secondary", adjusted.get(key)
                if kind in ("better", "worse") and not secondary.get(key):
                    kind = "within noise after Holm"
            power_diff, power_equal = _power_cells(diff, m)
            shown = (f" {format_signed(diff['mean'])} {format_interval(diff)}".rstrip()
                     if diff.get("n") else "")
            readings.append(f"- {subject} against {reference}, {metric}: {kind} ({role})"
                            f"{shown}.")
            alone = ((format_interval(diff["seed_only"]) or "none (zero spread)")
                     if "seed_only" in diff else "")
            alone = "" if alone == format_interval(diff) else alone  # where they differ
            lines.append(f"| {subject} − {reference} | {metric} | {role} | "
                         f"{diff.get('n', 0)} | {format_signed(diff.get('mean'))} | "
                         f"{format_interval(diff)} | {alone} | "
                         f"{'' if p is None else f'{p:.3g}'} | "
                         f"{'' if m is None else f'{m:.4f}'} | {power_diff} | "
                         f"{power_equal} | {kind} |")
    lines += _seed_table(plan, rows, pairs, primary["metric"])
    lines += _band_table(plan, rows, pairs, [m for m in metrics if m.startswith("recall@")])
    lines += ["", "## Every reading", "", "The table's readings in words (secondary ones "
              "after Holm's correction).", ""] + readings
    lines += ["", "Charts: [paired differences](paired.png), "
              "[learning curves](learning_curves.png).", ""]
    return "\n".join(lines)


def _seed_table(plan: Plan, rows: list[dict], pairs: list[tuple], metric: str) -> list[str]:
    """Each seed's difference at the primary metric, flagged where the other seeds' 99 %
    prediction interval leaves it out (`tfrs_logq.studies.compare.stats.seed_outliers`)."""
    diffs = [paired(rows, plan, s, metric, reference=r) for s, r in pairs]
    if not any(d.get("n") for d in diffs):
        return []
    cells: dict = {}
    for column, diff in enumerate(diffs):
        if not diff.get("n"):
            continue
        flags = seed_outliers(diff["differences"])
        for seed, value, flag in zip(diff["seeds"], diff["differences"], flags):
            cells[(seed, column)] = f"{value:+.4f}" + (" (outlier)" if flag else "")
    seeds = sorted({seed for seed, _ in cells})
    out = ["", f"## Each seed, {_name(metric)}", "",
           "The difference of each seed; *outlier*: outside the 99 % prediction interval of "
           "the other seeds' differences (a seed to look at, not to drop).", "",
           "| seed | " + " | ".join(f"{s} − {r}" for s, r in pairs) + " |",
           "|---|" + "---|" * len(pairs)]
    for seed in seeds:
        out.append(f"| {seed} | " + " | ".join(cells.get((seed, c), "")
                                               for c in range(len(pairs))) + " |")
    return out


def _band_table(plan: Plan, rows: list[dict], pairs: list[tuple],
                recalls: list[str]) -> list[str]:
    band_metrics = [m for m in recalls if any(f"{b}:{m}" in r for r in rows for b in BANDS)]
    if not band_metrics:
        return []
    out = ["", "## By popularity of the target (exploratory)", "",
           "Head: the most popular items holding the first third of the training "
           "interactions; torso: the next third; tail: the rest (cold items included). The "
           "same paired differences over the test targets of each band, and the tail − head "
           "contrast (the tail's difference minus the head's, paired by seed): where a "
           "correction moves quality. Exploratory: not part of the multiplicity rule, no "
           "verdict rests on it.", "",
           "| comparison | metric | " + " | ".join(f"{b} (share)" for b in BANDS)
           + " | tail − head |", "|---|---|" + "---|" * (len(BANDS) + 1)]
    for subject, reference in pairs:
        for metric in band_metrics:
            cells, by_band = [], {}
            for band in BANDS:
                diff = paired(rows, plan, subject, f"{band}:{metric}", reference=reference)
                by_band[band] = diff
                shares = [float(r[f"{band}:share"]) for r in rows
                          if _finite(r.get(f"{band}:share"))]
                share = f" ({np.mean(shares):.2f})" if shares else ""
                cells.append(f"{format_signed(diff.get('mean'))} {format_interval(diff)}{share}"
                             if diff.get("n") else "")
            head, tail = by_band.get("head", {}), by_band.get("tail", {})
            contrast = ""
            if head.get("n") and tail.get("n"):
                c = paired_by_seed(dict(zip(tail["seeds"], tail["differences"])),
                                   dict(zip(head["seeds"], head["differences"])))
                if c.get("n"):
                    contrast = f"{format_signed(c['mean'])} {format_interval(c)}".strip()
            lines_cells = " | ".join(cells)
            out.append(f"| {subject} − {reference} | {metric} | {lines_cells} | {contrast} |")
    return out


def render_charts(plan: Plan, rows: list[dict], curves: list[dict],
                  hits: Optional[dict] = None) -> dict:
    """``{"paired.png": bytes, "learning_curves.png": bytes}``: every paired difference
    with the interval the report reads (`interval`), and the learning curves."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}

    def png(fig) -> bytes:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        return buffer.getvalue()

    metrics = metric_names(rows)
    pairs = comparisons(plan)
    # The main chart: every paired difference with its interval.
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.8 * len(pairs), 3.6), squeeze=False)
    for ax, (subject, reference) in zip(axes[0], pairs):
        for x, metric in enumerate(metrics):
            diff = interval(rows, plan, subject, metric, reference, hits)
            if diff.get("n", 0) == 0:
                continue
            half = diff.get("half_width")
            ax.errorbar([x], [diff["mean"]], yerr=None if half is None or math.isnan(half)
                        else [[half], [half]], fmt="o", capsize=4)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(metrics)), metrics, rotation=45, fontsize=8)
        ax.set_title(f"{form_of(subject)} − {form_of(reference)} (95 % interval)", fontsize=9)
    fig.tight_layout()
    out["paired.png"] = png(fig)

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
    out["learning_curves.png"] = png(fig)
    return out


def write_charts(plan: Plan, rows: list[dict], curves: list[dict], output_dir: str,
                 hits: Optional[dict] = None) -> None:
    """Writes `render_charts`'s ``paired.png`` and ``learning_curves.png`` into
    ``output_dir``, each atomically."""
    for name, data in render_charts(plan, rows, curves, hits).items():
        write_bytes(os.path.join(output_dir, name), data)


def write_report(plan: Plan, rows: list[dict], curves: list[dict], output_dir: str,
                 say: Callable[[str], None] = print, margin: Optional[Margin] = None,
                 primary_metric: Optional[str] = None,
                 primary_baseline: Optional[str] = None) -> str:
    """Writes ``report.md``, ``paired.png`` and ``learning_curves.png`` into
    ``output_dir``, with the runs' hits per test user found there (`run_hits`). Every
    file is made before any is written: input the report cannot read (a damaged
    curves.csv: `check_curves`) leaves all three as they were."""

    check_curves(curves, os.path.join(output_dir, "curves.csv"))
    hits = run_hits(output_dir, rows)
    text = format_report(plan, rows, curves, margin, primary_metric, primary_baseline, hits,
                         load_served(output_dir), load_timings(output_dir))
    charts = render_charts(plan, rows, curves, hits)
    write_text(os.path.join(output_dir, "report.md"), text)
    for name, data in charts.items():
        write_bytes(os.path.join(output_dir, name), data)
    verdict_line = next((line for line in text.splitlines()
                         if line.startswith("Primary comparison")), None)
    if verdict_line:
        say(f"compare: {verdict_line}")
    say(f"compare: report in {os.path.join(output_dir, 'report.md')}")
    return text


def report_only(output_dir: str, say: Callable[[str], None] = print,
                margin=None, primary: Optional[tuple] = None) -> str:
    """Rebuilds ``report.md`` and the charts from ``output_dir``'s ``results.csv`` and
    ``curves.csv`` (no training), under the lock of the directory's tables (a comparison
    spread over processes may be writing them). Where runs of the plan have no row yet,
    the report is provisional (it says so first) and ``say`` names them, ``(loss,
    seed)``."""
    plan = load_plan(output_dir)
    path = os.path.join(output_dir, "results.csv")
    with _tables(output_dir):
        plan = load_plan(output_dir)  # as it is now that no process writes it
        rows = read_rows(path)
        check_results(rows, path)
        if not rows:
            raise CompareError(f"{output_dir}/results.csv holds no finished run: nothing to "
                               f"report.")
        left = missing_runs(plan, rows)
        if left:
            say(f"compare: partial report: {len(left)} of the plan's {len(plan_runs(plan))} "
                f"runs have no row in results.csv yet: "
                + ", ".join(f"({loss}, {seed})" for loss, seed in left[:20])
                + (f" and {len(left) - 20} more" if len(left) > 20 else "")
                + "; the report is provisional until they finish")
        return reporter(margin, primary)(
            plan, rows, read_rows(os.path.join(output_dir, "curves.csv")), output_dir, say)


def reporter(margin=None, primary: Optional[tuple] = None) -> Callable:
    """The report step of a comparison (`tfrs_logq.studies.compare.runner.run_plan`'s
    ``report``): `write_report` with the ``margin`` (a `Margin`, None: the default) and the
    ``primary`` comparison (``(metric, baseline)``, either None: the report's default)."""
    def report(plan: Plan, rows: list, curves: list, output_dir: str,
               say: Callable[[str], None]):
        return write_report(plan, rows, curves, output_dir, say=say, margin=margin,
                            **_primary(primary))

    return report


def _primary(primary: Optional[tuple]) -> dict:
    """``(metric, baseline)`` (either None: the report's default) as `write_report`'s
    keyword arguments."""
    metric, baseline = primary or (None, None)
    return {"primary_metric": metric, "primary_baseline": baseline}


__all__ = ["DEFAULT_MARGIN", "DEFAULT_PRIMARY_BASELINE", "DEFAULT_PRIMARY_METRIC",
           "Margin", "check_curves",
           "comparisons", "diverged_runs", "format_report", "interval", "paired",
           "primary_comparison", "render_charts", "report_only", "reporter", "run_hits", "sentence",
           "served_sentence", "verdict", "verdict_paragraph", "write_charts", "write_report"]
