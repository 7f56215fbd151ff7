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


def test_under_mirrored_strategy_a_step_is_one_devices_step_on_the_summed_gradients(
        mirrored_strategy):
    """Two replicas, each half of the rows: the replicas' gradients are summed and every
    copy takes the update one device makes on the whole batch (sparse and dense)."""
    strategy = mirrored_strategy
    table = np.arange(20, dtype=np.float32).reshape(10, 2) / 10
    dense = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    ids = tf.constant([1, 2, 3, 1])
    with strategy.scope():
        emb, w = tf.Variable(table), tf.Variable(dense)
        optimizer = LazyAdam(0.1)
        optimizer.build([emb, w])
    emb_one, w_one = tf.Variable(table), tf.Variable(dense)
    optimizer_one = LazyAdam(0.1)
    optimizer_one.build([emb_one, w_one])

    def loss(e, v, rows):
        return tf.reduce_sum(tf.matmul(tf.gather(e, rows), v) ** 2)

    def replica_step(rows):
        with tf.GradientTape() as tape:
            value = loss(emb, w, rows)
        optimizer.apply_gradients(zip(tape.gradient(value, [emb, w]), [emb, w]))

    halves = strategy.experimental_distribute_values_from_function(
        lambda ctx: ids[2 * ctx.replica_id_in_sync_group:2 * ctx.replica_id_in_sync_group + 2])

    @tf.function
    def step():
        strategy.run(replica_step, args=(halves,))

    @tf.function
    def step_one():
        with tf.GradientTape() as tape:
            value = loss(emb_one, w_one, ids)
        optimizer_one.apply_gradients(zip(tape.gradient(value, [emb_one, w_one]),
                                          [emb_one, w_one]))

    for _ in range(3):
        step(), step_one()
    assert int(optimizer.iterations.numpy()) == 3
    for var, one in ((emb, emb_one), (w, w_one)):
        copies = [v.numpy() for v in strategy.experimental_local_results(var)]
        np.testing.assert_array_equal(copies[0], copies[1])
        np.testing.assert_allclose(copies[0], one.numpy(), rtol=1e-6, atol=1e-7)
    assert not np.allclose(emb_one.numpy(), table)  # it moved
