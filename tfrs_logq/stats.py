"""Paired comparisons of two training variants over seeds.

Two variants run with the same seed share every random draw (batches, initial
weights, dropout masks, negatives), so their difference is measured pair by pair:
``d_i = b_i - a_i``. `paired_difference` gives the mean difference, its standard
error and a Student-t confidence interval; `pairs_needed` the number of pairs for
an interval of a given half-width at a pilot's standard deviation. Pure Python
(no SciPy): the t quantile comes from the regularised incomplete beta function.
"""

from __future__ import annotations

import math
from typing import Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t distribution function with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"`df` must be positive, received {df}.")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection to
    1e-12 on `t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"`p` must be in (0, 1), received {p}.")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return 0.5 * (low + high)


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> dict:
    """``b - a`` pair by pair: ``n``, ``mean``, ``sd`` (of the differences), ``se``,
    ``half_width`` and ``low``/``high`` of the two-sided ``confidence`` t interval
    (None for fewer than 2 pairs), and ``within_noise`` (the interval holds 0).

    Raises:
      ValueError: ``a`` and ``b`` differ in length or are empty.
    """
    if len(a) != len(b) or not len(a):
        raise ValueError(f"`a` and `b` must be non-empty and paired, received lengths "
                         f"{len(a)} and {len(b)}.")
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "se": None, "half_width": None,
                "low": None, "high": None, "within_noise": None}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * se
    return {"n": n, "mean": mean, "sd": sd, "se": se, "half_width": half,
            "low": mean - half, "high": mean + half,
            "within_noise": mean - half <= 0.0 <= mean + half}


def pairs_needed(sd: float, half_width: float, confidence: float = 0.95,
                 limit: int = 100_000) -> int:
    """Fewest pairs ``n >= 2`` whose ``confidence`` t interval has half-width at most
    ``half_width`` when the paired differences have standard deviation ``sd``."""
    if sd < 0 or half_width <= 0:
        raise ValueError(f"`sd` must be >= 0 and `half_width` > 0, received {sd}, "
                         f"{half_width}.")
    for n in range(2, limit + 1):
        if t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    raise ValueError(f"more than {limit} pairs needed for half-width {half_width} at sd {sd}.")


__all__ = ["paired_difference", "pairs_needed", "t_cdf", "t_quantile"]
