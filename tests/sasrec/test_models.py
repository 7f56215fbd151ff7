"""`tfrs_logq.sasrec.models`. `SASRecEncoder` is gSASRec's model: the forward pass against a
numpy reference of gSASRec's equations, its initialisation, its output table, and its
config. `TwoTowerModel` trains on the synthetic stream."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq.sasrec.models import LayerNorm, SASRecEncoder, WordDropout

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++").split()[0]) is None
    or os.environ.get("TFRS_LOGQ_NATIVE", "").lower() in ("0", "off", "false", "no"),
    reason="no C++ compiler to build the native kernels, or TFRS_LOGQ_NATIVE=0")


def _layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _reference_forward(encoder: SASRecEncoder, ids: np.ndarray) -> np.ndarray:
    """gSASRec's forward pass (gsasrec.py / transformer_decoder.py), written from its
    equations: x = (E[ids] + P) * m; per block q = LN1(x), attention with queries from
    q and keys/values from x, h = LN2(q + a), x = (h + FFN(h)) * m; output LN(x)."""
    w = lambda layer: [v.numpy().astype(np.float64) for v in layer.weights]  # noqa: E731
    is_item = ids != 0
    (items,), (positions,) = w(encoder.item_embedding), w(encoder.position_embedding)
    x = (items[ids] + positions[None, : ids.shape[1]]) * is_item[..., None]
    heads = encoder.num_heads
    length = ids.shape[1]
    causal = np.tril(np.ones((length, length), bool))
    for block in encoder.blocks:
        q = _layer_norm(x, *w(block.attention_norm))
        (wq, bq), (wk, bk), (wv, bv) = (w(block.attention.query), w(block.attention.key),
                                        w(block.attention.value))
        split = lambda t: np.stack(np.split(t, heads, axis=-1), 1)  # noqa: E731  [b,h,L,dh]
        qh, kh, vh = split(q @ wq + bq), split(x @ wk + bk), split(x @ wv + bv)
        scores = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(qh.shape[-1])
        visible = causal[None, None] & is_item[:, None, None, :]
        scores = np.where(visible, scores, -np.inf)
        with np.errstate(invalid="ignore"):
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            weights = weights / weights.sum(-1, keepdims=True)
        weights = np.nan_to_num(weights)  # a query that sees no key outputs 0
        attended = np.concatenate(list((weights @ vh).transpose(1, 0, 2, 3)), axis=-1)
        h = _layer_norm(q + attended, *w(block.ffn_norm))
        (w1, b1), (w2, b2) = w(block.ffn_in), w(block.ffn_out)
        x = (h + np.maximum(h @ w1 + b1, 0) @ w2 + b2) * is_item[..., None]
    return _layer_norm(x, *w(encoder.final_norm))


def _randomise_biases_and_norms(encoder, seed):
    rng = np.random.default_rng(seed)
    for v in encoder.weights:
        if "bias" in v.name or "gamma" in v.name or "beta" in v.name:
            v.assign(rng.normal(size=v.shape).astype(np.float32) * 0.3 + (
                1.0 if "gamma" in v.name else 0.0))


def _ids(seed=0, batch=4, length=7, num_ids=30):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, num_ids, size=(batch, length)).astype(np.int32)
    ids[0, :3] = 0  # left padding
    ids[1, :6] = 0  # a single item
    return ids


@pytest.mark.parametrize("num_heads", [1, 2])
def test_forward_matches_gsasrec_equations(num_heads):
    tf.keras.utils.set_random_seed(0)
    encoder = SASRecEncoder(30, 7, dim=8, num_blocks=2, num_heads=num_heads, dropout=0.5)
    ids = _ids()
    encoder(ids)
    # Random biases and layer-norm parameters, so every term of the equations counts.
    _randomise_biases_and_norms(encoder, seed=1)
    got = encoder(ids, training=False).numpy()
    np.testing.assert_allclose(got, _reference_forward(encoder, ids), atol=2e-5)
    # Dropout is active in training, inactive at inference.
    assert not np.allclose(encoder(ids, training=True).numpy(), got)


def test_initialisation_is_gsasrecs():
    tf.keras.utils.set_random_seed(0)
    encoder = SASRecEncoder(500, 50, dim=64, num_blocks=2, num_heads=1)
    encoder(_ids(num_ids=500, length=50))
    seen = []
    # Every non-trainable weight is a dropout call counter, starting at 0.
    assert all("calls" in v.name and v.numpy() == 0 for v in encoder.non_trainable_weights)
    for v in encoder.trainable_weights:
        x = v.numpy()
        if "gamma" in v.name:
            np.testing.assert_array_equal(x, 1.0)
        elif "beta" in v.name or "bias" in v.name:
            np.testing.assert_array_equal(x, 0.0)
        else:  # kernels and embeddings: truncated normal, std 0.02, cut at 2 std
            assert np.abs(x).max() <= 0.04 + 1e-7, v.name
            # std of a N(0, 0.02) truncated at 2 std is 0.02 * 0.8796
            assert x.std() == pytest.approx(0.02 * 0.8796, rel=0.1), v.name
            seen.append(x.ravel()[:64])
    # Every table and kernel is drawn separately (no two start identical).
    for i in range(len(seen)):
        for j in range(i):
            assert not np.array_equal(seen[i], seen[j])


def test_output_table_is_separate_unless_shared():
    encoder = SASRecEncoder(20, 5, dim=4)
    encoder(_ids(num_ids=20, length=5))
    # What item_embeddings() returns follows the output table, not the input one.
    encoder.output_embedding.embeddings.assign(tf.fill([20, 4], 2.0))
    encoder.item_embedding.embeddings.assign(tf.fill([20, 4], 3.0))
    np.testing.assert_array_equal(encoder.item_embeddings().numpy(), 2.0)
    with tf.GradientTape() as tape:
        score = tf.reduce_sum(encoder(_ids(num_ids=20, length=5))[:, -1] *
                              tf.gather(encoder.item_embeddings(), [3]))
    grads = tape.gradient(score, [encoder.item_embedding.embeddings,
                                  encoder.output_embedding.embeddings])
    assert all(g is not None for g in grads)
    shared = SASRecEncoder(20, 5, dim=4, share_item_embeddings=True)
    shared(_ids(num_ids=20, length=5))
    shared.item_embedding.embeddings.assign(tf.fill([20, 4], 3.0))
    np.testing.assert_array_equal(shared.item_embeddings().numpy(), 3.0)
    assert shared.output_embedding is None
    n_separate = sum(int(np.prod(v.shape)) for v in encoder.weights)
    n_shared = sum(int(np.prod(v.shape)) for v in shared.weights)
    assert n_separate - n_shared == 20 * 4


def test_config_round_trip_gives_the_same_outputs():
    encoder = SASRecEncoder(30, 7, dim=8, num_blocks=1, num_heads=2, dropout=0.2,
                            share_item_embeddings=True)
    ids = _ids()
    out = encoder(ids).numpy()
    config = json.loads(json.dumps(encoder.get_config()))
    clone = SASRecEncoder.from_config(config)
    clone(ids)
    clone.set_weights(encoder.get_weights())
    np.testing.assert_allclose(clone(ids).numpy(), out, rtol=1e-6)
    with pytest.raises(ValueError, match="divisible"):
        SASRecEncoder(30, 7, dim=6, num_heads=4)(ids)


def _ragged_ids(batch, length, num_ids, seed=0):
    """Left-padded rows of every span from empty to full, plus a row with a hole."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, length), np.int32)
    for row in range(batch):
        span = int(rng.integers(0, length + 1))
        ids[row, length - span:] = rng.integers(1, num_ids, span)
    ids[0] = rng.integers(1, num_ids, length)
    ids[0, 2] = 0  # padding inside a sequence: the span still starts at column 0
    ids[1] = 0  # no item at all
    return ids


@pytest.mark.parametrize("batch", [1, 3, 11])
def test_length_buckets_give_the_same_outputs_and_gradients(batch):
    tf.keras.utils.set_random_seed(0)
    plain = SASRecEncoder(40, 9, dim=8, num_blocks=2, num_heads=2, dropout=0.3)
    bucketed = SASRecEncoder(40, 9, dim=8, num_blocks=2, num_heads=2, dropout=0.3,
                             length_buckets=4)
    ids = _ragged_ids(max(batch, 2), 9, 40)[:batch]
    plain(ids)
    bucketed(ids)
    # Random biases and layer-norm parameters: a non-zero final-norm offset, which the
    # cut columns' outputs must equal.
    _randomise_biases_and_norms(plain, seed=2)
    bucketed.set_weights(plain.get_weights())
    # The blocks really run on groups cut to their span (not once on the full batch).
    widths, blocks = [], bucketed._blocks

    def recording(group_ids, positions, training):
        widths.append((int(tf.shape(group_ids)[0]), int(tf.shape(group_ids)[1])))
        return blocks(group_ids, positions, training)

    bucketed._blocks = recording
    bucketed(ids)
    del bucketed._blocks
    assert len(widths) == 4 and sum(n for n, _ in widths) == batch
    # Group g holds rows [g n / 4, (g + 1) n / 4) of the batch sorted by span, longest first.
    spans = sorted((9 - int(np.argmax(row != 0)) if row.any() else 1 for row in ids),
                   reverse=True)
    expected = [max(spans[g * batch // 4:(g + 1) * batch // 4], default=1) for g in range(4)]
    assert [w for _, w in widths] == expected
    if batch > 4:
        assert min(w for _, w in widths) < 9
    # Every position, padding included, against gSASRec's equations and the plain path.
    reference = _reference_forward(plain, ids)
    np.testing.assert_allclose(bucketed(ids).numpy(), reference, atol=2e-5)
    np.testing.assert_allclose(tf.function(bucketed)(tf.constant(ids)).numpy(), reference,
                               atol=2e-5)
    rng = np.random.default_rng(1)
    direction = tf.constant(rng.normal(size=(batch, 9, 8)), tf.float32)

    def gradients(encoder):
        with tf.GradientTape() as tape:
            score = tf.reduce_sum(encoder(ids) * direction)
        # (the output table gets no gradient from the encoder's outputs: None)
        return [None if g is None else tf.convert_to_tensor(g).numpy()
                for g in tape.gradient(score, encoder.trainable_variables)]

    checked = 0
    for got, want, v in zip(gradients(bucketed), gradients(plain), plain.trainable_variables):
        assert (got is None) == (want is None), v.name
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=v.name)
            checked += 1
    assert checked == len(plain.trainable_variables) - 1


def test_length_buckets_in_config_and_validated():
    encoder = SASRecEncoder(30, 7, dim=8, length_buckets=3)
    assert SASRecEncoder.from_config(encoder.get_config()).length_buckets == 3
    assert SASRecEncoder(30, 7, dim=8).length_buckets == 1
    with pytest.raises(ValueError, match="length_buckets"):
        SASRecEncoder(30, 7, dim=8, length_buckets=0)


# --- WordDropout: Keras' dropout semantics from random integer words ---------------

# Both paths: TensorFlow ops (False) and, where a compiler is present, the native kernel.
NATIVE_DROPOUT = [False, pytest.param(True, marks=needs_compiler)]


def _op_types(fn, *args) -> set:
    graph = tf.function(fn).get_concrete_function(*args).graph
    types = {op.type for op in graph.get_operations()}
    for function in graph.as_graph_def().library.function:  # nested bodies (cond, ...)
        types |= {node.op for node in function.node_def}
    return types


def _uses_native_dropout(fn, *args) -> bool:
    return "TfrsLogqDropout" in _op_types(fn, *args)


@pytest.mark.parametrize("native_kernels", NATIVE_DROPOUT)
@pytest.mark.parametrize("rate", [0.5, 0.25, 0.2, 0.9])
def test_word_dropout_keeps_each_entry_with_probability_one_minus_rate(rate, native_kernels):
    layer = WordDropout(rate, native_kernels=native_kernels)
    assert layer.bits == (16 if rate in (0.5, 0.25) else 32)
    x = tf.fill([250, 4001], 3.0)  # odd size: the last word is partly used
    y = layer(x, training=True).numpy()
    assert _uses_native_dropout(lambda x: layer(x, training=True), x) is native_kernels
    kept = y != 0
    np.testing.assert_array_equal(y[kept], np.float32(3.0) * np.float32(1 / (1 - rate)))
    n = kept.size
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(kept.mean() - (1 - rate)) < 5 * sigma
    # Entries sharing a word (neighbours in the 16-bit case) are independent,
    # and so are the rows of the block.
    flat = kept.reshape(-1)[: n - n % 2].reshape(-1, 2)
    both = np.mean(flat[:, 0] & flat[:, 1])
    assert abs(both - (1 - rate) ** 2) < 5 * np.sqrt((1 - rate) ** 2 / (n / 2))
    same = np.mean(kept[0] == kept[1])  # rows do not repeat one mask
    agree = rate ** 2 + (1 - rate) ** 2
    assert abs(same - agree) < 5 * np.sqrt(agree * (1 - agree) / 4001)


@pytest.mark.parametrize("native_kernels", NATIVE_DROPOUT)
def test_word_dropout_gradient_is_the_scaled_mask_and_masks_are_fresh_and_seeded(native_kernels):
    layer = WordDropout(0.5, native_kernels=native_kernels)
    x = tf.random.normal([64, 33]) + 5.0  # no zero entries

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * 1.5)
        return y, tape.gradient(loss, x)

    y, grad = step(x)
    assert _uses_native_dropout(step, x) is native_kernels
    mask = (y.numpy() != 0).astype(np.float32)
    np.testing.assert_allclose(grad.numpy(), 1.5 * 2.0 * mask)
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2.0 * mask, rtol=1e-6)
    y2, _ = step(x)
    assert not np.array_equal(y2.numpy() != 0, mask != 0)  # a new mask every call

    def two_draws():
        tf.keras.utils.set_random_seed(7)
        drop = WordDropout(0.5, native_kernels=native_kernels)
        fn = tf.function(lambda x: drop(x, training=True))
        return fn(x).numpy(), fn(x).numpy()

    first, second = two_draws(), two_draws()
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])

    # An explicit seed: two calls in one graph still draw different masks.
    seeded = WordDropout(0.5, seed=3, native_kernels=native_kernels)
    a, b = tf.function(lambda x: (seeded(x, training=True), seeded(x, training=True)))(x)
    assert not np.array_equal(a.numpy() != 0, b.numpy() != 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_word_dropout_inference_identity_dtypes_xla_and_errors(dtype):
    x = tf.cast(tf.reshape(tf.range(1, 211, dtype=tf.float32), [2, 3, 5, 7]), dtype)
    layer = WordDropout(0.25, dtype=dtype)  # a layer computes in its policy's dtype
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())  # inference by default
    np.testing.assert_array_equal(WordDropout(0.0, dtype=dtype)(x, training=True).numpy(),
                                  x.numpy())
    y = tf.function(lambda x: layer(x, training=True), jit_compile=True)(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    kept = y.numpy() != 0
    np_dtype = x.dtype.as_numpy_dtype  # Keras' rule: x * (1 / (1 - rate)) in x's dtype
    np.testing.assert_array_equal(y.numpy()[kept].astype(np.float32),
                                  (x.numpy()[kept] * np_dtype(1 / 0.75)).astype(np.float32))
    assert 0 < kept.mean() < 1
    with pytest.raises(ValueError, match="rate"):
        WordDropout(1.0)
    with pytest.raises(ValueError, match="rate"):
        WordDropout(-0.1)


@pytest.mark.parametrize("native_kernels", NATIVE_DROPOUT)
def test_word_dropout_under_a_distribution_strategy(mirrored_strategy, native_kernels):
    with mirrored_strategy.scope():
        layer = WordDropout(0.5, native_kernels=native_kernels)

    @tf.function
    def run():
        def replica():
            kept = layer(tf.ones([200, 200]), training=True) != 0
            return tf.reduce_mean(tf.cast(kept, tf.float32)), kept
        return mirrored_strategy.experimental_local_results(mirrored_strategy.run(replica))

    results = run()
    assert _uses_native_dropout(run) is native_kernels
    for fraction, _ in results:
        assert abs(float(fraction) - 0.5) < 5 * np.sqrt(0.25 / 40000)
    assert not np.array_equal(results[0][1].numpy(), results[1][1].numpy())  # per replica


# --- native kernels in the encoder: the same training maths as TensorFlow's ops -------

@needs_compiler
@pytest.mark.parametrize("buckets", [1, 3])
def test_native_and_tensorflow_encoders_train_alike(buckets):
    """dropout 0: the only difference is the layer-norm kernel, whose outputs and
    gradients (to every weight) match Keras' ops; inference graphs keep Keras' ops."""
    kwargs = dict(num_ids=40, max_length=9, dim=8, num_blocks=2, num_heads=2, dropout=0.0,
                  length_buckets=buckets)
    native_encoder = SASRecEncoder(**kwargs, native_kernels=True)
    plain = SASRecEncoder(**kwargs, native_kernels=False)
    ids = tf.constant(np.random.default_rng(0).integers(0, 40, size=(6, 9)), tf.int32)
    ids = tf.where(tf.range(9)[None] < tf.constant([[0], [2], [5], [8], [9], [3]]), 0, ids)
    native_encoder(ids), plain(ids)
    plain.set_weights(native_encoder.get_weights())
    upstream = tf.random.stateless_normal([6, 9, 8], [1, 2])

    def step(encoder):
        with tf.GradientTape() as tape:
            out = encoder(ids, training=True)
            loss = tf.reduce_sum(out * upstream)
        return out, tape.gradient(loss, encoder.trainable_variables)

    (out_a, grads_a), (out_b, grads_b) = tf.function(step)(native_encoder), step(plain)
    np.testing.assert_allclose(out_a.numpy(), out_b.numpy(), rtol=1e-5, atol=1e-5)
    for var, a, b in zip(plain.trainable_variables, grads_a, grads_b):
        assert (a is None) == (b is None), var.name
        if a is None:  # the output table: not used by the encoder's forward pass
            continue
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=var.name)
    assert "TfrsLogqLayerNorm" in _op_types(lambda x: native_encoder(x, training=True), ids)
    assert not {t for t in _op_types(lambda x: native_encoder(x, training=False), ids)
                if t.startswith("TfrsLogq")}
    assert not {t for t in _op_types(lambda x: plain(x, training=True), ids)
                if t.startswith("TfrsLogq")}
    # Under XLA the kernels are skipped (XLA cannot compile them), with the same result.
    xla = tf.function(lambda x: native_encoder(x, training=True), jit_compile=True)
    if buckets == 1:
        np.testing.assert_allclose(xla(ids).numpy(), out_b.numpy(), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_native_dropout_in_the_encoder_graph_and_config():
    encoder = SASRecEncoder(30, 7, dim=8, native_kernels=True)
    ids = tf.constant([[0, 0, 3, 4, 5, 6, 7]])
    assert "TfrsLogqDropout" in _op_types(lambda x: encoder(x, training=True), ids)
    config = encoder.get_config()
    assert config["native_kernels"] is True
    assert SASRecEncoder.from_config(config).blocks[0].attention_norm.native_kernels is True
    assert SASRecEncoder(30, 7, dim=8).native_kernels is None


@needs_compiler
def test_saved_models_never_hold_the_native_ops(tmp_path):
    """Keras' SavedModel saver also traces training calls: those traces must use
    TensorFlow's ops, or a process without this package could not load the model."""
    encoder = SASRecEncoder(30, 7, dim=8, dropout=0.5, native_kernels=True)
    ids = tf.constant([[0, 0, 3, 4, 5, 6, 7]])
    assert {"TfrsLogqLayerNorm", "TfrsLogqDropout"} <= _op_types(
        lambda x: encoder(x, training=True), ids)
    inputs = tf.keras.Input((7,), dtype=tf.int32)
    model = tf.keras.Model(inputs, encoder(inputs))
    for path, save in ((tmp_path / "keras", lambda p: tf.keras.models.save_model(model, p)),
                       (tmp_path / "tf", lambda p: tf.saved_model.save(model, p))):
        save(str(path))
        assert b"TfrsLogq" not in (path / "saved_model.pb").read_bytes(), path.name
    np.testing.assert_allclose(tf.keras.models.load_model(str(tmp_path / "keras"))(ids).numpy(),
                               model(ids).numpy(), rtol=1e-6)
    # Training calls after saving use the kernels again.
    assert "TfrsLogqLayerNorm" in _op_types(lambda x: encoder(x, training=True), ids)


@needs_compiler
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_runs_keras_ops_for_half_precision(dtype):
    x = tf.random.stateless_normal([4, 5, 6], [3, 4])
    native_layer = LayerNorm(native_kernels=True, dtype=dtype)
    keras_layer = tf.keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype)
    got = native_layer(tf.cast(x, dtype), training=True)
    want = keras_layer(tf.cast(x, dtype), training=True)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert LayerNorm.from_config(native_layer.get_config()).native_kernels is True


@needs_compiler
def test_layer_norm_under_a_distribution_strategy(mirrored_strategy):
    x = tf.random.stateless_normal([8, 5, 6], [5, 6])
    upstream = tf.random.stateless_normal([8, 5, 6], [7, 8])
    with mirrored_strategy.scope():
        layer = LayerNorm(native_kernels=True)
        layer.build(x.shape)
        layer.gamma.assign(tf.linspace(0.5, 2.0, 6))
        layer.beta.assign(tf.linspace(-1.0, 1.0, 6))

    @tf.function
    def run():
        def replica():
            ctx = tf.distribute.get_replica_context()
            half = 8 // ctx.num_replicas_in_sync
            rows = tf.range(ctx.replica_id_in_sync_group * half,
                            (ctx.replica_id_in_sync_group + 1) * half)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(tf.gather(x, rows), training=True)
                                     * tf.gather(upstream, rows))
            return ctx.all_reduce("sum", tape.gradient(loss, [layer.gamma, layer.beta]))
        return mirrored_strategy.experimental_local_results(mirrored_strategy.run(replica))[0]

    gamma, beta = run()
    assert "TfrsLogqLayerNorm" in _op_types(run)
    reference = tf.keras.layers.LayerNormalization(epsilon=1e-5)
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(reference(x) * upstream)
    want = tape.gradient(loss, [reference.gamma, reference.beta])
    np.testing.assert_allclose(gamma.numpy(), want[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(beta.numpy(), want[1].numpy(), rtol=1e-5, atol=1e-5)


def test_two_tower_model_trains_on_the_stream_and_beats_untrained(tmp_path):
    import tfrs_logq
    from tfrs_logq.metrics import recall_ndcg_from_ranks, target_ranks
    from tfrs_logq.pipelines.synthetic import SyntheticStream
    from tfrs_logq.two_tower import TwoTowerModel

    stream = SyntheticStream(num_items=2000, num_users=500, num_topics=10, seed=0)
    eval_batch = next(iter(stream.dataset(1024, num_batches=1, start_batch=10**6)))
    model = TwoTowerModel(
        2001, 16, tfrs_logq.CorrectedRetrieval(),
        frequency=tfrs_logq.CountMinSketch(depth=3, width=4096),
    )
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01))

    def recall100():
        ranks = target_ranks(model.query_tower(eval_batch["history"]), model.item_embeddings(),
                             eval_batch["target"])
        return recall_ndcg_from_ranks(ranks, (100,))["recall@100"]

    before = recall100()
    model.fit(stream.dataset(256, num_batches=150), verbose=0)
    after = recall100()
    assert after > before + 0.1
    assert float(model.frequency.total.numpy()) == 150 * 256
