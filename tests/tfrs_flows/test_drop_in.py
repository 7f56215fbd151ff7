"""The drop-in's contract with TFRS, piece by piece: TFRS's constructor, the ids a
factorized metric gets (`metric_ids`), TFRS's `loss` argument, the warning when stock's
``Q`` meets ``"none"``, and an index saved and reloaded with the task swapped."""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tutorial_models as tm
from deterministic_process import configuration, run_deterministic

import tfrs_logq
from tfrs_logq import CorrectedRetrieval
from tfrs_logq._tfrs_index import index_identifiers_dtype, metric_ids


def _embeddings(seed=0, queries=6, items=9, dim=4):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(queries, dim)).astype(np.float32),
            rng.normal(size=(items, dim)).astype(np.float32))


def _top_k_values(metric):
    return np.array([float(m.result()) for m in metric._top_k_metrics])


def test_tfrs_constructor_arguments_positionally():
    metric = tfrs.metrics.FactorizedTopK(
        candidates=tf.data.Dataset.from_tensor_slices(np.eye(3, dtype=np.float32)).batch(2))
    task = CorrectedRetrieval(None, metric)  # as `tfrs.tasks.Retrieval(None, metrics)`
    assert task.correction == "corrected" and task.factorized_metrics == [metric]
    loss = tf.keras.losses.CategoricalCrossentropy(from_logits=True,
                                                   reduction=tf.keras.losses.Reduction.SUM)
    assert CorrectedRetrieval(loss=loss, correction="none")._loss is loss
    with pytest.raises(TypeError, match=r"correction='corrected'"):
        CorrectedRetrieval("corrected")
    with pytest.raises(ValueError, match="drop `loss`"):
        CorrectedRetrieval(loss, correction="corrected")


@pytest.mark.parametrize("correction", ["none", "logq-tfrs"])
def test_users_loss_gives_stock_values(correction):
    """TFRS's `loss` argument: a user's loss over TFRS's logits, as stock computes it."""
    q, c = _embeddings()
    prob = np.linspace(0.05, 0.5, 9).astype(np.float32)
    kwargs = {"candidate_sampling_probability": prob} if correction == "logq-tfrs" else {}
    loss = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)
    ours = CorrectedRetrieval(loss, correction=correction)(q, c, **kwargs)
    stock = tfrs.tasks.Retrieval(loss)(q, c, **kwargs)
    # From the formula: smoothed labels against the (corrected) logits, batch-averaged.
    logits = q @ c.T - (np.log(prob)[None, :] if kwargs else 0.0)
    labels = np.eye(6, 9) * 0.9 + 0.1 / 9
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = np.mean(-(labels * log_softmax).sum(1))
    np.testing.assert_allclose(float(ours), float(stock), rtol=1e-6)
    np.testing.assert_allclose(float(ours), expected, rtol=1e-5)


def test_none_with_stock_probability_warns_once():
    q, c = _embeddings()
    task = CorrectedRetrieval(correction="none")
    with pytest.warns(UserWarning, match="correction='logq-tfrs'"):
        task(q, c, candidate_sampling_probability=np.full(9, 0.1, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task(q, c, candidate_sampling_probability=np.full(9, 0.1, np.float32))
        # Our own log-probability argument never warns: it is not a stock call.
        CorrectedRetrieval(correction="none")(
            q, c, candidate_log_sampling_probability=np.full(9, -2.0, np.float32))


def _brute_force(catalog, identifiers=None):
    index = tfrs.layers.factorized_top_k.BruteForce(k=3)
    index.index(tf.constant(catalog), identifiers)
    return index


def test_index_identifiers_are_read_from_each_kind_of_index():
    _, catalog = _embeddings()
    titles = tf.constant([f"t{i}" for i in range(9)])
    embeddings = tf.data.Dataset.from_tensor_slices(catalog).batch(4)
    pairs = tf.data.Dataset.zip(
        (tf.data.Dataset.from_tensor_slices(titles).batch(4), embeddings))
    streaming = tfrs.layers.factorized_top_k.Streaming(k=3)
    assert index_identifiers_dtype(streaming.index_from_dataset(embeddings)) == "positions"
    streaming = tfrs.layers.factorized_top_k.Streaming(k=3)
    assert index_identifiers_dtype(streaming.index_from_dataset(pairs)) == tf.string
    assert index_identifiers_dtype(_brute_force(catalog)) == "positions"  # 0..n-1
    assert index_identifiers_dtype(_brute_force(catalog, titles)) == tf.string
    ids = tf.constant(np.arange(100, 109), tf.int64)
    assert index_identifiers_dtype(_brute_force(catalog, ids)) == tf.int64


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.string])
def test_ids_never_reach_an_index_of_embeddings_alone(dtype):
    """The probe's failures: int32 ids compared with positions (top-k 0.0 where stock
    gives 1.0), int64 ids (InvalidArgumentError), strings (TypeError). The metric
    matches by score instead, exactly as stock TFRS called without ids."""
    q, catalog = _embeddings(queries=9)
    positives = catalog  # query i's positive is item i
    raw = np.arange(500, 509)
    ids = tf.constant([str(i) for i in raw]) if dtype == tf.string else tf.constant(raw, dtype)
    ours = tfrs.metrics.FactorizedTopK(candidates=_brute_force(catalog), ks=(1, 3))
    stock = tfrs.metrics.FactorizedTopK(candidates=_brute_force(catalog), ks=(1, 3))
    CorrectedRetrieval(metrics=ours, correction="none")(q, positives, candidate_ids=ids)
    tfrs.tasks.Retrieval(metrics=stock)(q, positives)
    np.testing.assert_array_equal(_top_k_values(ours), _top_k_values(stock))
    # From the formula: hit@k when fewer than k items score above the positive (the
    # positive's own entry in the index ties with it: the bounds take it either way).
    for k, value in zip((1, 3), _top_k_values(ours)):
        lower, upper = tm.score_based_top_k(q, positives, catalog, k)
        assert lower - 1e-6 <= value <= upper + 1e-6
    assert _top_k_values(ours)[1] > 0  # ids compared with positions would give 0 here


def test_ids_reach_an_index_with_identifiers_cast_to_its_dtype():
    q, catalog = _embeddings(queries=9)
    ids64 = tf.constant(np.arange(100, 109), tf.int64)
    metric = tfrs.metrics.FactorizedTopK(candidates=_brute_force(catalog, ids64), ks=(1, 3))
    got = metric_ids(metric, tf.constant(np.arange(100, 109), tf.int32))
    assert got.dtype == tf.int64
    # An index whose ids are other items' ids: id matching finds no hit (score matching
    # would find some), so the ids were used.
    shifted = tf.constant(np.arange(200, 209), tf.int64)
    metric = tfrs.metrics.FactorizedTopK(candidates=_brute_force(catalog, shifted), ks=(1, 3))
    CorrectedRetrieval(metrics=metric, correction="none")(q, catalog, candidate_ids=ids64)
    np.testing.assert_array_equal(_top_k_values(metric), [0.0, 0.0])


def test_metric_ids_refusals_and_choices():
    q, catalog = _embeddings()
    titles = tf.constant([f"t{i}" for i in range(9)])
    by_int = tfrs.metrics.FactorizedTopK(
        candidates=_brute_force(catalog, tf.constant(np.arange(9), tf.int64)))
    with pytest.raises(ValueError, match=r"^the index of metric .* holds int64 identifiers "
                       r"but `candidate_ids` are string: index the same ids"):
        metric_ids(by_int, titles[:6])
    positions = tfrs.metrics.FactorizedTopK(candidates=_brute_force(catalog))
    assert metric_ids(positions, titles[:6], by_id=False) is None
    assert metric_ids(by_int, tf.constant(np.arange(6), tf.int64), by_id=False) is None
    streaming = tfrs.metrics.FactorizedTopK(
        candidates=tf.data.Dataset.from_tensor_slices(catalog).batch(4))
    with pytest.raises(ValueError, match="metrics_by_id=True but the index"):
        metric_ids(streaming, titles[:6], by_id=True)
    # BruteForce's positions are int32 0..n-1: by_id=True hands them integer ids (as stock).
    assert metric_ids(positions, tf.constant(np.arange(6), tf.int64), by_id=True).dtype \
        == tf.int32


class _OwnIndex(tfrs.layers.factorized_top_k.TopK):
    """An index class of the user's own: ids kept in an attribute TFRS's classes lack."""

    def __init__(self, catalog, ids, k=3):
        super().__init__(k=k)
        self.catalog, self.item_ids = tf.constant(catalog), tf.constant(ids)

    def index(self, candidates, identifiers=None):
        return self

    def call(self, queries, k=None):
        scores, positions = tf.math.top_k(tf.matmul(queries, self.catalog, transpose_b=True),
                                          k=k or self._k)
        return scores, tf.gather(self.item_ids, positions)

    def is_exact(self):
        return True


def test_an_index_class_of_the_users_own_gets_the_ids_as_in_tfrs():
    q, catalog = _embeddings(queries=9)
    ids = tf.constant([f"x{i}" for i in range(9)])
    ours = tfrs.metrics.FactorizedTopK(candidates=_OwnIndex(catalog, ids), ks=(1, 3))
    stock = tfrs.metrics.FactorizedTopK(candidates=_OwnIndex(catalog, ids), ks=(1, 3))
    other = tf.constant([f"t{i}" for i in range(9)])  # by id: never found
    CorrectedRetrieval(metrics=ours, correction="none")(q, catalog, candidate_ids=other)
    tfrs.tasks.Retrieval(metrics=stock)(q, catalog, candidate_ids=other)
    np.testing.assert_array_equal(_top_k_values(ours), _top_k_values(stock))
    np.testing.assert_array_equal(_top_k_values(ours), [0.0, 0.0])


def test_keras_call_arguments_and_batch_metrics_as_in_tfrs():
    """`training=` passes through as Keras layers take it; batch metrics see TFRS's logits
    and labels, after hard-negative mining, with the loss metrics and a score mask."""
    q, c = _embeddings(queries=8, items=8)
    rng = np.random.default_rng(3)
    mask = rng.random((8, 8)) > 0.2
    np.fill_diagonal(mask, True)
    weights = rng.random(8).astype(np.float32)

    def make(task_class, **kwargs):
        return task_class(
            batch_metrics=[tf.keras.metrics.TopKCategoricalAccuracy(k=2)],
            loss_metrics=[tf.keras.metrics.Mean()], num_hard_negatives=3, temperature=0.5,
            **kwargs)

    stock, ours = make(tfrs.tasks.Retrieval), make(CorrectedRetrieval, correction="none")
    expected = stock(q, c, sample_weight=weights, score_mask=mask, training=True)
    got = ours(q, c, sample_weight=weights, score_mask=mask, training=True)
    assert float(got) == float(expected)
    for a, b in zip(ours._batch_metrics + ours._loss_metrics,
                    stock._batch_metrics + stock._loss_metrics):
        assert float(a.result()) == float(b.result())
    with pytest.raises(ValueError, match="metrics_by_id"):
        CorrectedRetrieval(metrics_by_id="yes")


def test_index_saved_and_reloaded_with_the_task_swapped(tmp_path):
    """The basic tutorial's serving step: a BruteForce index of the trained towers, saved
    with `tf.saved_model.save`, reloaded, answering titles for a user id; `predict` on
    the index gives the same."""
    log = tm.make_log(num_ratings=600)
    flow = tm.FLOWS["basic"]
    result = tm.run(flow, log, lambda m: CorrectedRetrieval(metrics=m), "switched")
    model = result["model"]
    index = tfrs.layers.factorized_top_k.BruteForce(model.query_model, k=5)
    index.index_from_dataset(tm.candidates(log, model, "movie_title"))
    scores, titles = index(tf.constant(["u3"]))
    path = str(tmp_path / "index")
    tf.saved_model.save(index, path)
    loaded = tf.saved_model.load(path)
    loaded_scores, loaded_titles = loaded(tf.constant(["u3"]))
    np.testing.assert_array_equal(loaded_titles.numpy(), titles.numpy())
    np.testing.assert_allclose(loaded_scores.numpy(), scores.numpy(), rtol=1e-6)
    # The titles are the catalog's best by the trained towers' scores.
    user = model.query_model(tf.constant(["u3"])).numpy()
    catalog = model.candidate_model(tf.constant(log.titles)).numpy()
    best = log.titles[np.argsort(-(user @ catalog.T)[0])[:5]]
    assert [t.decode() for t in titles.numpy()[0]] == best.tolist()
    predicted = index.predict(tf.data.Dataset.from_tensor_slices(["u3"]).batch(1), verbose=0)
    np.testing.assert_array_equal(predicted[1], titles.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("correction", ["none", "corrected"])
def test_scann_index_of_the_switched_model(tmp_path, correction):
    """The efficient-serving tutorial: a ScaNN index of the trained towers (exact here: one
    leaf, every candidate reordered) answers as BruteForce does, saved with
    ``namespace_whitelist=["Scann"]`` and reloaded."""
    pytest.importorskip("scann")
    log = tm.make_log(num_ratings=600)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 'none' with Q: warned once
        result = tm.run(tm.FLOWS["basic"], log,
                        lambda m: CorrectedRetrieval(metrics=m, correction=correction),
                        "switched")
    model = result["model"]
    brute = tfrs.layers.factorized_top_k.BruteForce(model.query_model, k=5)
    brute.index_from_dataset(tm.candidates(log, model, "movie_title"))
    scann = tfrs.layers.factorized_top_k.ScaNN(
        model.query_model, k=5, num_leaves=1, num_leaves_to_search=1,
        num_reordering_candidates=len(log.titles))
    scann.index_from_dataset(tm.candidates(log, model, "movie_title"))
    users = tf.constant(["u3", "u17", "u40"])
    scann(users)  # traced before saving, as the tutorial does
    path = str(tmp_path / "scann")
    tf.saved_model.save(scann, path,
                        options=tf.saved_model.SaveOptions(namespace_whitelist=["Scann"]))
    loaded = tf.saved_model.load(path)
    expected_scores, expected_titles = brute(users)
    for index in (scann, loaded):
        scores, titles = index(users)
        np.testing.assert_array_equal(titles.numpy(), expected_titles.numpy())
        np.testing.assert_allclose(scores.numpy(), expected_scores.numpy(), rtol=1e-5)


@pytest.mark.slow
def test_flow_under_mirrored_strategy():
    """The basic flow under MirroredStrategy on two logical CPUs: 'none' and 'logq-tfrs'
    equal stock's history and evaluation bit for bit, 'corrected' trains and evaluates. In a
    fresh interpreter with one intra-op thread and op determinism
    (tests/deterministic_process.py): a top-k accuracy is decided by one-ulp ties."""
    run_deterministic(_check_mirrored_flow, logical_cpus=2)


def _check_mirrored_flow():
    assert configuration() | {"intra_op": 1, "determinism": True, "logical_cpus": 2} \
        == configuration()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    log = tm.make_log()
    flow = tm.FLOWS["basic"]
    for correction, calls in (("none", "stock"), ("logq-tfrs", "stock-q")):
        stock = tm.run(flow, log, lambda m: tfrs.tasks.Retrieval(metrics=m), calls,
                       strategy=strategy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # 'none' with Q: warned once
            ours = tm.run(flow, log, lambda m: CorrectedRetrieval(metrics=m,
                                                                  correction=correction),
                          "switched", strategy=strategy)
        for key, values in stock["history"].items():
            np.testing.assert_array_equal(ours["history"][key], values, err_msg=key)
        for key, value in stock["evaluation"].items():
            np.testing.assert_array_equal(ours["evaluation"][key], value, err_msg=key)
    corrected = tm.run(flow, log, lambda m: CorrectedRetrieval(metrics=m), "switched",
                       strategy=strategy)
    assert np.isfinite(corrected["history"]["loss"]).all()
    assert 0 <= corrected["evaluation"]["factorized_top_k/top_10_categorical_accuracy"] <= 1


def test_frequency_from_string_ids_feeds_the_task():
    """Q(d) for titles in-graph, no lookup layer of the user's: the task gets the same
    loss as with integer ids and the integer estimator."""
    titles = np.array(["Heat", "Up", "Heat", "Alien", "Heat", "Up"])
    codes = np.array([0, 1, 0, 2, 0, 1])
    by_title = tfrs_logq.ExactFrequency.from_dataset(
        tf.data.Dataset.from_tensor_slices(titles).batch(4))
    by_code = tfrs_logq.ExactFrequency.from_counts(np.bincount(codes))
    np.testing.assert_allclose(by_title.probability(tf.constant(titles)).numpy(),
                               np.array([3, 2, 3, 1, 3, 2]) / 6, rtol=1e-6)
    q, c = _embeddings(queries=6, items=6)
    task = CorrectedRetrieval()
    a = task(q, c, candidate_ids=tf.constant(titles),
             candidate_sampling_probability=by_title.probability(tf.constant(titles)))
    b = task(q, c, candidate_ids=tf.constant(codes),
             candidate_sampling_probability=by_code.probability(tf.constant(codes)))
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
