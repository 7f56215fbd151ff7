"""The universal hashes of the count-min sketch and the streaming estimator (numpy only).

``h_r(d) = ((a_r lo + a_r^2 hi + b_r) mod p) mod width`` for ``r = 0..depth-1``, where
``d = hi * 2^31 + lo`` (for ids below ``2^31``: ``((a_r d + b_r) mod p) mod width``), with the
Mersenne prime ``p = 2^31 - 1`` and ``a_r`` in ``[1, p)``, ``b_r`` in ``[0, p)`` drawn by
``numpy.random.default_rng(seed)`` (Carter & Wegman 1979). `tfrs_logq.frequency` hashes
in-graph with these coefficients and this function (TensorFlow tensors), the batch
pipeline's Statistics with numpy arrays, so their counters are equal for equal
``(depth, width, seed)``; this module imports no TensorFlow, so the pipeline needs none.

    >>> a, b = np.array([3]), np.array([5])
    >>> buckets(np.array([2]), a, b, 4)  # (3 * 2 + 5) mod p mod 4
    array([[3]])
"""

from __future__ import annotations

import numpy as np

PRIME = (1 << 31) - 1  # a Mersenne prime above every int32 id; a * x + b fits int64


def hash_coefficients(depth: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)``, `[depth]` int64 each: the coefficients of ``depth`` hashes for ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, PRIME, size=depth), rng.integers(0, PRIME, size=depth)


LIMB = 1 << 31  # an int64 id is split into two limbs below and above 2^31


def buckets(ids, a, b, width: int):
    """`[depth, n]` buckets ``h_r(id)`` in ``[0, width)`` of `[n]` int64 ``ids``.

    An id is read as two limbs, ``id = hi * 2^31 + lo``, and hashed as the polynomial
    ``(a_r lo + a_r^2 hi + b_r) mod p``: two distinct 64-bit ids (string fingerprints,
    large integer ids) collide in a row with probability at most ``2 / p`` over the
    coefficients, never in every row at once because they agree mod ``p``. For ids below
    ``2^31`` (``hi = 0``) this is ``(a_r id + b_r) mod p``. Written with ``%``, ``//``
    and broadcasting only, so ``ids``, ``a`` and ``b`` may be numpy arrays or int64
    TensorFlow tensors (``%`` and ``//`` are floored in both); every product stays below
    ``2^62``.
    """
    lo = (ids % LIMB % PRIME)[None, :]
    hi = (ids // LIMB % PRIME)[None, :]
    a, b = a[:, None], b[:, None]
    square = a * a % PRIME
    return (a * lo % PRIME + square * hi % PRIME + b) % PRIME % width


def flat_cells(ids, a, b, width: int):
    """`[depth, n]` indices ``r * width + h_r(id)`` of `[n]` int64 ``ids`` into a flat
    `[depth * width]` table (row ``r`` at ``[r * width, (r + 1) * width)``); numpy
    arrays or TensorFlow tensors, as `buckets`."""
    rows = np.arange(a.shape[0], dtype=np.int64) * width
    return buckets(ids, a, b, width) + rows[:, None]


__all__ = ["LIMB", "PRIME", "buckets", "flat_cells", "hash_coefficients"]
