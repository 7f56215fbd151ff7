"""Paired comparisons of two training variants over seeds.

Two variants run with the same seed share every random draw (batches, initial
weights, dropout masks, negatives), so their difference is measured pair by pair:
``d_i = b_i - a_i``. `paired_difference` gives the mean difference, its standard
error and a Student-t confidence interval; `pairs_needed` the number of pairs for
an interval of a given half-width at a pilot's standard deviation. The t
distribution is SciPy's (`scipy.stats.t`).
"""

from __future__ import annotations

import math
from typing import Sequence

from scipy import stats as _scipy_stats


def t_cdf(t: float, df: float) -> float:
    """Student-t distribution function with ``df`` degrees of freedom (`scipy.stats.t`)."""
    if df <= 0:
        raise ValueError(f"`df` must be positive, received {df}.")
    return float(_scipy_stats.t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (`scipy.stats.t`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"`p` must be in (0, 1), received {p}.")
    if df <= 0:
        raise ValueError(f"`df` must be positive, received {df}.")
    return float(_scipy_stats.t.ppf(p, df))


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
