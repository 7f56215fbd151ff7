"""`tfrs_logq.studies.compare.stats` against SciPy, simulation and the rules of a paired verdict."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from tfrs_logq.studies.compare.stats import (
    MIN_PAIRS,
    classify,
    divergence_rate,
    equivalence_power,
    format_interval,
    format_signed,
    holm,
    paired_by_seed,
    paired_difference,
    paired_t_p_value,
    pairs_for_equivalence,
    pairs_for_power,
    power,
    sd_upper_limit,
    seed_outliers,
    seed_user_difference,
    seed_user_half_width,
    seed_user_interval,
    seeds_and_users_for,
    values_by_seed,
)


def test_paired_difference_is_the_t_interval_of_the_differences():
    rng = np.random.default_rng(0)
    a = rng.normal(0.38, 0.01, 7)
    b = a + rng.normal(0.004, 0.003, 7)
    d = paired_difference(a.tolist(), b.tolist())
    diffs = b - a
    res = sps.ttest_rel(b, a)
    low, high = res.confidence_interval(0.95)
    assert d["n"] == 7 and d["mean"] == pytest.approx(diffs.mean())
    assert d["sd"] == pytest.approx(diffs.std(ddof=1))
    assert d["se"] == pytest.approx(diffs.std(ddof=1) / math.sqrt(7))
    assert (d["low"], d["high"]) == (pytest.approx(low), pytest.approx(high))
    assert d["within_noise"] == (low <= 0 <= high) and not d["zero_spread"]
    assert paired_difference([1.0], [1.5])["se"] is None
    with pytest.raises(ValueError, match="paired"):
        paired_difference([1.0, 2.0], [1.0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_diverged_value_is_refused_not_compared(bad):
    with pytest.raises(ValueError, match="not finite"):
        paired_difference([0.1, 0.2, 0.3], [0.1, bad, 0.3])


def test_identical_differences_are_zero_spread_not_a_significant_difference():
    d = paired_difference([0.10, 0.20, 0.30], [0.11, 0.21, 0.31])
    assert d["zero_spread"] and d["sd"] == pytest.approx(0.0, abs=1e-15)
    assert classify(d, 0.002) == "zero spread"


def test_power_matches_a_simulated_paired_t_test():
    rng = np.random.default_rng(1)
    n, effect, sd, trials = 8, 0.003, 0.004, 40_000
    diffs = rng.normal(effect, sd, size=(trials, n))
    t = diffs.mean(1) / (diffs.std(1, ddof=1) / math.sqrt(n))
    rejected = np.mean(np.abs(t) > sps.t.ppf(0.975, n - 1))
    assert power(n, effect, sd) == pytest.approx(rejected, abs=0.01)
    # No effect: the test's level.
    assert power(n, 0.0, sd) == pytest.approx(0.05, abs=1e-9)


def test_pairs_for_power_is_the_fewest_pairs_reaching_it():
    for effect, sd in ((0.003, 0.004), (0.003, 0.0123), (0.01, 0.002)):
        n = pairs_for_power(effect, sd)
        assert power(n, effect, sd) >= 0.8
        assert n == MIN_PAIRS or power(n - 1, effect, sd) < 0.8
    assert pairs_for_power(0.003, 0.01) < pairs_for_power(0.003, 0.02)  # more spread, more
    assert pairs_for_power(float("nan"), 0.01) is None
    assert pairs_for_power(0.003, float("nan")) is None
    assert pairs_for_power(1e-9, 1.0) is None  # past the limit: a number, not a 20 s loop


def test_the_spreads_upper_limit_covers_the_true_spread_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    n, sd = 4, 0.01
    samples = rng.normal(0.0, sd, size=(20_000, n)).std(1, ddof=1)
    covered = np.mean([sd_upper_limit(s, n) >= sd for s in samples])
    assert covered == pytest.approx(0.95, abs=0.01)
    assert sd_upper_limit(0.01, 3) == pytest.approx(
        0.01 * math.sqrt(2 / sps.chi2.ppf(0.05, 2)))


@pytest.mark.parametrize("a, b, margin, expected", [
    ([0.2], [0.3], 0.01, "direction only"),
    ([0.2, 0.21], [0.3, 0.32], 0.01, "direction only"),  # 2 pairs: t(1) = 12.7
    ([0.20, 0.21, 0.19, 0.205], [0.23, 0.245, 0.22, 0.236], 0.01, "better"),
    ([0.23, 0.245, 0.22, 0.236], [0.20, 0.21, 0.19, 0.205], 0.01, "worse"),
    ([0.300, 0.301, 0.299, 0.300], [0.3002, 0.3008, 0.2988, 0.3004], 0.005, "equivalent"),
    ([0.19, 0.23, 0.18, 0.215], [0.20, 0.21, 0.19, 0.205], 0.005, "within noise"),
    ([0.19, 0.23, 0.18, 0.215], [0.20, 0.21, 0.19, 0.205], None, "within noise"),
])
def test_classify_reads_each_interval_by_its_rule(a, b, margin, expected):
    assert classify(paired_difference(a, b), margin) == expected


def test_no_pairs():
    assert classify({"n": 0}, 0.01) == "no pairs"


def test_paired_report_pairs_runs_by_seed_and_prints_the_interval():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "paired_report.py")
    spec = importlib.util.spec_from_file_location("paired_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    standard, improved = module.PAIRS[0]
    rows = [{"loss": loss, "seed": str(seed), "window_test_recall@20": str(value),
             "window_test_ndcg@20": str(value / 2)}
            for seed, (a, b) in enumerate([(0.370, 0.375), (0.380, 0.383), (0.372, 0.379)])
            for loss, value in ((standard, a), (improved, b))]
    rows.append({"loss": module.PAIRS[1][0], "seed": "0", "window_test_recall@20": "0.36",
                 "window_test_ndcg@20": ""})  # unpaired and missing: left out
    text = module.report(rows, 0.003)
    d = paired_difference([0.370, 0.380, 0.372], [0.375, 0.383, 0.379])
    line = next(row for row in text.splitlines() if "window_test_recall@20" in row)
    assert f"{d['mean']:+.4f}" in line and f"[{d['low']:+.4f}, {d['high']:+.4f}]" in line
    assert f"| {pairs_for_power(0.003, d['sd'])} |" in line
    assert "| 3 |" in line and "+-0.003" in text.splitlines()[0]
    assert "mns" not in text


def test_values_by_seed_keeps_the_finished_runs_that_match():
    rows = [{"loss": "a", "steps": "100", "seed": "2", "r": "0.25"},
            {"loss": "a", "steps": "100", "seed": "0", "r": "0.5"},
            {"loss": "a", "steps": "100", "seed": "1", "r": ""},      # not finished
            {"loss": "a", "steps": "100", "seed": "3", "r": "nan"},   # diverged
            {"loss": "a", "steps": "300", "seed": "4", "r": "0.1"},   # other steps
            {"loss": "b", "steps": "100", "seed": "0", "r": "0.75"},  # other loss
            {"loss": "a", "steps": "100", "seed": "0", "r": "0.625"}]  # a rerun: counts
    assert values_by_seed(rows, "r", loss="a", steps=100) == {2: 0.25, 0: 0.625}
    assert values_by_seed(rows, "missing", loss="a") == {}


def test_paired_by_seed_is_the_t_interval_over_the_common_seeds():
    rng = np.random.default_rng(3)
    subject = {s: float(v) for s, v in zip(range(6), rng.uniform(0.3, 0.4, 6))}
    reference = {s: float(v) for s, v in zip(range(1, 8), rng.uniform(0.3, 0.4, 7))}
    d = paired_by_seed(subject, reference)
    common = [1, 2, 3, 4, 5]
    b = np.array([subject[s] for s in common])
    a = np.array([reference[s] for s in common])
    low, high = sps.ttest_rel(b, a).confidence_interval(0.95)
    assert d["seeds"] == common and d["n"] == 5
    np.testing.assert_allclose(d["differences"], b - a, rtol=0, atol=1e-15)
    assert d["mean"] == pytest.approx((b - a).mean())
    assert (d["low"], d["high"]) == (pytest.approx(low), pytest.approx(high))
    assert d["reference_mean"] == pytest.approx(a.mean())
    assert paired_by_seed(subject, reference, seeds=[5, 1, 9])["seeds"] == [5, 1]
    assert paired_by_seed({0: 0.1}, {1: 0.2}) == {"n": 0, "seeds": []}


def test_paired_t_p_value_is_scipys_paired_t_test():
    a = [0.30, 0.32, 0.31, 0.35]
    b = [0.31, 0.335, 0.312, 0.36]
    assert paired_t_p_value(paired_difference(a, b)) == pytest.approx(sps.ttest_rel(b, a).pvalue)
    assert paired_t_p_value(paired_difference([0.3], [0.4])) is None
    assert paired_t_p_value(paired_difference([0.1, 0.2], [0.1, 0.2])) == 1.0
    assert paired_t_p_value({"n": 3, "mean": 0.01, "se": 0.0}) == 0.0


def test_an_interval_prints_as_brackets_or_plus_minus_and_never_without_width():
    d = paired_difference([0.30, 0.32, 0.31], [0.31, 0.335, 0.312])
    t = sps.t.ppf(0.975, 2) * np.std([0.01, 0.015, 0.002], ddof=1) / np.sqrt(3)
    mean = np.mean([0.01, 0.015, 0.002])
    assert format_interval(d) == f"[{mean - t:+.4f}, {mean + t:+.4f}]"
    assert format_interval(d, plus_minus=True) == f"{mean:+.4f} ± {t:.4f}"
    assert format_interval(d, digits=2) == f"[{mean - t:+.2f}, {mean + t:+.2f}]"
    one = paired_difference([0.3], [0.35])
    zero = paired_difference([0.1, 0.2, 0.3], [0.11, 0.21, 0.31])
    for no_interval in (one, zero):
        assert format_interval(no_interval) == ""
        assert format_interval(no_interval, plus_minus=True) == format_signed(
            no_interval["mean"])
    assert format_signed(0.0123) == "+0.0123" and format_signed(None) == ""


def _t_intervals(diffs, confidence=0.95):
    n = diffs.shape[1]
    mean = diffs.mean(1)
    half = sps.t.ppf(0.5 + confidence / 2, n - 1) * diffs.std(1, ddof=1) / math.sqrt(n)
    return mean - half, mean + half


@pytest.mark.parametrize("n, effect, sd", [(3, 0.0173, 0.00146), (3, 0.01, 0.004),
                                           (4, 0.002, 0.003)])
def test_power_is_finite_and_matches_simulation_far_out_in_the_tail(n, effect, sd):
    """At ~20 standard errors SciPy's lower tail of the noncentral t is NaN: the power is
    taken from the right tail on both sides, and equals the simulated rejection rate."""
    rng = np.random.default_rng(11)
    diffs = rng.normal(effect, sd, size=(40_000, n))
    low, high = _t_intervals(diffs)
    rejected = np.mean((low > 0) | (high < 0))
    value = power(n, effect, sd)
    assert math.isfinite(value) and value == pytest.approx(rejected, abs=0.01)
    assert power(n, -effect, sd) == pytest.approx(value)  # two-sided: symmetric


def test_differences_apart_by_float_rounding_are_zero_spread_not_better():
    a = [0.30, 0.31, 0.32, 0.33]
    b = [0.31, 0.32 + 1e-11, 0.33, 0.34 - 1e-11]
    d = paired_difference(a, b)
    assert d["zero_spread"] and classify(d, 0.002) == "zero spread"
    assert format_interval(d) == ""
    # A spread of a millionth (a few targets of a large test split) is noise to test.
    rng = np.random.default_rng(12)
    real = paired_difference(a, (np.array(a) + 0.01 + rng.normal(0, 1e-6, 4)).tolist())
    assert not real["zero_spread"] and classify(real, 0.002) == "better"


@pytest.mark.parametrize("n, margin, sd, effect", [(3, 0.004, 0.002, 0.0), (5, 0.003, 0.002, 0.0),
                                                   (10, 0.002, 0.002, 0.0005)])
def test_equivalence_power_is_the_simulated_share_of_intervals_inside_the_margin(
        n, margin, sd, effect):
    rng = np.random.default_rng(13)
    low, high = _t_intervals(rng.normal(effect, sd, size=(40_000, n)))
    inside = np.mean((low > -margin) & (high < margin))
    assert equivalence_power(n, margin, sd, effect) == pytest.approx(inside, abs=0.01)


def test_the_pairs_for_difference_power_do_not_power_the_equivalence_reading():
    """Simulated at the pairs that give the t-test 80 % power against the margin, a true
    0 lands inside ±margin well under 80 % of the time; `pairs_for_equivalence` gives
    the pairs that do reach it."""
    rng = np.random.default_rng(14)
    margin, sd = 0.002, 0.003
    n = pairs_for_power(margin, sd)
    low, high = _t_intervals(rng.normal(0.0, sd, size=(20_000, n)))
    simulated = np.mean((low > -margin) & (high < margin))
    assert simulated < 0.7 and equivalence_power(n, margin, sd) == pytest.approx(
        simulated, abs=0.015)
    m = pairs_for_equivalence(margin, sd)
    assert m > n and equivalence_power(m, margin, sd) >= 0.8 > equivalence_power(
        m - 1, margin, sd)
    assert pairs_for_equivalence(margin, sd, effect=margin) is None
    assert pairs_for_equivalence(0.0, sd) is None


def test_seed_outliers_flag_one_percent_of_normal_seeds_and_a_shifted_one():
    rng = np.random.default_rng(15)
    n, trials = 6, 4_000
    diffs = rng.normal(0.003, 0.002, size=(trials, n))
    # Reference: the leave-one-out t statistic, vectorised over the trials.
    flags = np.array([seed_outliers(row) for row in diffs])
    others_mean = (diffs.sum(1, keepdims=True) - diffs) / (n - 1)
    others_var = ((diffs ** 2).sum(1, keepdims=True) - diffs ** 2
                  - (n - 1) * others_mean ** 2) / (n - 2)
    t = np.abs(diffs - others_mean) / np.sqrt(others_var * (1 + 1 / (n - 1)))
    np.testing.assert_array_equal(flags, t > sps.t.ppf(0.995, n - 2))
    assert flags.mean() == pytest.approx(0.01, abs=0.004)
    shifted = diffs[:200].copy()
    shifted[:, 0] += 0.05  # 25 sd off: a diverging or broken seed
    assert np.mean([seed_outliers(row)[0] for row in shifted]) > 0.95
    assert seed_outliers([0.01, 0.02]) == [False, False]
    assert seed_outliers([0.01, 0.01, 0.01, 0.02]) == [False, False, False, True]


def test_holm_controls_the_family_wise_error_in_simulation():
    """Holm's adjusted p-values against the step-down rule written out, and a family of
    5 true nulls rejects something in at most 5 % of simulated families."""
    rng = np.random.default_rng(16)
    p = rng.uniform(size=7).tolist()
    order = np.argsort(p)
    expected = np.maximum.accumulate(np.minimum(1, (7 - np.arange(7)) * np.array(p)[order]))
    np.testing.assert_allclose(np.array(holm(p))[order], expected)
    families = rng.normal(0.0, 1.0, size=(4_000, 5, 4))  # 5 paired tests of 4 pairs
    t = families.mean(2) / (families.std(2, ddof=1) / 2)
    pvalues = 2 * sps.t.sf(np.abs(t), 3)
    any_rejected = np.mean([min(holm(row.tolist())) <= 0.05 for row in pvalues])
    assert any_rejected <= 0.05 + 0.01
    assert holm([0.02, 0.3, 0.4]) == pytest.approx([0.06, 0.6, 0.6])


def test_divergence_rate_is_clopper_pearson_and_covers_in_simulation():
    d = divergence_rate(1, 5)
    assert d["rate"] == 0.2
    assert d["low"] == pytest.approx(sps.beta.ppf(0.025, 1, 5))
    assert d["high"] == pytest.approx(sps.beta.ppf(0.975, 2, 4))
    rng = np.random.default_rng(17)
    true_rate, runs = 0.1, 8
    counts = rng.binomial(runs, true_rate, size=2_000)
    intervals = {k: divergence_rate(int(k), runs) for k in set(counts.tolist())}
    covered = np.mean([intervals[k]["low"] <= true_rate <= intervals[k]["high"]
                       for k in counts.tolist()])
    assert covered >= 0.95  # exact: never below the level
    with pytest.raises(ValueError, match="diverged"):
        divergence_rate(3, 2)


def _crossed(rng, seeds, users, effect, seed_sd, user_sd, residual_sd):
    """Differences of a new draw of seeds and of test users: mu + a_s + b_u + e_su."""
    return (effect + rng.normal(0, seed_sd, (seeds, 1)) + rng.normal(0, user_sd, (1, users))
            + rng.normal(0, residual_sd, (seeds, users)))


def _pigeonhole(d, rng, resamples=200):
    """The seed x user bootstrap's percentile interval (resample seeds and users)."""
    seeds, users = d.shape

    def counts(size):  # multinomial resampling counts, [resamples, size]
        draws = rng.integers(0, size, (resamples, size)) + size * np.arange(resamples)[:, None]
        return np.bincount(draws.ravel(), minlength=resamples * size).reshape(resamples, size)

    means = np.sum((counts(seeds) @ d) * counts(users), axis=1) / (seeds * users)
    return np.quantile(means, [0.025, 0.975])


@pytest.mark.parametrize("seeds, users, seed_sd, user_sd, residual_sd", [
    (3, 300, 0.03, 0.05, 0.1),  # the seeds' noise dominates
    (3, 400, 0.01, 0.1, 0.3),   # both count
    (5, 400, 0.0, 0.3, 0.3),    # the users' noise dominates
])
def test_the_seed_user_interval_covers_new_seeds_and_new_users_95_percent(
        seeds, users, seed_sd, user_sd, residual_sd):
    """Simulated over fresh seeds *and* fresh test users: the interval covers the true
    difference 95 % of the time, its variance is unbiased, and the two intervals it
    replaces do not cover (the per-seed t ignores the users; the pigeonhole bootstrap
    misses with few seeds when the seeds' noise dominates)."""
    rng = np.random.default_rng(18)
    effect, reps = 0.01, 400
    covered, ses, means, by_seed, boot = 0, [], [], 0, 0
    for rep in range(reps):
        d = _crossed(rng, seeds, users, effect, seed_sd, user_sd, residual_sd)
        zero = np.zeros_like(d)
        got = seed_user_interval(d, zero)
        covered += got["low"] <= effect <= got["high"]
        ses.append(got["se"])
        means.append(got["mean"])
        t = paired_difference([0.0] * seeds, d.mean(1).tolist())
        by_seed += t["low"] <= effect <= t["high"]
        if seed_sd > 0.02 and rep < 100:
            low, high = _pigeonhole(d, rng)
            boot += low <= effect <= high
    assert 0.93 <= covered / reps <= 0.985  # 95 %, conservative where users dominate
    true_var = (seed_sd ** 2 / seeds + user_sd ** 2 / users
                + residual_sd ** 2 / (seeds * users))
    assert np.mean(np.square(ses)) == pytest.approx(true_var, rel=0.15)
    assert np.var(means) == pytest.approx(true_var, rel=0.2)
    if seed_sd > 0.02:
        assert boot / 100 < 0.88  # the bootstrap with 3 seeds
    if seed_sd == 0:
        assert by_seed / reps < 0.8  # the per-seed t: the users' noise left out


def test_the_seed_user_interval_on_binary_hits_per_user():
    """Hits of 0/1 per user: users with their own hit rates, a loss that turns 3 % of
    misses into hits, and seeds that move the subject's rate; coverage of the
    population's difference is 95 %."""
    rng = np.random.default_rng(19)
    seeds, users, reps = 4, 600, 300
    truth = 0.03 * (1 - 2 / 7)  # the share of misses turned: lift x P(miss), Beta(2, 5)
    covered = 0
    for _ in range(reps):
        rate = rng.beta(2, 5, users)  # a fresh draw of test users
        reference = rng.binomial(1, np.clip(rate + rng.normal(0, 0.01, (seeds, 1)), 0, 1))
        lift = np.clip(0.03 + rng.normal(0, 0.005, (seeds, 1)), 0, 1)
        subject = np.where(rng.uniform(size=(seeds, users)) < lift, 1, reference)
        got = seed_user_interval(subject, reference)
        covered += got["low"] <= truth <= got["high"]
    assert 0.92 <= covered / reps <= 0.985
    assert classify(got, 0.002) in ("better", "within noise", "equivalent")
    with pytest.raises(ValueError, match=r"\[seeds, users\]"):
        seed_user_interval(np.zeros((1, 5)), np.zeros((1, 5)))
    with pytest.raises(ValueError, match="not finite"):
        seed_user_interval(np.full((2, 3), np.nan), np.zeros((2, 3)))


def _anova_variance(d):
    """Var(mean D) of the crossed model from the two-way ANOVA, written out here:
    (MS_seed + MS_user - MS_residual) / (S U)."""
    seeds, users = d.shape
    grand, rows, columns = d.mean(), d.mean(1), d.mean(0)
    ms_seed = users * np.sum((rows - grand) ** 2) / (seeds - 1)
    ms_user = seeds * np.sum((columns - grand) ** 2) / (users - 1)
    ms_residual = np.sum((d - rows[:, None] - columns[None, :] + grand) ** 2) / (
        (seeds - 1) * (users - 1))
    return (ms_seed + ms_user - ms_residual) / (seeds * users), ms_user, ms_residual


def test_the_two_part_variance_is_the_anova_variance_with_one_evaluation():
    rng = np.random.default_rng(20)
    d = _crossed(rng, 4, 300, 0.01, 0.02, 0.1, 0.2)
    got = seed_user_difference(d.mean(1), d, np.zeros_like(d))
    want, ms_user, ms_residual = _anova_variance(d)
    assert got["se"] ** 2 == pytest.approx(want, rel=1e-9)
    assert got["mean"] == pytest.approx(d.mean())
    assert got["user_variance"] == pytest.approx((ms_user - ms_residual) / 4)
    assert got["seed_variance"] == pytest.approx(np.var(d.mean(1), ddof=1))
    assert got["half_width"] == pytest.approx(seed_user_half_width(got))
    # The p-value reads the interval's own degrees of freedom.
    t = got["mean"] / got["se"]
    assert paired_t_p_value(got) == pytest.approx(2 * sps.t.sf(abs(t), got["df"]))


@pytest.mark.parametrize("seeds, users, seed_sd, user_sd, residual_sd, window_sd", [
    (3, 300, 0.03, 0.05, 0.1, 0.01),    # the seeds' noise dominates
    (3, 400, 0.01, 0.1, 0.3, 0.005),    # both count
    (5, 400, 0.0, 0.3, 0.3, 0.0),       # the users' noise dominates
    (3, 1500, 0.002, 0.4, 0.3, 0.002),  # the users' noise dominates, 3 seeds
])
def test_the_two_part_interval_covers_new_seeds_and_new_users_95_percent(
        seeds, users, seed_sd, user_sd, residual_sd, window_sd):
    """Fresh seeds and fresh test users each draw; a seed's reported difference is the
    mean of a window whose earlier evaluations add their own noise (``window_sd``), the
    hits are those of the last evaluation: the interval covers the true difference 94-98 %
    of the time, the per-seed t only while the users' noise is small."""
    rng = np.random.default_rng(21)
    effect, reps = 0.01, 300
    covered = by_seed = 0
    for _ in range(reps):
        d = _crossed(rng, seeds, users, effect, seed_sd, user_sd, residual_sd)
        window = d.mean(1) + rng.normal(0, window_sd, seeds)
        got = seed_user_difference(window, d, np.zeros_like(d))
        covered += got["low"] <= effect <= got["high"]
        t = paired_difference([0.0] * seeds, window.tolist())
        by_seed += t["low"] <= effect <= t["high"]
    assert 0.93 <= covered / reps <= 0.985
    if user_sd >= 0.3:
        assert by_seed / reps < 0.85


@pytest.mark.parametrize("seed_sd, user_sd", [(0.001, 0.2), (0.03, 0.05), (0.01, 0.1)])
def test_seeds_and_users_for_a_narrower_interval_against_the_formula(seed_sd, user_sd):
    rng = np.random.default_rng(22)
    d = _crossed(rng, 3, 500, 0.0, seed_sd, user_sd, 0.2)
    got = seed_user_difference(d.mean(1), d, np.zeros_like(d))
    target = 0.7 * got["half_width"]
    s2, b2 = np.var(d.mean(1), ddof=1), got["user_variance"]

    def width(seeds, users):  # the half-width at other counts, from the formula
        up = s2 * (seeds - 1) / sps.chi2.ppf(0.25, seeds - 1) / seeds
        df = (up + b2 / users) ** 2 / (up ** 2 / (seeds - 1)
                                       + (b2 / users) ** 2 / got["user_df"])
        return sps.t.ppf(0.975, df) * np.sqrt(s2 / seeds + b2 / users)

    assert width(3, 500) == pytest.approx(got["half_width"])
    need = seeds_and_users_for(got, target)
    if need["users"] is not None:
        assert width(3, need["users"]) <= target < width(3, need["users"] - 1)
    else:  # the seeds' part alone (at its t) is wider than the target
        assert width(3, 1000 * 500) > target
    if need["seeds"] is not None:
        assert width(need["seeds"], 500) <= target < width(need["seeds"] - 1, 500)
    else:  # the users' part alone is wider than the target
        assert width(10_000, 500) > target
    assert need["seeds"] is not None or need["users"] is not None
    # A target below the users' part alone: no number of seeds reaches it.
    assert seeds_and_users_for(got, need["user_part"] / 2)["seeds"] is None


def test_the_two_part_interval_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="2 or more seeds"):
        seed_user_difference([0.1], np.zeros((1, 5)), np.zeros((1, 5)))
    with pytest.raises(ValueError, match=r"\[seeds, users\]"):
        seed_user_difference([0.1, 0.2], np.zeros((2, 5)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="not finite"):
        seed_user_difference([0.1, np.nan], np.zeros((2, 5)), np.zeros((2, 5)))
