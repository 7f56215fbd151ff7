"""The universal hashes of the count-min sketch and the streaming estimator (numpy only).

``h_r(d) = ((a_r (d mod p) + b_r) mod p) mod width`` for ``r = 0..depth-1``, with the
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


def buckets(ids, a, b, width: int):
    """`[depth, n]` buckets ``h_r(id)`` in ``[0, width)`` of `[n]` int64 ``ids``.

    Written with ``%`` and broadcasting only, so ``ids``, ``a`` and ``b`` may be numpy
    arrays or int64 TensorFlow tensors (``%`` is the floored modulus in both).
    """
    x = (ids % PRIME)[None, :]
    return (a[:, None] * x + b[:, None]) % PRIME % width


def flat_cells(ids, a, b, width: int):
    """`[depth, n]` indices ``r * width + h_r(id)`` of `[n]` int64 ``ids`` into a flat
    `[depth * width]` table (row ``r`` at ``[r * width, (r + 1) * width)``); numpy
    arrays or TensorFlow tensors, as `buckets`."""
    rows = np.arange(a.shape[0], dtype=np.int64) * width
    return buckets(ids, a, b, width) + rows[:, None]


__all__ = ["PRIME", "buckets", "flat_cells", "hash_coefficients"]
