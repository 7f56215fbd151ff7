"""`tfrs_logq.studies.compare.report`: the verdict a user acts on (one primary comparison,
its decision, what it rests on), the multiplicity rule, the tables under it, and one-line
errors for input the report cannot read. References come from SciPy and numpy in the test."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.stats

from tfrs_logq.studies.compare import plan as compare_plan
from tfrs_logq.studies.compare import report as compare_report
from tfrs_logq.studies.compare.stats import holm, pairs_for_equivalence, pairs_for_power
from tfrs_logq.towers.config import TwoTowerConfig

CONFIG = TwoTowerConfig(steps=30, batch_size=64, embedding_dim=8, history_length=5,
                        learning_rate=2e-2, eval_every=10)
LOSSES = ("inbatch-logq-official", "inbatch-logq-tfrs", "inbatch-corrected")
TFRS = [0.400, 0.410, 0.395, 0.405]


def _plan(losses=LOSSES, seeds=4):
    return compare_plan.Plan(losses=losses, seeds=tuple(range(seeds)), config=CONFIG, window=1)


def _rows(values: dict, **extra) -> list[dict]:
    """``{loss: {metric: [value per seed]}}`` as results.csv rows."""
    rows = []
    for loss, metrics in values.items():
        for seed in range(len(next(iter(metrics.values())))):
            rows.append({"loss": loss, "seed": str(seed), "positive_share_q50": "0.01",
                         "seconds_per_step": "0.01", "machine": "m", **extra,
                         **{k: str(v[seed]) for k, v in metrics.items()}})
    return rows


def _three(tfrs_at_100=TFRS, corrected_at_100=None, **corrected_extra):
    """The three losses; corrected's Recall@100 given, other metrics equal to TFRS's plus
    a small seed-to-seed wobble (within noise) unless given."""
    wobble = np.array([0.0004, -0.0003, 0.0002, -0.0004])[:len(tfrs_at_100)]
    base = {"recall@10": np.array(tfrs_at_100) / 4, "recall@100": np.array(tfrs_at_100),
            "recall@1000": np.array(tfrs_at_100) + 0.4}
    corrected = {k: v + wobble for k, v in base.items()}
    corrected["recall@100"] = np.array(corrected_at_100)
    corrected.update({k: np.array(v) for k, v in corrected_extra.items()})
    return _rows({"inbatch-logq-official": {k: v - wobble for k, v in base.items()},
                  "inbatch-logq-tfrs": base, "inbatch-corrected": corrected})


def _verdict(text: str) -> str:
    return text.split("## Verdict\n\n")[1].split("\n\n")[0]


def _sentences(paragraph: str) -> int:
    return len(re.findall(r"\.(?:\s|$)", paragraph))


def test_the_primary_comparison_is_corrected_against_tfrs_logq_at_recall_100_by_default():
    corrected = np.array(TFRS) + [0.010, 0.012, 0.009, 0.011]
    rows = _three(corrected_at_100=corrected)
    text = compare_report.format_report(_plan(), rows, [])
    verdict = _verdict(text)
    d = corrected - np.array(TFRS)
    test = scipy.stats.ttest_rel(corrected, TFRS)
    low, high = test.confidence_interval(0.95)
    assert verdict.startswith("Primary comparison, corrected logQ (inbatch-corrected) against "
                              "TFRS's logQ (inbatch-logq-tfrs) at Recall@100: "
                              f"{d.mean():+.4f}, 95 % interval [{low:+.4f}, {high:+.4f}], "
                              f"p = {test.pvalue:.3g} over 4 seeds.")
    assert "Decision: switch (" in verdict and _sentences(verdict) <= 3
    assert "| inbatch-corrected − inbatch-logq-tfrs | recall@100 | primary | 4 |" in text
    # The plan's baseline (official) is not the primary one: named as secondary rows.
    assert "| inbatch-corrected − inbatch-logq-official | recall@100 | secondary |" in text


@pytest.mark.parametrize("shift, decision", [
    ([-0.010, -0.012, -0.009, -0.011], "Decision: keep ("),
    ([0.0003, -0.0002, 0.0001, -0.0003], "Decision: no difference larger than 0.0020 ("),
    ([0.0005, 0.0006, 0.0004, 0.0005], "Decision: no difference larger than 0.0020 (the 95 % "
     "interval lies inside ±0.0020; the gain is outside noise but smaller than the margin)"),
    ([0.0040, -0.0050, 0.0060, -0.0030], "Decision: not enough seeds: run {more} more ("),
])
def test_each_decision_a_user_acts_on(shift, decision):
    corrected = np.array(TFRS) + shift
    text = compare_report.format_report(_plan(), _three(corrected_at_100=corrected), [])
    verdict = _verdict(text)
    sd = np.std(shift, ddof=1)
    more = max(pairs_for_power(0.002, sd), pairs_for_equivalence(0.002, sd)) - 4
    assert decision.format(more=more) in verdict
    assert _sentences(verdict) <= 3
    assert not re.search(r"\bswitch\b", verdict)


def test_fewer_than_three_pairs_say_how_many_more_seeds():
    rows = _three(tfrs_at_100=TFRS[:2], corrected_at_100=np.array(TFRS[:2]) + [0.01, 0.02])
    verdict = _verdict(compare_report.format_report(_plan(seeds=2), rows, []))
    assert "over 2 pairs, a direction, not a verdict" in verdict
    assert re.search(r"Decision: not enough seeds: run [1-9][0-9]* more", verdict)


def test_a_loss_that_diverged_is_part_of_the_verdict_with_an_exact_interval():
    corrected = list(np.array(TFRS) + [0.010, 0.012, 0.009, 0.011])
    corrected[1] = float("nan")
    verdict = _verdict(compare_report.format_report(
        _plan(), _three(corrected_at_100=corrected), []))
    low, high = scipy.stats.beta.ppf(0.025, 1, 4), scipy.stats.beta.ppf(0.975, 2, 3)
    assert (f"corrected diverged in 1 of 4 seeds (25 %, exact 95 % interval "
            f"{100 * low:.0f}-{100 * high:.0f} %)") in verdict
    assert "Decision: keep (corrected diverged where logq-tfrs did not" in verdict
    assert _sentences(verdict) <= 3


def test_gains_and_losses_across_k_are_named_as_a_trade_off():
    corrected = np.array(TFRS) + [0.010, 0.012, 0.009, 0.011]
    at_10 = np.array(TFRS) / 4 - [0.020, 0.021, 0.019, 0.0205]  # p ~ 1e-5: survives Holm
    verdict = _verdict(compare_report.format_report(
        _plan(), _three(corrected_at_100=corrected, **{"recall@10": at_10}), []))
    assert "Decision: switch" in verdict
    assert "a trade-off across k: it loses at Recall@10 (Holm, 5 %)" in verdict


def test_the_verdict_never_claims_a_secondary_difference_holm_calls_noise():
    """At p ~ 0.027 on a secondary metric, Holm's correction over the family keeps it in
    noise: neither the verdict nor the table says it gains."""
    corrected = np.array(TFRS) + [0.0040, -0.0050, 0.0060, -0.0030]
    at_10 = np.array(TFRS) / 4 + [0.004, 0.007, 0.002, 0.007]
    rows = _three(corrected_at_100=corrected, **{"recall@10": at_10})
    text = compare_report.format_report(_plan(), rows, [])
    raw = scipy.stats.ttest_rel(at_10, np.array(TFRS) / 4).pvalue
    assert 0.017 < raw < 0.05  # significant alone, not after Holm over 5 others
    family = [scipy.stats.ttest_rel([float(r[k]) for r in rows if r["loss"] == s],
                                    [float(r[k]) for r in rows if r["loss"] == ref]).pvalue
              for s, ref in (("inbatch-corrected", "inbatch-logq-official"),
                             ("inbatch-corrected", "inbatch-logq-tfrs"))
              for k in ("recall@10", "recall@100", "recall@1000")
              if (s, ref, k) != ("inbatch-corrected", "inbatch-logq-tfrs", "recall@100")]
    assert min(holm(family)) > 0.05
    verdict = _verdict(text)
    assert not re.search(r"\b(gains|loses|trade-off)\b", verdict)
    assert "secondary, under Holm's correction (5 % family-wise): none stays outside noise" \
        in text
    row = next(line for line in text.splitlines()
               if line.startswith("| inbatch-corrected − inbatch-logq-tfrs | recall@10 |"))
    assert row.endswith("| within noise after Holm |")
    assert f"| {holm(family)[family.index(raw)]:.3g} |" in row


def test_identical_differences_up_to_rounding_decide_nothing():
    corrected = np.array(TFRS) + 0.01 + np.array([0, 1e-11, -1e-11, 0])
    verdict = _verdict(compare_report.format_report(
        _plan(), _three(corrected_at_100=corrected), []))
    assert "Decision: no decision from seeds" in verdict and "switch" not in verdict


def test_each_seed_is_shown_with_an_outlier_flag():
    tfrs = [0.40, 0.41, 0.395, 0.405, 0.40]
    shift = [0.010, 0.012, 0.011, 0.009, 0.060]
    rows = _rows({"inbatch-logq-tfrs": {"recall@100": tfrs},
                  "inbatch-corrected": {"recall@100": np.add(tfrs, shift)}})
    text = compare_report.format_report(
        _plan(("inbatch-logq-tfrs", "inbatch-corrected"), 5), rows, [])
    table = text.split("## Each seed, Recall@100")[1].split("##")[0]
    for seed, d in enumerate(shift):
        flag = " (outlier)" if seed == 4 else ""
        assert f"| {seed} | {d:+.4f}{flag} |" in table


def test_the_band_table_is_exploratory_with_a_tail_minus_head_contrast():
    rng = np.random.default_rng(0)
    bands = {loss: {f"{b}:recall@100": rng.uniform(0.2, 0.6, 4) for b in ("head", "tail")}
             for loss in ("inbatch-logq-tfrs", "inbatch-corrected")}
    rows = _rows({loss: {"recall@100": TFRS, **v} for loss, v in bands.items()},
                 **{"head:share": "0.5", "tail:share": "0.5"})
    text = compare_report.format_report(_plan(("inbatch-logq-tfrs", "inbatch-corrected")),
                                        rows, [])
    assert "## By popularity of the target (exploratory)" in text
    c, t = bands["inbatch-corrected"], bands["inbatch-logq-tfrs"]
    contrast = (c["tail:recall@100"] - t["tail:recall@100"]) - (
        c["head:recall@100"] - t["head:recall@100"])
    low, high = scipy.stats.ttest_1samp(contrast, 0.0).confidence_interval(0.95)
    row = next(line for line in text.splitlines() if "| recall@100 | " in line
               and "(0.50)" in line)
    assert row.endswith(f"| {contrast.mean():+.4f} [{low:+.4f}, {high:+.4f}] |")
    assert "the popularity bands are exploratory (no test)" in text


def test_defaults_that_do_not_apply_fall_back_and_say_so():
    rows = _rows({"inbatch-logq-official": {"recall@10": TFRS, "recall@20": TFRS},
                  "inbatch-corrected": {"recall@10": TFRS, "recall@20": np.add(TFRS, 0.01)}})
    plan = _plan(("inbatch-logq-official", "inbatch-corrected"))
    primary = compare_report.primary_comparison(plan, rows)
    assert (primary["subject"], primary["reference"], primary["metric"]) == (
        "inbatch-corrected", "inbatch-logq-official", "recall@20")
    text = compare_report.format_report(plan, rows, [])
    assert "recall@100 was not recorded; the primary metric is recall@20" in text
    assert "the primary baseline is the plan's, inbatch-logq-official" in text
    # Named ones are taken as named: a form or a loss, k alone or the metric.
    named = compare_report.primary_comparison(plan, rows, "10", "logq-official")
    assert (named["reference"], named["metric"]) == ("inbatch-logq-official", "recall@10")
    text = compare_report.format_report(plan, rows, [], primary_metric="Recall@10")
    assert "at Recall@10:" in _verdict(text)


def test_mns_corrected_is_compared_with_the_baseline_of_its_own_negatives():
    plan = _plan(("inbatch-logq-tfrs", "mns-logq-tfrs", "inbatch-corrected",
                  "mns-corrected"))
    rows = _rows({loss: {"recall@100": TFRS} for loss in plan.losses})
    primary = compare_report.primary_comparison(plan, rows, primary_baseline="mns-logq-tfrs")
    assert (primary["subject"], primary["reference"]) == ("mns-corrected", "mns-logq-tfrs")


@pytest.mark.parametrize("change, match", [
    (dict(primary_metric="recall@500"), r"recall@500' was not recorded .*pass "
     r"--primary-metric one of them"),
    (dict(primary_baseline="inbatch-none"), r"'inbatch-none' is not a loss of this "
     r"comparison .*pass --primary-baseline"),
    (dict(margin="0"), r"--margin must be"),
    (dict(margin="-0.01"), r"--margin must be"),
    (dict(margin="0%"), r"--margin must be"),
])
def test_bad_parameters_are_one_line_errors_that_name_the_fix(change, match):
    rows = _three(corrected_at_100=TFRS)
    with pytest.raises(ValueError, match=match) as error:
        compare_report.format_report(_plan(), rows, [], **change)
    assert "\n" not in str(error.value)


def test_bad_rows_are_one_line_errors_and_missing_runs_a_line_with_the_fix():
    rows = _three(corrected_at_100=TFRS)
    rows[4]["seed"] = ""
    with pytest.raises(compare_plan.ReportError, match=r"results.csv line 6 has no loss "
                       r"or no integer seed .*--report-only") as error:
        compare_report.format_report(_plan(), rows, [])
    assert "\n" not in str(error.value)
    # Seeds 4 and 5 of the plan have no row yet (an interrupted comparison).
    text = compare_report.format_report(_plan(seeds=6), _three(corrected_at_100=TFRS), [])
    line = next(x for x in text.splitlines() if x.startswith("- Runs of the plan without"))
    assert "inbatch-corrected seeds 4, 5" in line and "Rerun the same" in line


def test_the_margin_is_absolute_by_default_or_relative():
    assert compare_report.Margin().of(0.5) == 0.002 == compare_report.Margin().of(0.9)
    assert compare_report.Margin("2%").of(0.5) == pytest.approx(0.01)
    assert compare_report.Margin("0.003").of(0.5) == 0.003
    for bad in ("0", "-1%", "abc", "150%", "2"):
        with pytest.raises(ValueError, match="--margin"):
            compare_report.Margin(bad)


def _user_dominated(seeds=4, users=600, seed=3):
    """Hits per test user where the users' draw dominates: the reference hits the same
    users in every seed, the corrected loss gains on a fixed 5 % of the users and loses on
    a fixed 4 %, and each seed flips 0.3 % of its hits at random."""
    rng = np.random.default_rng(seed)
    base = (rng.uniform(size=users) < 0.3).astype(float)
    gains, losses = rng.uniform(size=users) < 0.05, rng.uniform(size=users) < 0.04
    corrected = np.where(gains, 1.0, np.where(losses, 0.0, base))
    reference = np.tile(base, (seeds, 1))
    subject = np.tile(corrected, (seeds, 1))
    flips = rng.uniform(size=(seeds, users)) < 0.003
    subject = np.where(flips, 1.0 - subject, subject)
    return subject, reference


def _hits(subject, reference, k=100):
    users = np.arange(subject.shape[1])
    return {(loss, seed): {"users": users, "targets": np.ones_like(users),
                           f"hits@{k}": values[seed].astype(np.int32)}
            for loss, values in (("inbatch-corrected", subject),
                                 ("inbatch-logq-tfrs", reference))
            for seed in range(len(values))}


def test_the_interval_over_seeds_and_test_users_is_wider_where_the_users_dominate():
    subject, reference = _user_dominated()
    seeds, users = subject.shape
    rows = _rows({"inbatch-logq-tfrs": {"recall@100": reference.mean(1)},
                  "inbatch-corrected": {"recall@100": subject.mean(1)}})
    plan = _plan(("inbatch-logq-tfrs", "inbatch-corrected"), seeds)
    # The seeds-only interval: the paired t over the seeds' recalls (SciPy).
    alone = scipy.stats.ttest_rel(subject.mean(1), reference.mean(1))
    alone_low, alone_high = alone.confidence_interval(0.95)
    # Over seeds and test users, written out: the seeds' variance of the differences plus
    # the users' variance component of the two-way ANOVA, Satterthwaite's df with the
    # seeds' part at its upper 75 % limit.
    d = subject - reference
    grand, by_seed, by_user = d.mean(), d.mean(1), d.mean(0)
    ms_user = seeds * np.sum((by_user - grand) ** 2) / (users - 1)
    ms_res = np.sum((d - by_seed[:, None] - by_user[None, :] + grand) ** 2) / (
        (seeds - 1) * (users - 1))
    user_part = (ms_user - ms_res) / seeds / users
    seed_part = np.var(by_seed, ddof=1) / seeds
    user_df = (ms_user - ms_res) ** 2 / (ms_user ** 2 / (users - 1)
                                         + ms_res ** 2 / ((seeds - 1) * (users - 1)))
    up = seed_part * (seeds - 1) / scipy.stats.chi2.ppf(0.25, seeds - 1)
    df = (up + user_part) ** 2 / (up ** 2 / (seeds - 1) + user_part ** 2 / user_df)
    half = scipy.stats.t.ppf(0.975, df) * np.sqrt(seed_part + user_part)
    low, high = grand - half, grand + half
    assert high - low > 3 * (alone_high - alone_low)  # the users' noise dominates
    assert alone_low > 0 and low < 0 < high  # seeds alone would call it a gain

    text = compare_report.format_report(plan, rows, [], margin="0.01",
                                        hits=_hits(subject, reference))
    verdict = _verdict(text)
    assert (f"95 % interval [{low:+.4f}, {high:+.4f}] over seeds and test users (seeds "
            f"alone: [{alone_low:+.4f}, {alone_high:+.4f}])") in verdict
    assert f"over {seeds} seeds and {users:,} test users" in verdict
    assert "It rests on the 95 % interval over seeds and test users" in verdict
    assert not re.search(r"\bswitch\b", verdict)  # the verdict follows the wider interval
    assert _sentences(verdict) <= 3
    row = next(line for line in text.splitlines()
               if line.startswith("| inbatch-corrected − inbatch-logq-tfrs | recall@100 |"))
    assert (f"| [{low:+.4f}, {high:+.4f}] | [{alone_low:+.4f}, {alone_high:+.4f}] |"
            in row) and row.endswith("| within noise |")
    # How many test users (and seeds) a narrower interval needs, for the primary.
    words = text.split("Seeds and test users, primary comparison: ")[1].split("\n")[0]
    target = compare_report.NARROW_SHARE * 0.01
    need = int(re.search(r"or ([0-9,]+) test users at these 4 seeds", words).group(1)
               .replace(",", ""))

    def at(u):  # the half-width at u test users, from the formula above
        part = (ms_user - ms_res) / seeds / u
        df = (up + part) ** 2 / (up ** 2 / (seeds - 1) + part ** 2 / user_df)
        return scipy.stats.t.ppf(0.975, df) * np.sqrt(seed_part + part)

    assert at(need) <= target < at(need - 1)
    assert f"Decision: not enough test users: about {need:,} (now {users:,})" in verdict
    assert "no number of seeds at these test users" in words

    # Without hits (runs finished before they were saved): the seeds alone, said once.
    old = compare_report.format_report(plan, rows, [], margin="0.01")
    assert "Hits per user: none saved" in old
    assert "It rests on the 95 % interval over the seeds alone (no hits per user saved" \
        in _verdict(old) and "Decision: switch" in _verdict(old)


def test_the_report_names_the_steps_evaluated_not_the_eval_every_asked():
    import dataclasses

    config = dataclasses.replace(CONFIG, steps=40, eval_every=100)  # one evaluation: 40
    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0, 1, 2),
                        config=config, window=1)
    rows = _rows({"inbatch-logq-tfrs": {"recall@100": TFRS[:3]},
                  "inbatch-corrected": {"recall@100": TFRS[1:]}}, steps="40",
                 window_steps="40")
    curves = [{"loss": r["loss"], "seed": r["seed"], "steps": "40",
               "recall@100": r["recall@100"]} for r in rows]
    text = compare_report.format_report(plan, rows, curves)
    assert "Test metrics: the evaluation at step 40, the only one." in text
    assert "every 100" not in text
    five = compare_plan.Plan(losses=plan.losses, seeds=(0, 1, 2), window=2,
                        config=dataclasses.replace(CONFIG, steps=50, eval_every=20))
    rows = [{**r, "window_steps": "40 50"} for r in rows]
    curves = [{**c, "steps": s} for c in curves for s in ("20", "40", "50")]
    assert ("Test metrics: the mean of the evaluations at steps 40, 50 (of those at steps "
            "20, 40, 50).") in compare_report.format_report(five, rows, curves)


def test_a_sasrec_report_describes_sasrec():
    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0, 1, 2),
                        config=TwoTowerConfig(steps=40, eval_every=20), window=2,
                        model="sasrec", sasrec_preset="cpu")
    rows = _rows({"inbatch-logq-official": {"recall@10": TFRS[:3]},
                  "inbatch-corrected": {"recall@10": TFRS[1:]}}, steps="36",
                 window_steps="18 36")
    text = compare_report.format_report(plan, rows, [])
    sasrec = plan.sasrec_config("inbatch-corrected", 0)
    assert (f"Model: SASRec (preset cpu), 36 steps in 2 epochs of at most 20 steps (an epoch "
            f"is at most one pass over the training users) of {sasrec.batch_size} users, "
            f"embedding {sasrec.embedding_dim}, history {sasrec.max_length}") in text
    assert "lazy-adam" not in text and "steps of 512" not in text and "40 steps" not in text
    assert "the mean of the test evaluations at steps 18, 36" in text


def test_zero_spread_says_what_happened():
    seeds = 4
    varying = [0.30, 0.32, 0.29, 0.31]  # the runs vary with the seed ...
    rows = _rows({"inbatch-logq-tfrs": {"recall@100": varying},
                  "inbatch-corrected": {"recall@100": varying}})  # ... and hit alike
    plan = _plan(("inbatch-logq-tfrs", "inbatch-corrected"), seeds)
    same = np.tile((np.arange(50) % 3 == 0).astype(float), (seeds, 1))
    text = compare_report.format_report(plan, rows, [], hits=_hits(same, same))
    assert "runs that do not vary with the seed" not in text
    assert "the losses hit the same test targets in every seed: their difference is 0 in " \
           "each pair" in text
    assert "Decision: no decision from seeds" in _verdict(text)
    # Without hits: the same scores in every seed, not "do not vary".
    text = compare_report.format_report(plan, rows, [])
    assert "the losses score the same in every seed while the seed moves both" in text
    assert "do not vary with the seed" not in text
    # Runs that do not vary with the seed are still named so.
    flat = _rows({"inbatch-logq-tfrs": {"recall@100": [0.3] * 4},
                  "inbatch-corrected": {"recall@100": [0.31] * 4}})
    assert "the runs do not vary with the seed" in compare_report.format_report(plan, flat, [])
