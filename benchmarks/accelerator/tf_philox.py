"""TensorFlow's stateless random numbers (CPU, Philox4x32-10) in numpy.

Enough of ``tf.random.stateless_uniform`` and ``tf.random.experimental.stateless_split``
to redraw, without TensorFlow, the held-out examples of `tfrs_logq.pipelines.synthetic`
(stream batch ``10**15``): the evaluation users, their histories and targets are then
the TF study's to the bit, so that the oracle's recall and the truth's ``P`` and ``P/Q``
quantiles can be compared with its ``results.csv`` exactly.

What TensorFlow does (``stateless_random_ops.cc``, ``philox_random.h``,
``random_distributions.h``), with ``auto_select`` (Philox on CPU):

- the `[2]` int64 seed ``(s0, s1)`` is scrambled into a key and a counter by one Philox
  call with the key ``(0x3ec8f720, 0x02461e29)`` on the counter
  ``(lo s0, hi s0, lo s1, hi s1)``: key ``(r0, r1)``, counter ``(0, 0, r2, r3)``;
- every Philox call returns 4 uint32 and advances the 128-bit counter by one; output
  element ``i`` of a distribution that uses 2 words per element reads call ``i // 2``;
- float64 in [0, 1): ``x0 & 0xfffff`` and ``x1`` are the mantissa's upper 20 and lower
  32 bits of a double in [1, 2), minus 1;
- int64 in ``[lo, hi)``: ``lo + ((x1 << 32) | x0) % (hi - lo)``; full-range int64
  (``stateless_split``): ``(x1 << 32) | x0`` as int64.

Checked against TensorFlow 2.20 bit for bit (`tests/test_tf_philox.py`, skipped where
TensorFlow is absent; the repository's ``.venv`` has it).
"""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox(counter: np.ndarray, key: tuple) -> np.ndarray:
    """Philox4x32-10 of `[n, 4]` uint32 counters under one key ``(k0, k1)``: `[n, 4]`."""
    c = [counter[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    for r in range(10):
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c = [hi1 ^ c[1] ^ np.uint64(k0), lo1, hi0 ^ c[3] ^ np.uint64(k1), lo0]
        if r < 9:
            k0 = np.uint32((int(k0) + 0x9E3779B9) & 0xFFFFFFFF)  # Philox's key schedule
            k1 = np.uint32((int(k1) + 0xBB67AE85) & 0xFFFFFFFF)
    return np.stack(c, axis=1).astype(np.uint32)


def _counters(start: np.ndarray, n: int) -> np.ndarray:
    """`[n, 4]` uint32 counters ``start + i`` (128-bit little-endian words)."""
    lo = np.uint64(start[0]) | (np.uint64(start[1]) << np.uint64(32))
    hi = np.uint64(start[2]) | (np.uint64(start[3]) << np.uint64(32))
    i = np.arange(n, dtype=np.uint64)
    low = lo + i  # wraps modulo 2^64
    carry = (low < lo).astype(np.uint64)
    high = hi + carry
    return np.stack([low & _MASK32, low >> np.uint64(32), high & _MASK32,
                     high >> np.uint64(32)], axis=1).astype(np.uint32)


def key_counter(seed) -> tuple:
    """TensorFlow's ``GenerateKey``: the Philox key and start counter of a `[2]` seed."""
    s0, s1 = (int(v) & 0xFFFFFFFFFFFFFFFF for v in seed)
    counter = np.array([[s0 & 0xFFFFFFFF, s0 >> 32, s1 & 0xFFFFFFFF, s1 >> 32]], np.uint32)
    mix = philox(counter, (0x3EC8F720, 0x02461E29))[0]
    return (int(mix[0]), int(mix[1])), np.array([0, 0, mix[2], mix[3]], np.uint32)


def _words(seed, num_elements: int, words_per_element: int) -> np.ndarray:
    """`[num_elements, words_per_element]` uint32 words of the element-wise draws."""
    key, start = key_counter(seed)
    per_call = 4 // words_per_element
    calls = -(-num_elements // per_call)
    out = philox(_counters(start, calls), key).reshape(-1, words_per_element)
    return out[:num_elements]


def uniform_float64(shape, seed) -> np.ndarray:
    """``tf.random.stateless_uniform(shape, seed, dtype=tf.float64)``: [0, 1)."""
    n = int(np.prod(shape))
    w = _words(seed, n, 2).astype(np.uint64)
    bits = (np.uint64(1023) << np.uint64(52)) | ((w[:, 0] & np.uint64(0xFFFFF)) << np.uint64(32)) \
        | w[:, 1]
    return (bits.view(np.float64) - 1.0).reshape(shape)


def _uint64(shape, seed) -> np.ndarray:
    n = int(np.prod(shape))
    w = _words(seed, n, 2).astype(np.uint64)
    return (w[:, 0] | (w[:, 1] << np.uint64(32))).reshape(shape)


def uniform_int64(shape, seed, minval: int, maxval: int) -> np.ndarray:
    """``tf.random.stateless_uniform(shape, seed, minval, maxval, dtype=tf.int64)``."""
    span = np.uint64(maxval - minval)
    return (np.int64(minval) + (_uint64(shape, seed) % span).astype(np.int64))


def split(seed, num: int = 2) -> np.ndarray:
    """``tf.random.experimental.stateless_split(seed, num)``: `[num, 2]` int64 seeds."""
    return _uint64((num, 2), seed).view(np.int64)


__all__ = ["key_counter", "philox", "split", "uniform_float64", "uniform_int64"]
