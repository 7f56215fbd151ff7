"""numpy references computed from the paper's formulas (float64)."""

import numpy as np


def logsumexp(x):
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return -np.inf
    m = x.max()
    return m + np.log(np.exp(x - m).sum())


def softmax(x):
    x = np.asarray(x, np.float64)
    return np.exp(x - logsumexp(x))


def loss_none(s_p, s_n, mask):
    """-s_p + log(e^{s_p} + sum_i e^{s_i}); returns (loss, dL/ds_p, dL/ds_n)."""
    out, g_p, g_n = [], [], np.zeros_like(s_n, np.float64)
    for r in range(len(s_p)):
        terms = np.concatenate([[s_p[r]], s_n[r][mask[r]]])
        out.append(logsumexp(terms) - s_p[r])
        sm = softmax(terms)
        g_p.append(sm[0] - 1.0)
        g_n[r, mask[r]] = sm[1:]
    return np.array(out), np.array(g_p), g_n


def loss_logq(s_p, s_n, log_q, mask, log_q_p=None):
    """-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})."""
    out, g_p, g_n = [], [], np.zeros_like(s_n, np.float64)
    for r in range(len(s_p)):
        pos = s_p[r] - (0.0 if log_q_p is None else log_q_p[r])
        terms = np.concatenate([[pos], (s_n[r] - log_q[r])[mask[r]]])
        out.append(logsumexp(terms) - s_p[r])
        sm = softmax(terms)
        g_p.append(sm[0] - 1.0)
        g_n[r, mask[r]] = sm[1:]
    return np.array(out), np.array(g_p), g_n


def loss_corrected(s_p, s_n, log_q_prime, mask, inclusion=False):
    """-w (s_p - log sum_i e^{s_i - log Q'(d_i)}), w = 1 - P held constant. With
    ``inclusion``, ``log_q_prime`` holds log inclusion probabilities and P's
    normaliser is the Horvitz-Thompson sum (no 1/n)."""
    out, g_p, g_n, weights = [], [], np.zeros_like(s_n, np.float64), []
    for r in range(len(s_p)):
        adj = (s_n[r] - log_q_prime[r])[mask[r]]
        n = adj.size
        if n == 0:
            out.append(0.0), g_p.append(0.0), weights.append(0.0)
            continue
        lse = logsumexp(adj)
        # P = e^{s_p} / (e^{s_p} + (1/n) sum e^{adj}), in log space.
        p = np.exp(s_p[r] - np.logaddexp(s_p[r], lse - (0.0 if inclusion else np.log(n))))
        w = 1.0 - p
        weights.append(w)
        out.append(-w * (s_p[r] - lse))
        g_p.append(-w)
        g_n[r, mask[r]] = w * softmax(adj)
    return np.array(out), np.array(g_p), g_n, np.array(weights)


COUNT_MIN_PRIME = 2**31 - 1


def count_min_cells(ids, depth, width, seed):
    """`[depth, n]` flat counter indices ``r * width + ((a_r lo + a_r^2 hi + b_r) mod p) mod
    width`` of a count-min sketch, ``d = hi * 2^31 + lo`` (``p = 2^31 - 1``, ``a, b`` drawn
    by ``numpy.random.default_rng(seed)``), with Python integers: no overflow."""
    rng = np.random.default_rng(seed)
    p = COUNT_MIN_PRIME
    a, b = rng.integers(1, p, size=depth).tolist(), rng.integers(0, p, size=depth).tolist()

    def cell(r, d):
        hi, lo = divmod(int(d), 2**31)
        return r * width + (a[r] * lo + a[r] ** 2 * hi + b[r]) % p % width

    return np.array([[cell(r, d) for d in ids] for r in range(depth)],
                    np.int64).reshape(depth, len(ids))
