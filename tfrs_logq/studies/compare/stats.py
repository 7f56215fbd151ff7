"""Paired comparisons of two training variants over seeds.

Two variants run with the same seed share every random draw (batches, initial
weights, dropout masks, negatives), so their difference is measured pair by pair:
``d_i = b_i - a_i``. `paired_difference` gives the mean difference, its standard
error and a Student-t confidence interval; `classify` reads it against an
equivalence margin; `power` and `pairs_for_power` give the chance of the paired t-test
to detect an effect and the pairs it needs, `equivalence_power` and
`pairs_for_equivalence` the same for the reading "no difference larger than the
margin"; `seed_outliers` flags a seed whose difference the others do not predict;
`holm` adjusts a family of p-values; `divergence_rate` gives an exact interval of a
rate of diverged runs; `seed_user_interval` counts the test users' noise too, from
hits per user, and `seed_user_difference` adds it to the seeds' differences of a window
of evaluations (`seeds_and_users_for`: the seeds and users a narrower interval needs).
The distributions are SciPy's.

The reports (``tfrs-logq compare``'s, ``benchmarks/paired_report.py``,
``benchmarks/fdr_synthetic.py``, ``benchmarks/accelerator/curve_report.py``) pair their
runs with `values_by_seed` and `paired_by_seed` and print a difference with
`format_signed` and `format_interval`:

    >>> rows = [{"loss": "a", "seed": "0", "r": "0.30"}, {"loss": "b", "seed": "0", "r": "0.31"},
    ...         {"loss": "a", "seed": "1", "r": "0.32"}, {"loss": "b", "seed": "1", "r": "0.34"},
    ...         {"loss": "a", "seed": "2", "r": "0.31"}, {"loss": "b", "seed": "2", "r": ""}]
    >>> b, a = values_by_seed(rows, "r", loss="b"), values_by_seed(rows, "r", loss="a")
    >>> d = paired_by_seed(b, a)
    >>> d["seeds"], format_signed(d["mean"]), format_interval(d)
    ([0, 1], '+0.0150', '[-0.0485, +0.0785]')
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
from scipy import stats as _scipy_stats

MIN_PAIRS = 3
"""Fewer pairs give a direction, not a verdict: with 2, the t interval uses t(1) = 12.7
and one more seed moves it by more than the difference it is meant to bound."""

ZERO_SPREAD_RTOL = 1e-9
"""Differences whose standard deviation is at most this share of the values' size count
as equal: a billionth of a Recall is below one target of any test split, so a spread
that small is float rounding, not seed noise (a t-test on it would read 1e-11 as
significant)."""


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict:
    """``b - a`` pair by pair: ``n``, ``mean``, ``sd`` (of the differences), ``se``,
    ``half_width`` and ``low``/``high`` of the two-sided ``confidence`` t interval
    (None for fewer than 2 pairs), ``zero_spread`` (every pair differs by the same
    amount, within `ZERO_SPREAD_RTOL` of the values' size: the interval has no width
    and says nothing of the noise) and
    ``within_noise`` (the interval holds 0).

    Raises:
      ValueError: ``a`` and ``b`` differ in length, are empty, or hold a value that
        is not finite (a diverged run: leave its pair out).
    """
    if len(a) != len(b) or not len(a):
        raise ValueError(f"`a` and `b` must be non-empty and paired, received lengths "
                         f"{len(a)} and {len(b)}.")
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError("a paired value is not finite (a diverged run?): leave its pair out "
                         "before comparing.")
    n = len(diffs)
    mean = sum(diffs) / n
    scale = max(abs(float(v)) for v in [*a, *b])
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "se": None, "half_width": None,
                "low": None, "high": None, "zero_spread": False, "within_noise": None}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    zero_spread = sd <= ZERO_SPREAD_RTOL * max(scale, abs(mean))
    se = sd / math.sqrt(n)
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * se
    return {"n": n, "mean": mean, "sd": sd, "se": se, "half_width": half,
            "low": mean - half, "high": mean + half, "zero_spread": zero_spread,
            "within_noise": mean - half <= 0.0 <= mean + half}


def sd_upper_limit(sd: float, n: int, confidence: float = 0.95) -> float:
    """The one-sided ``confidence`` upper limit of a standard deviation estimated from
    ``n`` values (chi-square: ``sd * sqrt((n - 1) / chi2_{1-confidence}(n - 1))``)."""
    if n < 2:
        raise ValueError(f"an upper limit of the spread needs 2 or more values, received {n}.")
    return float(sd * math.sqrt((n - 1) / _scipy_stats.chi2.ppf(1.0 - confidence, n - 1)))


def power(n: int, effect: float, sd: float, confidence: float = 0.95) -> float:
    """The power of the two-sided paired t-test at level ``1 - confidence`` with ``n``
    pairs to detect a true mean difference ``effect`` when the differences have
    standard deviation ``sd`` (noncentral t with ``delta = |effect| sqrt(n) / sd``):

        P(T > c) + P(T < -c) = sf(c; delta) + sf(c; -delta),   c = t_{(1+confidence)/2}(n-1)

    Both tails are taken from the right (SciPy's noncentral t returns NaN for the lower
    tail ``cdf(-c; delta)`` once ``delta`` is about 10).

    >>> round(power(8, 0.003, 0.004), 3), round(power(3, 0.0173, 0.00146), 6)
    (0.449, 1.0)
    """
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0
    df = n - 1
    critical = _scipy_stats.t.ppf(0.5 + confidence / 2.0, df)
    shift = abs(effect) / (sd / math.sqrt(n))
    nct = _scipy_stats.nct
    value = float(nct.sf(critical, df, shift) + nct.sf(critical, df, -shift))
    if not math.isfinite(value):
        raise ArithmeticError(f"the power of n={n}, effect={effect}, sd={sd} is not finite.")
    return min(1.0, max(0.0, value))


def equivalence_power(n: int, margin: float, sd: float, effect: float = 0.0,
                      confidence: float = 0.95) -> float:
    """The chance that the two-sided ``confidence`` t interval of ``n`` paired
    differences (true mean ``effect``, standard deviation ``sd``) lies inside
    ``(-margin, margin)``: the power of the reading "no difference larger than the
    margin" (two one-sided tests, each at ``(1 - confidence) / 2``). With ``m`` the
    mean and ``s`` the spread of the differences, ``h = t s / sqrt(n)``:

        P(-margin + h < m < margin - h) = E_s[Phi((margin - h - effect) / se)
                                              - Phi((-margin + h - effect) / se)]^+,

    integrated over ``s^2 ~ sd^2 chi2(n - 1) / (n - 1)``. At the pairs that give the
    difference test 80 % power against ``effect = margin``, a true 0 reads
    "no difference" only about 60 % of the time: the two questions need their own pairs.

    >>> round(equivalence_power(10, 0.002, 0.002), 2)
    0.61
    """
    if n < 2 or margin <= 0:
        return 0.0
    if sd <= 0:
        return 1.0 if abs(effect) < margin else 0.0
    df = n - 1
    critical = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, df))
    se = sd / math.sqrt(n)
    # h(u) = critical * sd * sqrt(u / df) / sqrt(n) reaches the margin at u = u_max.
    u_max = df * (margin * math.sqrt(n) / (critical * sd)) ** 2
    # The expectation over u ~ chi2(df) as an integral over its probabilities, by
    # Gauss-Legendre on [0, F(u_max)]: smooth there, and vectorised.
    top = float(_scipy_stats.chi2.cdf(u_max, df))
    nodes, weights = _LEGENDRE
    u = _scipy_stats.chi2.ppf(top * (nodes + 1) / 2, df)
    h = critical * sd * np.sqrt(u / df) / math.sqrt(n)
    inside = np.clip(_scipy_stats.norm.cdf((margin - h - effect) / se)
                     - _scipy_stats.norm.cdf((-margin + h - effect) / se), 0.0, None)
    return min(1.0, max(0.0, float(np.dot(weights, inside)) * top / 2))


_LEGENDRE = np.polynomial.legendre.leggauss(96)
"""Gauss-Legendre nodes and weights of `equivalence_power`'s integral (checked against
simulation in the tests)."""


def _fewest_pairs(power_at: Callable[[int], float], target_power: float,
                  limit: int) -> Optional[int]:
    """The fewest pairs ``n >= MIN_PAIRS`` with ``power_at(n) >= target_power`` (power
    grows with ``n``), or None past ``limit``."""
    if not 0 < target_power < 1:
        raise ValueError(f"`target_power` must be in (0, 1), received {target_power}.")
    low, high = MIN_PAIRS, MIN_PAIRS
    while power_at(high) < target_power:
        if high >= limit:
            return None
        low, high = high + 1, min(2 * high, limit)
    while low < high:
        middle = (low + high) // 2
        if power_at(middle) >= target_power:
            high = middle
        else:
            low = middle + 1
    return high


def pairs_for_power(effect: float, sd: float, target_power: float = 0.8,
                    confidence: float = 0.95, limit: int = 10_000) -> Optional[int]:
    """Fewest pairs (at least `MIN_PAIRS`) whose paired t-test detects ``effect`` with
    ``target_power`` at this ``sd``; None when more than ``limit`` would be needed or
    the inputs cannot give an answer (a non-finite or zero effect, a non-finite sd)."""
    if not (math.isfinite(effect) and math.isfinite(sd)) or effect == 0 or sd < 0:
        return None
    if sd == 0:
        return MIN_PAIRS
    return _fewest_pairs(lambda n: power(n, effect, sd, confidence), target_power, limit)


def pairs_for_equivalence(margin: float, sd: float, target_power: float = 0.8,
                          confidence: float = 0.95, effect: float = 0.0,
                          limit: int = 10_000) -> Optional[int]:
    """Fewest pairs (at least `MIN_PAIRS`) whose ``confidence`` interval lies inside
    ``±margin`` with ``target_power`` when the true difference is ``effect`` (default
    0): `equivalence_power`'s counterpart of `pairs_for_power`. None past ``limit`` or
    for inputs without an answer (``|effect| >= margin``, non-finite values)."""
    if not (math.isfinite(margin) and math.isfinite(sd) and math.isfinite(effect)) \
            or margin <= 0 or sd < 0 or abs(effect) >= margin:
        return None
    if sd == 0:
        return MIN_PAIRS
    return _fewest_pairs(lambda n: equivalence_power(n, margin, sd, effect, confidence),
                         target_power, limit)


def seed_outliers(differences: Sequence[float], confidence: float = 0.99) -> list[bool]:
    """Flags each seed whose difference lies outside the two-sided ``confidence``
    prediction interval of the other seeds' (leave one out:
    ``|d_i - mean_{-i}| > t_{(1+confidence)/2}(n-2) s_{-i} sqrt(1 + 1/(n-1))``). For
    normal differences each seed is flagged with probability ``1 - confidence``. Fewer
    than 3 seeds flag nothing; when the others agree exactly (within
    `ZERO_SPREAD_RTOL`), a seed that differs from them is flagged.

    >>> seed_outliers([0.010, 0.012, 0.011, 0.009, 0.060])
    [False, False, False, False, True]
    """
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n < 3:
        return [False] * n
    critical = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, n - 2))
    scale = max(float(np.max(np.abs(d))), 1e-300)
    flags = []
    for i in range(n):
        others = np.delete(d, i)
        centre, spread = float(others.mean()), float(others.std(ddof=1))
        gap = abs(float(d[i]) - centre)
        if spread <= ZERO_SPREAD_RTOL * scale:
            flags.append(gap > ZERO_SPREAD_RTOL * scale)
        else:
            flags.append(gap > critical * spread * math.sqrt(1 + 1 / (n - 1)))
    return flags


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error): sorted ascending,
    ``p_(j) * (m - j + 1)``, made non-decreasing and capped at 1. A hypothesis is
    rejected at level ``alpha`` when its adjusted p-value is at most ``alpha``.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def divergence_rate(diverged: int, runs: int, confidence: float = 0.95) -> dict:
    """``diverged`` of ``runs``: ``rate`` and the exact (Clopper-Pearson) two-sided
    ``confidence`` interval ``low``/``high`` (`scipy.stats.binomtest`).

    >>> d = divergence_rate(0, 5)
    >>> d["rate"], d["low"], round(d["high"], 3)
    (0.0, 0.0, 0.522)
    """
    if runs < 1 or not 0 <= diverged <= runs:
        raise ValueError(f"a divergence rate needs 0 <= diverged <= runs and runs >= 1, "
                         f"received {diverged} of {runs}.")
    interval = _scipy_stats.binomtest(diverged, runs).proportion_ci(confidence,
                                                                    method="exact")
    return {"diverged": diverged, "runs": runs, "rate": diverged / runs,
            "low": float(interval.low), "high": float(interval.high)}


def classify(diff: dict, margin: Optional[float]) -> str:
    """The reading of a `paired_difference` against an equivalence ``margin`` (> 0, or
    None for none): ``"no pairs"``, ``"direction only"`` (fewer than `MIN_PAIRS`),
    ``"zero spread"``, ``"better"`` / ``"worse"`` (the interval excludes 0),
    ``"equivalent"`` (the interval lies inside ``±margin``: no difference larger than
    the margin) or ``"within noise"`` (it holds 0 and reaches past the margin)."""
    n = diff.get("n", 0)
    if n == 0:
        return "no pairs"
    if n < MIN_PAIRS:
        return "direction only"
    if diff.get("zero_spread"):
        return "zero spread"
    if not diff["within_noise"]:
        return "better" if diff["mean"] > 0 else "worse"
    if margin is not None and -margin < diff["low"] and diff["high"] < margin:
        return "equivalent"
    return "within noise"


def seed_user_interval(subject_hits, reference_hits, confidence: float = 0.95) -> dict:
    """``subject - reference`` over seeds *and* test users: the interval of a difference
    that holds for the users the test split drew from, not only for the ones it holds.

    The per-seed t interval of `paired_difference` treats the test users as fixed: its
    seeds share one test split, so user-to-user noise never enters it. Given each run's
    hits per user (``[seeds, users]`` for each loss, the same users in the same order, a
    seed's row of both from one seed), the differences ``D[s, u]`` are read as crossed
    random effects ``mu + a_s + b_u + e_su``, whose mean has variance

        Var(mean D) = sigma_a^2 / S + sigma_b^2 / U + sigma_e^2 / (S U)
                    = (MS_seed + MS_user - MS_residual) / (S U)

    estimated without bias by the two-way ANOVA mean squares (a component whose mean
    square falls below the residual's is taken as 0). The t quantile takes ``S - 1``
    degrees of freedom while the seeds' term is present (Satterthwaite's, otherwise:
    with 3 seeds that one rises on exactly the draws whose seed spread came out small, and
    covers 93 %). Simulated over fresh seeds and fresh users it covers 95-97 %. Not a
    seed x user (pigeonhole) bootstrap: with 3 to 5 seeds its percentile interval covers
    the true difference only 72-87 % of the time when the seeds' noise dominates (normal
    quantiles where t(2)-t(4) are due), and more than 95 % when the users' does.

    Args:
      subject_hits: `[seeds, users]` of the subject's hits per user (a user's mean hit
        over their test targets at the metric's k, or its Recall).
      reference_hits: `[seeds, users]`, the reference's, paired row by row and column by
        column.
      confidence: float. Of the two-sided interval. Defaults to 0.95.

    Returns: ``n`` (seeds), ``users``, ``mean``, ``se``, ``df``, ``half_width``,
    ``low``/``high``, ``within_noise``, ``zero_spread`` (as `paired_difference`'s, so
    `classify` reads it) and ``components`` (the seed, user and residual variances).

    Raises:
      ValueError: shapes that differ or hold fewer than 2 seeds or 2 users, or a value
        that is not finite (a diverged run: leave its seed's row out of both).

    >>> rng = np.random.default_rng(0)
    >>> reference = rng.binomial(1, 0.3, size=(3, 1000)).astype(float)
    >>> subject = np.where(rng.uniform(size=(3, 1000)) < 0.05, 1.0, reference)
    >>> d = seed_user_interval(subject, reference)
    >>> d["n"], d["users"], round(d["mean"], 4), d["low"] < d["mean"] < d["high"]
    (3, 1000, 0.039, True)
    """
    a = np.asarray(reference_hits, dtype=float)
    b = np.asarray(subject_hits, dtype=float)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < 2:
        raise ValueError(f"`subject_hits` and `reference_hits` must both be [seeds, users] "
                         f"with 2 or more of each, received shapes {b.shape} and {a.shape}.")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a hit is not finite (a diverged run?): leave that seed's row out "
                         "of both arrays before comparing.")
    d = b - a
    seeds, users = d.shape
    mean = float(d.mean())
    by_seed, by_user = d.mean(1), d.mean(0)
    ms_seed = users * float(((by_seed - mean) ** 2).sum()) / (seeds - 1)
    ms_user = seeds * float(((by_user - mean) ** 2).sum()) / (users - 1)
    residual = d - by_seed[:, None] - by_user[None, :] + mean
    ms_residual = float((residual ** 2).sum()) / ((seeds - 1) * (users - 1))
    use_seed, use_user = ms_seed > ms_residual, ms_user > ms_residual
    terms = [(1.0 * use_seed, ms_seed, seeds - 1), (1.0 * use_user, ms_user, users - 1),
             (1.0 - use_seed - use_user, ms_residual, (seeds - 1) * (users - 1))]
    combined = sum(c * ms for c, ms, _ in terms)  # = S U Var(mean D), at least 0
    scale = max(float(np.abs(a).max()), float(np.abs(b).max()), abs(mean))
    zero_spread = combined <= (ZERO_SPREAD_RTOL * scale) ** 2
    se = math.sqrt(max(combined, 0.0) / (seeds * users))
    if use_seed:  # the seeds' term, on S - 1 degrees of freedom, bounds the rest
        df = float(seeds - 1)
    else:
        denominator = sum((c * ms) ** 2 / df for c, ms, df in terms if c)
        df = combined ** 2 / denominator if denominator > 0 else float(seeds - 1)
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, df)) * se
    components = {"seed": max(0.0, (ms_seed - ms_residual) / users),
                  "user": max(0.0, (ms_user - ms_residual) / seeds), "residual": ms_residual}
    return {"n": seeds, "users": users, "mean": mean, "se": se, "df": float(df),
            "half_width": half, "low": mean - half, "high": mean + half,
            "within_noise": mean - half <= 0.0 <= mean + half, "zero_spread": zero_spread,
            "components": components}


def seed_user_difference(seed_differences: Sequence[float], subject_hits, reference_hits,
                         confidence: float = 0.95) -> dict:
    """``subject - reference`` over seeds *and* test users, in two parts: the seeds' part
    from each seed's difference of the results (``seed_differences``, e.g. the mean of a
    late window of evaluations), the users' part from the hits per user of one evaluation
    (the last). With ``s^2`` the variance of the ``S`` seed differences and ``sigma_b^2``
    the users' variance component of the hits' differences ``D[s, u]`` (crossed random
    effects ``mu + a_s + b_u + e_su``, as `seed_user_interval`; ``(MS_user -
    MS_residual) / S_h`` from the two-way ANOVA of the ``S_h`` seeds with hits, or the
    users' variance of ``D`` with one seed):

        Var(mean d) = s^2 / S + sigma_b^2 / U

    ``s^2 / S`` holds the seeds' and the residual's noise of the runs as they are
    reported; ``sigma_b^2 / U``, the noise of drawing ``U`` test users, does not shrink
    with more seeds. With one window evaluation (the hits' seed means are the seed
    differences) this is `seed_user_interval`'s variance. The t quantile takes
    Satterthwaite's degrees of freedom with the seeds' part at its upper 75 % limit
    (`seed_user_interval`'s ``S - 1`` covers 99-100 % when the users' part dominates);
    simulated over fresh seeds and users it covers 94-97 %. When every seed differs by
    the same amount the interval comes from the users alone.

    Args:
      seed_differences: ``[S]``, each seed's ``subject - reference``.
      subject_hits: ``[S_h, U]`` of the subject's hits per user at the metric's k, each a
        user's hits divided by the mean number of targets per user (so that their mean
        over users is the metric), ``S_h >= 1`` seeds.
      reference_hits: ``[S_h, U]``, the reference's, paired row by row and column by
        column.
      confidence: float. Of the two-sided interval. Defaults to 0.95.

    Returns: `paired_difference`'s keys (``n`` the seeds, ``mean`` that of
    ``seed_differences``, ``sd`` their spread, ``se``, ``half_width``, ``low``/``high``,
    ``zero_spread``, ``within_noise``) and ``users``, ``df``, ``seed_variance``
    (``s^2``), ``user_variance`` (``sigma_b^2``), ``user_df``: `seed_user_half_width`
    gives the half-width at other numbers of seeds and users, `seeds_and_users_for` the
    seeds or users an interval of a given half-width needs.

    Raises:
      ValueError: fewer than 2 seed differences, hits of other shapes or with fewer than 2
        users, or a value that is not finite.

    >>> rng = np.random.default_rng(0)
    >>> reference = rng.binomial(1, 0.3, size=(3, 2000)).astype(float)
    >>> subject = np.maximum(reference, rng.uniform(size=2000) < 0.05)  # the same users gain
    >>> seed_only = paired_difference([0.0] * 3, [0.034, 0.036, 0.035])
    >>> d = seed_user_difference([0.034, 0.036, 0.035], subject, reference)
    >>> d["mean"], d["users"], d["half_width"] > seed_only["half_width"]
    (0.035, 2000, True)
    """
    d = np.asarray(seed_differences, dtype=float)
    a = np.asarray(reference_hits, dtype=float)
    b = np.asarray(subject_hits, dtype=float)
    if d.ndim != 1 or len(d) < 2:
        raise ValueError(f"`seed_differences` must hold 2 or more seeds, received "
                         f"{d.shape}.")
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 2:
        raise ValueError(f"`subject_hits` and `reference_hits` must both be [seeds, users] "
                         f"with 1 or more seeds and 2 or more users, received shapes "
                         f"{b.shape} and {a.shape}.")
    if not (np.isfinite(d).all() and np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a difference or a hit is not finite (a diverged run?): leave "
                         "that seed out before comparing.")
    seeds, (hit_seeds, users) = len(d), a.shape
    hits = b - a
    by_user = hits.mean(0)
    ms_user = hit_seeds * float(((by_user - by_user.mean()) ** 2).sum()) / (users - 1)
    if hit_seeds > 1:
        by_seed = hits.mean(1)
        residual = hits - by_seed[:, None] - by_user[None, :] + float(hits.mean())
        ms_residual = float((residual ** 2).sum()) / ((hit_seeds - 1) * (users - 1))
        user_df = (ms_user ** 2 / (users - 1)
                   + ms_residual ** 2 / ((hit_seeds - 1) * (users - 1)))
    else:  # one seed: the users' variance holds the residual's too (an upper estimate)
        ms_residual, user_df = 0.0, ms_user ** 2 / (users - 1)
    user_variance = max(0.0, ms_user - ms_residual) / hit_seeds
    mean = float(d.mean())
    seed_variance = float(d.var(ddof=1))
    scale = max(float(np.abs(d).max()), float(np.abs(a).max()), float(np.abs(b).max()))
    if math.sqrt(seed_variance) <= ZERO_SPREAD_RTOL * scale:
        seed_variance = 0.0  # every seed differs by the same amount
    user_df = (ms_user - ms_residual) ** 2 / user_df if user_df > 0 else float(users - 1)
    out = {"n": seeds, "users": users, "mean": mean, "sd": math.sqrt(seed_variance),
           "seed_variance": seed_variance, "user_variance": user_variance,
           "user_df": max(1.0, user_df)}
    se = math.sqrt(seed_variance / seeds + user_variance / users)
    zero_spread = se <= ZERO_SPREAD_RTOL * scale
    df = _two_part_df(out, seeds, users)
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, df)) * se
    out.update(se=se, df=df, half_width=half, low=mean - half, high=mean + half,
               zero_spread=zero_spread, within_noise=mean - half <= 0.0 <= mean + half)
    return out


def _two_part_df(diff: dict, seeds: int, users: int) -> float:
    """`seed_user_difference`'s degrees of freedom: Satterthwaite's, the seeds' part taken
    at its upper 75 % limit (``s^2 (S - 1) / chi2_0.25(S - 1)``; the plain estimate covers
    90-93 % with 3 seeds when both parts count, on the draws whose seed spread comes out
    small); ``S - 1`` with neither part."""
    seed_part = (diff["seed_variance"] / seeds * (seeds - 1)
                 / float(_scipy_stats.chi2.ppf(0.25, seeds - 1)))
    user_part = diff["user_variance"] / users
    if seed_part + user_part <= 0:
        return float(seeds - 1)
    return (seed_part + user_part) ** 2 / (seed_part ** 2 / (seeds - 1)
                                           + user_part ** 2 / diff["user_df"])


def seed_user_half_width(diff: dict, seeds: Optional[int] = None,
                         users: Optional[int] = None, confidence: float = 0.95) -> float:
    """The half-width a `seed_user_difference` would have with ``seeds`` seeds and
    ``users`` test users (default: its own), at its variances and degrees-of-freedom
    rule: ``t * sqrt(s^2 / seeds + sigma_b^2 / users)``."""
    seeds = diff["n"] if seeds is None else int(seeds)
    users = diff["users"] if users is None else int(users)
    se = math.sqrt(diff["seed_variance"] / seeds + diff["user_variance"] / users)
    df = _two_part_df(diff, seeds, users)
    return float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, df)) * se


def seeds_and_users_for(diff: dict, half_width: float, limit: int = 10_000,
                        confidence: float = 0.95) -> dict:
    """What a `seed_user_difference` needs for an interval of ``half_width``: ``seeds``
    at its test users (None when the users' part alone is at least that wide, or past
    ``limit``), ``users`` at its seeds (None when the seeds' part alone, at its t, is, or
    past a thousand times its users), and the half-widths of each part alone at the present
    numbers (``seed_part``, ``user_part``: more users cannot shrink the first, more seeds
    the second)."""
    z = float(_scipy_stats.norm.ppf(0.5 + confidence / 2.0))
    seeds_now, users_now = diff["n"], diff["users"]
    t_now = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, diff["df"]))
    seed_part = t_now * math.sqrt(diff["seed_variance"] / seeds_now)
    user_part = t_now * math.sqrt(diff["user_variance"] / users_now)

    def fewest(width_at, low: int, top: int) -> Optional[int]:
        """The fewest n in [low, top] with width_at(n) <= half_width (it falls with n)."""
        if width_at(top) > half_width:
            return None
        high = top
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if width_at(middle) <= half_width else (middle + 1, high)
        return high

    seeds = users = None
    if z * math.sqrt(diff["user_variance"] / users_now) < half_width:
        seeds = fewest(lambda n: seed_user_half_width(diff, seeds=n,
                                                      confidence=confidence), 2, limit)
    if z * math.sqrt(diff["seed_variance"] / seeds_now) < half_width:
        users = fewest(lambda n: seed_user_half_width(diff, users=n,
                                                      confidence=confidence), 2,
                       max(limit, 1000 * users_now))
    return {"seeds": seeds, "users": users, "seed_part": seed_part, "user_part": user_part}


def paired_t_p_value(diff: dict) -> Optional[float]:
    """The two-sided p-value of the paired t-test of a `paired_difference`
    (``t = mean / se`` on ``n - 1`` degrees of freedom, or its ``df``: a
    `seed_user_difference`): 0 for zero spread with a non-zero
    mean, 1 for zero spread around 0, None for fewer than 2 pairs."""
    if diff.get("se") is None:
        return None
    if diff["se"] == 0 or diff.get("zero_spread"):
        return 0.0 if diff["mean"] else 1.0
    t = diff["mean"] / diff["se"]
    return 2.0 * float(_scipy_stats.t.sf(abs(t), diff.get("df", diff["n"] - 1)))


def finite_float(value) -> Optional[float]:
    """``float(value)`` if it is a finite number (a CSV field too), else None."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def values_by_seed(rows: Iterable[Mapping], metric: str, **match) -> dict:
    """``{seed: value}`` of ``metric`` in the ``rows`` (dicts such as `csv.DictReader`
    gives) whose fields equal ``match`` (compared as text, so ``steps=1000`` matches
    ``"1000"``); a run without a finite value (empty, missing, NaN: not finished or
    diverged) is left out, and of two rows with one seed the later counts (a rerun
    appends its row)."""
    out: dict = {}
    for row in rows:
        if any(str(row.get(k)) != str(v) for k, v in match.items()):
            continue
        value = finite_float(row.get(metric))
        if value is None:
            continue
        out[int(row["seed"])] = value
    return out


def paired_by_seed(subject: Mapping[int, float], reference: Mapping[int, float],
                   confidence: float = 0.95, seeds: Optional[Sequence[int]] = None) -> dict:
    """``subject - reference``, paired by seed: `paired_difference` over the seeds both
    hold, plus ``seeds`` (those used, in the order of ``seeds``, default ascending),
    ``differences`` (per seed) and ``reference_mean``. ``{"n": 0, "seeds": []}`` when
    no seed is common.

    Args:
      subject: ``{seed: value}``, e.g. from `values_by_seed`.
      reference: ``{seed: value}``.
      confidence: float. Of the t interval. Defaults to 0.95.
      seeds: optional order (and choice) of the seeds to pair. Defaults to all, ascending.
    """
    order = sorted(subject) if seeds is None else list(seeds)
    common = [s for s in order if s in subject and s in reference]
    if not common:
        return {"n": 0, "seeds": []}
    out = paired_difference([reference[s] for s in common], [subject[s] for s in common],
                            confidence)
    out["seeds"] = common
    out["differences"] = [float(subject[s]) - float(reference[s]) for s in common]
    out["reference_mean"] = float(np.mean([reference[s] for s in common]))
    return out


def format_signed(x: Optional[float], digits: int = 4) -> str:
    """``+0.0123``; ``""`` for None."""
    return "" if x is None else f"{x:+.{digits}f}"


def format_interval(diff: dict, digits: int = 4, plus_minus: bool = False) -> str:
    """A `paired_difference`'s interval as a table prints it: ``[-0.0010, +0.0040]``, or
    with ``plus_minus`` ``+0.0015 ± 0.0025`` (mean and half-width). Without an interval
    (fewer than 2 pairs, or zero spread, whose interval has no width and says nothing of
    the noise): ``""``, or with ``plus_minus`` the mean alone."""
    if diff.get("half_width") is None or diff.get("zero_spread"):
        return format_signed(diff.get("mean"), digits) if plus_minus else ""
    if plus_minus:
        return f"{diff['mean']:+.{digits}f} ± {diff['half_width']:.{digits}f}"
    return f"[{diff['low']:+.{digits}f}, {diff['high']:+.{digits}f}]"


__all__ = ["MIN_PAIRS", "ZERO_SPREAD_RTOL", "classify", "divergence_rate",
           "equivalence_power", "finite_float", "format_interval", "format_signed", "holm",
           "paired_by_seed", "paired_difference", "paired_t_p_value",
           "pairs_for_equivalence", "pairs_for_power", "power", "sd_upper_limit",
           "seed_outliers", "seed_user_difference", "seed_user_half_width",
           "seed_user_interval", "seeds_and_users_for", "values_by_seed"]
