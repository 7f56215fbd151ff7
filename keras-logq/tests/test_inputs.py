"""Input checks and argument names shared with TFRS and Keras-RS.

``log Q > 0`` (a probability above 1: a batch-level probability or a count) is
refused, eagerly with a `ValueError` and, while traced, the way each backend can
(`keras_logq.losses.check_log_q`): before, it returned a negative loss. The sampling
probability goes by tfrs_logq's ``candidate_log_sampling_probability`` or
TFRS/Keras-RS's ``candidate_sampling_probability``, no other name."""

import keras
import numpy as np
import pytest
import reference
from conftest import BACKEND, jit, to_numpy, value_and_grads
from keras_logq import CorrectedRetrieval, check_log_q, sampled_softmax_loss

REFUSED = "log Q <= 0"


def _plain_case(rng, b=4, n=5):
    s_p = rng.normal(size=b).astype("float32")
    s_n = rng.normal(size=(b, n)).astype("float32")
    log_q = np.log(rng.uniform(0.01, 0.3, size=(b, n))).astype("float32")
    return s_p, s_n, log_q


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_plain_loss_refuses_log_q_above_zero(rng, correction):
    s_p, s_n, log_q = _plain_case(rng)
    log_q[1, 2] = 0.7  # Q = 2.0
    # The old code returned a number (negative for large enough log Q) here.
    with pytest.raises(ValueError, match=f"`negative_log_q` must be .*{REFUSED}.*0.7"):
        sampled_softmax_loss(s_p, s_n, correction=correction, negative_log_q=log_q)


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_plain_loss_ignores_masked_entries_and_the_tolerance(rng, correction):
    s_p, s_n, log_q = _plain_case(rng)
    mask = np.ones(s_n.shape, bool)
    log_q[1, 2], mask[1, 2] = 5.0, False  # not a negative: may hold anything
    log_q[0, 0] = 5e-6  # float32 rounding of Q = 1 computed from counts
    loss = to_numpy(sampled_softmax_loss(s_p, s_n, correction=correction,
                                         negative_log_q=log_q, is_negative=mask))
    ref_fn = reference.loss_logq if correction == "logq-official" else reference.loss_corrected
    np.testing.assert_allclose(loss, ref_fn(s_p, s_n, log_q.astype(float), mask)[0],
                               rtol=1e-5, atol=1e-6)


def test_plain_loss_refuses_positive_log_q_above_zero(rng):
    s_p, s_n, log_q = _plain_case(rng)
    with pytest.raises(ValueError, match=f"`positive_log_q` must be .*{REFUSED}"):
        sampled_softmax_loss(s_p, s_n, correction="logq-tfrs", negative_log_q=log_q,
                             positive_log_q=np.array([0.0, 0.1, -1.0, -2.0], "float32"))


def _refused_while_compiled(fn, args):
    """Runs ``fn`` compiled (jax.jit, torch.compile, tf.function(jit_compile=True)) on
    inputs with log Q > 0: JAX and PyTorch raise with the message; TensorFlow's XLA drops
    assertions, so the offending rows come out NaN (and a plain tf.function raises)."""
    tensors = [keras.ops.convert_to_tensor(a) for a in args]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        out = to_numpy(jit(fn)(*tensors))
        with pytest.raises(tf.errors.InvalidArgumentError, match=REFUSED):
            tf.function(fn)(*tensors)
        return out
    with pytest.raises(Exception, match=REFUSED):
        out = jit(fn)(*tensors)
        to_numpy(out)  # JAX reports a callback's error when the result is read
    return None


def test_plain_loss_refuses_log_q_above_zero_when_compiled(rng):
    s_p, s_n, log_q = _plain_case(rng)
    log_q[1, 2] = 0.7

    def fn(sp, sn, lq):
        return sampled_softmax_loss(sp, sn, correction="corrected", negative_log_q=lq)

    out = _refused_while_compiled(fn, [s_p, s_n, log_q])
    if out is not None:
        assert np.isnan(out[1]) and np.isfinite(out[[0, 2, 3]]).all()
    # Valid inputs compile and run as before.
    good = to_numpy(jit(fn)(*[keras.ops.convert_to_tensor(a)
                              for a in (s_p, s_n, np.minimum(log_q, 0.0))]))
    assert np.isfinite(good).all()


def _layer_case(rng, b=5):
    scores = rng.normal(size=(b, b)).astype("float32")
    ids = np.array([3, 5, 3, 8, 9], "int32")
    q = rng.uniform(0.01, 0.3, size=b).astype("float32")
    return scores, ids, q


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_layer_refuses_probability_above_one(rng, correction):
    scores, ids, q = _layer_case(rng)
    layer = CorrectedRetrieval(correction=correction, reduction="none")
    bad_q = q.copy()
    bad_q[2] = 1.8  # B * Q, a batch-level probability
    with pytest.raises(ValueError, match=f"`candidate_log_sampling_probability` .*{REFUSED}"):
        layer(scores, ids, np.log(bad_q))
    with pytest.raises(ValueError, match="`candidate_sampling_probability` .*0 <= Q <= 1"):
        layer(scores, ids, candidate_sampling_probability=bad_q)
    bad_q[2] = -0.1
    with pytest.raises(ValueError, match="`candidate_sampling_probability` .*0 <= Q <= 1"):
        layer(scores, ids, candidate_sampling_probability=bad_q)


def test_layer_refuses_log_q_above_zero_when_compiled(rng):
    scores, ids, q = _layer_case(rng)
    log_q = np.log(q)
    log_q[2] = 0.6
    layer = CorrectedRetrieval(reduction="none")
    out = _refused_while_compiled(lambda s, i, lq: layer(s, i, lq), [scores, ids, log_q])
    if out is not None:  # TensorFlow XLA: row 2 (positive's Q' from NaN) and rows using it
        assert np.isnan(out[2])


def test_check_log_q_names_the_argument_and_passes_valid_values():
    valid = np.log([0.5, 1.0]).astype("float32")
    np.testing.assert_array_equal(to_numpy(check_log_q(valid, "x")), valid)
    with pytest.raises(ValueError, match="`my_log_q` must be .*maximum of 2"):
        check_log_q(np.array([2.0, -1.0]), "my_log_q")


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_the_two_names_and_the_position_give_identical_losses_and_gradients(rng, correction):
    scores, ids, q = _layer_case(rng)
    q = np.clip(q, 1e-3, 1.0)
    log_q = np.log(q).astype("float32")
    layer = CorrectedRetrieval(correction=correction, reduction="none")
    by_log, (g_log,) = value_and_grads(
        lambda s: layer(s, ids, candidate_log_sampling_probability=log_q), [scores], [0])
    by_q, (g_q,) = value_and_grads(
        lambda s: layer(s, ids, candidate_sampling_probability=q), [scores], [0])
    by_position, _ = value_and_grads(lambda s: layer(s, ids, log_q), [scores], [0])
    np.testing.assert_array_equal(by_position, by_log)
    # Q goes through log(clip(Q, 1e-6, 1)): equal to float32 rounding of exp/log.
    np.testing.assert_allclose(by_q, by_log, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g_q, g_log, rtol=1e-6, atol=1e-6)
    # TFRS and Keras-RS clip Q at 1e-6 before the log: Q = 0 is log(1e-6).
    q0 = q.copy()
    q0[4] = 0.0
    log_q0 = log_q.copy()
    log_q0[4] = np.log(np.float32(1e-6))
    np.testing.assert_allclose(to_numpy(layer(scores, ids, candidate_sampling_probability=q0)),
                               to_numpy(layer(scores, ids, log_q0)), rtol=1e-6)


def test_two_names_at_once_is_an_error(rng):
    scores, ids, q = _layer_case(rng)
    with pytest.raises(ValueError, match="not both"):
        CorrectedRetrieval()(scores, ids, np.log(q), candidate_sampling_probability=q)


def test_missing_probability_names_both_arguments():
    with pytest.raises(ValueError, match="needs `candidate_sampling_probability` "
                                         r"\(or `candidate_log_sampling_probability`\)"):
        CorrectedRetrieval()(np.zeros((2, 3), "float32"), np.array([1, 2, 3], "int32"))


def test_min_sampling_probability_is_configurable_and_saved(rng):
    scores, ids, q = _layer_case(rng)
    q[1] = 1e-9
    layer = CorrectedRetrieval(min_sampling_probability=1e-3, reduction="none")
    clipped = np.log(np.maximum(q, 1e-3)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(scores, ids, candidate_sampling_probability=q)),
                               to_numpy(layer(scores, ids, clipped)), rtol=1e-6)
    clone = CorrectedRetrieval.from_config(layer.get_config())
    assert clone.min_sampling_probability == 1e-3
    with pytest.raises(ValueError, match="min_sampling_probability"):
        CorrectedRetrieval(min_sampling_probability=0.0)


def test_validate_false_skips_the_log_q_check_and_changes_nothing_else():
    import numpy as np

    from keras_logq.losses import sampled_softmax_loss

    args = (np.array([2.0, 1.0], "float32"), np.array([[0.0, 1.0], [0.5, -1.0]], "float32"))
    bad = np.log(np.array([[2.0, 0.4], [0.2, 0.3]], "float32"))  # Q = 2 > 1
    with pytest.raises(ValueError, match="negative_log_q"):
        sampled_softmax_loss(*args, correction="corrected", negative_log_q=bad)
    skipped = sampled_softmax_loss(*args, correction="corrected", negative_log_q=bad,
                                   validate=False)
    assert np.isfinite(np.asarray(skipped)).all()
    good = np.log(np.array([[0.2, 0.4], [0.2, 0.3]], "float32"))
    np.testing.assert_allclose(
        np.asarray(sampled_softmax_loss(*args, correction="logq-official", negative_log_q=good)),
        np.asarray(sampled_softmax_loss(*args, correction="logq-official", negative_log_q=good,
                                        validate=False)))
