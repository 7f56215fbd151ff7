"""tfrs_logq.lazy_adam: `LazyAdam` against a numpy reference (repeated ids, dense
variables, untouched rows), inside a tf.function, and its argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq.lazy_adam import LazyAdam


def _numpy_lazy_adam(var, m, v, t, rows, grads, lr, b1=0.9, b2=0.999, eps=1e-7):
    summed = {}
    for r, g in zip(rows, grads):
        summed[r] = summed.get(r, 0.0) + g
    step = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    for r, g in summed.items():
        m[r] = b1 * m[r] + (1 - b1) * g
        v[r] = b2 * v[r] + (1 - b2) * g * g
        var[r] -= step * m[r] / (np.sqrt(v[r]) + eps)


def test_lazy_adam_matches_a_numpy_reference_with_repeated_ids():
    rng = np.random.default_rng(0)
    init = rng.standard_normal((6, 3))
    table = tf.Variable(init, dtype=tf.float64)
    dense = tf.Variable([1.0, -2.0], dtype=tf.float64)
    opt = LazyAdam(learning_rate=0.1)
    ref, m, v = init.copy(), np.zeros_like(init), np.zeros_like(init)
    dense_ref, dm, dv = np.array([1.0, -2.0]), np.zeros(2), np.zeros(2)
    for t, ids in enumerate([[1, 1, 4], [4, 2, 4, 4], [0, 5]], start=1):
        grads = rng.standard_normal((len(ids), 3))
        dense_grad = rng.standard_normal(2)
        opt.apply_gradients([
            (tf.IndexedSlices(tf.constant(grads), tf.constant(ids), tf.constant([6, 3])),
             table),
            (tf.constant(dense_grad), dense)])
        _numpy_lazy_adam(ref, m, v, t, ids, grads, 0.1)
        _numpy_lazy_adam(dense_ref, dm, dv, t, [0, 1], dense_grad, 0.1)
        np.testing.assert_allclose(table.numpy(), ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dense.numpy(), dense_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(table.numpy()[3], init[3])  # never in a batch: untouched
    # The docstring's example: first step of a row with g = 1 moves it by lr.
    x = tf.Variable([[0.0]], dtype=tf.float32)
    LazyAdam(0.1).apply_gradients([(tf.IndexedSlices(tf.ones([1, 1]), tf.constant([0]),
                                                     tf.constant([1, 1])), x)])
    assert float(x[0, 0]) == pytest.approx(-0.1, rel=1e-4)


def test_lazy_adam_in_a_tf_function_and_bad_arguments():
    table = tf.Variable(tf.ones([4, 2]))
    opt = LazyAdam(0.01)
    opt.build([table])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [1, 1, 2]))
        opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    step()
    step()
    assert int(opt.iterations) == 2
    np.testing.assert_array_equal(table.numpy()[[0, 3]], 1.0)
    assert (table.numpy()[[1, 2]] < 1.0).all()
    with pytest.raises(ValueError, match="learning_rate"):
        LazyAdam(0.0)
    with pytest.raises(ValueError, match="beta_2"):
        LazyAdam(0.1, beta_2=1.0)
