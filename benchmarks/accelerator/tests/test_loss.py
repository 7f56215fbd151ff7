"""The study's loss (`benchmarks/accelerator/loss.py`) against the numpy references of the
paper's formulas (tests/reference.py, float64): every correction under a per-draw
(unigram) and the inclusion proposal, values and gradients, eager and jitted, with rows
that have no valid negative, one negative, and a positive with ``Q(p) = 1``.

    KERAS_BACKEND=jax .venv-keras/bin/python -m pytest -q benchmarks/accelerator/tests
"""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "keras-logq"))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # reference.py: numpy only
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import reference  # noqa: E402

from benchmarks.accelerator.loss import CORRECTIONS, study_loss  # noqa: E402

# The study computes in float32: Q(p) is capped at float32's 1 - 1e-6 (0.99999899).
Q_CAP = float(np.float32(1.0 - 1e-6))


def _inputs(seed=0, batch=8, k=12):
    """float64 logits and ``log Q`` of a catalog of 40, `[k]` shared negatives (the last
    two padding: ``log Q = 0``, never valid) and a mask with special rows."""
    rng = np.random.default_rng(seed)
    s_p = rng.normal(size=batch) * 2
    s_n = rng.normal(size=(batch, k)) * 2
    q = rng.dirichlet(np.ones(40) * 0.5) + 1e-4
    q /= q.sum()
    log_q_n = np.log(q[rng.integers(0, 40, size=k)])
    log_q_n[-2:] = 0.0
    log_q_p = np.log(q[rng.integers(0, 40, size=batch)])
    log_q_p[2], log_q_p[3] = 0.0, np.log(0.999)  # Q(p) = 1 (capped), Q(p) near 1
    mask = rng.random((batch, k)) < 0.7
    mask[:, -2:] = False
    mask[0] = False  # no valid negative
    mask[1] = False
    mask[1, 4] = True  # one
    return s_p, s_n, log_q_p, log_q_n, mask


def _loss_w1(s_p, s_n, log_q_prime, mask):
    """``-(s_p - log sum_i e^{s_i - log Q'(d_i)})``: the corrected loss with ``w = 1``."""
    out, g_p, g_n = np.zeros(len(s_p)), np.zeros(len(s_p)), np.zeros_like(s_n)
    for r in range(len(s_p)):
        if mask[r].any():
            adjusted = (s_n[r] - log_q_prime[r])[mask[r]]
            out[r] = reference.logsumexp(adjusted) - s_p[r]
            g_p[r] = -1.0
            g_n[r, mask[r]] = reference.softmax(adjusted)
    return out, g_p, g_n


def reference_loss(correction, inclusion, s_p, s_n, log_q_p, log_q_n, mask):
    """(loss, dL/ds_p, dL/ds_n) from tests/reference.py; ``log Q'`` excludes ``Q(p)``
    for per-draw proposals, an inclusion ``log pi`` is used as given."""
    log_q = np.broadcast_to(log_q_n, s_n.shape)
    if correction == "none":
        return reference.loss_none(s_p, s_n, mask)
    if correction == "logq-tfrs":
        return reference.loss_logq(s_p, s_n, log_q, mask, log_q_p)
    if correction == "logq-official":
        return reference.loss_logq(s_p, s_n, log_q, mask)
    log_q_prime = log_q if inclusion else (
        log_q - np.log1p(-np.minimum(np.exp(log_q_p), Q_CAP))[:, None])
    if correction == "corrected":
        return reference.loss_corrected(s_p, s_n, log_q_prime, mask, inclusion)[:3]
    return _loss_w1(s_p, s_n, log_q_prime, mask)


def _study(correction, inclusion, log_q_p, log_q_n, mask):
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return lambda a, b: study_loss(correction, a, b, positive_log_q=f32(log_q_p),
                                   negative_log_q=f32(log_q_n), is_negative=jnp.asarray(mask),
                                   inclusion=inclusion)


CASES = [(c, inclusion) for c in CORRECTIONS for inclusion in (False, True)]


@pytest.mark.parametrize("correction,inclusion", CASES)
@pytest.mark.parametrize("jit", [False, True])
def test_values_and_gradients_match_the_reference(correction, inclusion, jit):
    s_p, s_n, log_q_p, log_q_n, mask = _inputs()
    fn = _study(correction, inclusion, log_q_p, log_q_n, mask)
    value_and_grad = jax.value_and_grad(lambda a, b: fn(a, b).sum(), argnums=(0, 1))
    if jit:
        fn, value_and_grad = jax.jit(fn), jax.jit(value_and_grad)
    args = (jnp.asarray(s_p, jnp.float32), jnp.asarray(s_n, jnp.float32))
    loss = np.asarray(fn(*args), np.float64)
    _, (g_p, g_n) = value_and_grad(*args)
    want, want_p, want_n = reference_loss(correction, inclusion, s_p, s_n, log_q_p, log_q_n,
                                          mask)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(g_p), want_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_n), want_n, rtol=1e-5, atol=1e-6)
    # Masked entries (padding with log Q = 0 among them) get no gradient.
    assert np.all(np.asarray(g_n)[~mask] == 0.0)
    if correction.startswith("corrected"):  # no valid negative: no loss, no gradient
        assert loss[0] == 0.0 and np.asarray(g_p)[0] == 0.0


def test_the_proposal_and_the_weight_change_the_loss():
    """The references tell the cases apart on these inputs: the inclusion weight against
    the per-draw one, ``w = 1`` against the weight, and ``log Q'`` at the capped
    ``Q(p) = 1`` row (elsewhere ``log(1 - Q(p))`` is small: ``w = 1`` reads it only there)."""
    s_p, s_n, log_q_p, log_q_n, mask = _inputs()
    args = (jnp.asarray(s_p, jnp.float32), jnp.asarray(s_n, jnp.float32))
    got = {case: np.asarray(_study(*case, log_q_p, log_q_n, mask)(*args)) for case in CASES}
    rows = mask.any(1)
    for a, b in ((("corrected", False), ("corrected", True)),
                 (("corrected", False), ("corrected-w1", False)),
                 (("corrected", True), ("corrected-w1", True))):
        assert np.all(np.abs(got[a] - got[b])[rows] > 1e-4), (a, b)  # float32 noise: 1e-6
    # Q(p) = 1 in row 2: log Q' is log Q + 13.8 there, not log Q.
    uncapped = reference_loss("corrected-w1", True, s_p, s_n, log_q_p, log_q_n, mask)[0]
    assert uncapped[2] - got[("corrected-w1", False)][2] == pytest.approx(13.80, abs=0.01)


def test_a_bare_logq_is_refused_naming_both_forms():
    s_p, s_n, log_q_p, log_q_n, mask = _inputs()
    with pytest.raises(ValueError, match=r"^correction 'logq' is ambiguous: use 'logq-tfrs' "
                                         r"\(TFRS's .*'logq-official' \(the paper's code"):
        _study("logq", False, log_q_p, log_q_n, mask)(jnp.asarray(s_p, jnp.float32),
                                                     jnp.asarray(s_n, jnp.float32))
    with pytest.raises(ValueError, match=r"`correction` must be one of .*corrected-w1"):
        _study("corrected-w2", False, log_q_p, log_q_n, mask)(
            jnp.asarray(s_p, jnp.float32), jnp.asarray(s_n, jnp.float32))
