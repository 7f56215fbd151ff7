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
