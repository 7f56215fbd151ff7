"""`tfrs_logq.stats` against SciPy and by hand."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from tfrs_logq.stats import paired_difference, pairs_needed, t_cdf, t_quantile


@pytest.mark.parametrize("df", [1, 2, 3, 5, 11, 30, 200])
def test_t_distribution_matches_scipy(df):
    for t in (-7.5, -2.0, -0.3, 0.0, 0.4, 1.7, 4.2, 31.0):
        assert t_cdf(t, df) == pytest.approx(sps.t.cdf(t, df), abs=1e-10)
    for p in (0.025, 0.3, 0.5, 0.9, 0.975, 0.995):
        assert t_quantile(p, df) == pytest.approx(sps.t.ppf(p, df), abs=1e-8)


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
    assert d["within_noise"] == (low <= 0 <= high)
    assert paired_difference([1.0], [1.5])["se"] is None
    with pytest.raises(ValueError, match="paired"):
        paired_difference([1.0, 2.0], [1.0])


def test_pairs_needed_is_the_smallest_n_reaching_the_half_width():
    sd, target = 0.008, 0.003
    n = pairs_needed(sd, target)
    assert sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n) <= target
    assert sps.t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1) > target
    with pytest.raises(ValueError, match="half_width"):
        pairs_needed(0.01, 0.0)


def test_paired_report_pairs_runs_by_seed_and_prints_the_interval():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "paired_report.py")
    spec = importlib.util.spec_from_file_location("paired_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [{"loss": loss, "seed": str(seed), "window_test_recall@20": str(value),
             "window_test_ndcg@20": str(value / 2)}
            for seed, (a, b) in enumerate([(0.370, 0.375), (0.380, 0.383), (0.372, 0.379)])
            for loss, value in (("inbatch-logq", a), ("inbatch-corrected", b))]
    rows.append({"loss": "mns-logq", "seed": "0", "window_test_recall@20": "0.36",
                 "window_test_ndcg@20": ""})  # unpaired and missing: left out
    text = module.report(rows, 0.003)
    d = paired_difference([0.370, 0.380, 0.372], [0.375, 0.383, 0.379])
    line = next(row for row in text.splitlines() if "window_test_recall@20" in row)
    assert f"{d['mean']:+.4f}" in line and f"[{d['low']:+.4f}, {d['high']:+.4f}]" in line
    assert "| 3 |" in line and "+-0.003" in text.splitlines()[0]
    assert "mns" not in text


def test_t_distribution_refuses_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="`df` must be positive"):
        t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="`df` must be positive"):
        t_quantile(0.9, -1)
    with pytest.raises(ValueError, match=r"`p` must be in \(0, 1\)"):
        t_quantile(1.0, 3)
