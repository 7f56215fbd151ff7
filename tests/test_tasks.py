"""Specification of `tfrs_logq.tasks.CorrectedRetrieval`.

References are computed here in numpy from the paper's formulas; stock
`tfrs.tasks.Retrieval` is the reference for ``correction="none"``/``"logq-tfrs"``.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
from reference import loss_corrected

from tfrs_logq import CorrectedRetrieval


def _batch(seed=0, num_queries=8, num_extra=0, dim=5, num_ids=6):
    rng = np.random.default_rng(seed)
    num_candidates = num_queries + num_extra
    q = rng.normal(size=(num_queries, dim)).astype(np.float32)
    c = rng.normal(size=(num_candidates, dim)).astype(np.float32)
    ids = rng.integers(0, num_ids, size=num_candidates).astype(np.int64)
    prob = rng.uniform(0.01, 0.3, size=num_candidates).astype(np.float32)
    weight = rng.uniform(0.5, 2.0, size=num_queries).astype(np.float32)
    return q, c, ids, prob, weight


def _loss_and_grads(task, q, c, **kwargs):
    qv, cv = tf.Variable(q), tf.Variable(c)
    with tf.GradientTape() as tape:
        loss = task(qv, cv, **kwargs)
        total = tf.reduce_sum(loss)
    gq, gc = tape.gradient(total, [qv, cv])
    return loss.numpy(), gq.numpy(), gc.numpy()


def reference_corrected(q, c, ids, prob, *, temperature=1.0, dedup=False, score_mask=None,
                        sample_weight=None, inclusion=False):
    """Per-row corrected loss from the paper: Q'(d) = Q(d) / (1 - Q(p)), hits masked.
    ``inclusion``: ``prob`` are inclusion probabilities pi(d): no positive to exclude,
    P(p|u) from the Horvitz-Thompson sum e^{s_p} / (e^{s_p} + sum_i e^{s_i} / pi_i)."""
    scores = (q.astype(np.float64) @ c.T.astype(np.float64)) / temperature
    b, n = scores.shape
    log_q = np.log(prob.astype(np.float64))
    mask = np.ones((b, n), bool)
    mask[np.arange(b), np.arange(b)] = False
    mask &= ids[None, :] != ids[:b, None]
    if dedup:
        first = np.array([list(ids).index(x) == j for j, x in enumerate(ids)])
        mask &= first[None, :]
    if score_mask is not None:
        mask &= score_mask
    log_q_prime = log_q[None, :] - (0.0 if inclusion else
                                    np.log1p(-prob[:b].astype(np.float64))[:, None])
    s_p = scores[np.arange(b), np.arange(b)]
    loss = loss_corrected(s_p, scores, np.broadcast_to(log_q_prime, scores.shape), mask,
                          inclusion)[0]
    if sample_weight is not None:
        loss = loss * sample_weight
    return loss


# --- parity with stock TFRS for "none" and "logq-tfrs" ---------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"temperature": 0.2},
        {"remove_accidental_hits": True},
        {"num_hard_negatives": 3},
        {"temperature": 0.5, "remove_accidental_hits": True, "num_hard_negatives": 4},
    ],
    ids=["plain", "temperature", "hits", "hard", "all"],
)
@pytest.mark.parametrize("correction", ["none", "logq-tfrs"])
@pytest.mark.parametrize("num_extra", [0, 5])
def test_matches_stock_tfrs(correction, options, num_extra):
    q, c, ids, prob, weight = _batch(seed=1, num_extra=num_extra)
    kwargs = dict(candidate_ids=ids, sample_weight=weight)
    if correction == "logq-tfrs":
        kwargs["candidate_sampling_probability"] = prob
    ours = _loss_and_grads(CorrectedRetrieval(correction=correction, **options), q, c, **kwargs)
    stock = _loss_and_grads(tfrs.tasks.Retrieval(**options), q, c, **kwargs)
    for a, b in zip(ours, stock):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_none_ignores_probabilities_and_matches_tfrs_without_them():
    q, c, ids, prob, _ = _batch(seed=2)
    ours = CorrectedRetrieval(correction="none")(q, c, candidate_sampling_probability=prob)
    stock = tfrs.tasks.Retrieval()(q, c)
    np.testing.assert_allclose(ours.numpy(), stock.numpy(), rtol=1e-6)


# --- the corrected loss ------------------------------------------------------------------------


@pytest.mark.parametrize("num_extra", [0, 6])
@pytest.mark.parametrize("dedup", [False, True])
def test_corrected_equals_reference_values_and_gradients(num_extra, dedup):
    q, c, ids, prob, weight = _batch(seed=3, num_extra=num_extra)
    task = CorrectedRetrieval(reduction="none", deduplicate_candidates=dedup, temperature=0.7)
    loss, gq, gc = _loss_and_grads(
        task, q, c, candidate_ids=ids, candidate_sampling_probability=prob, sample_weight=weight
    )
    ref = reference_corrected(q, c, ids, prob, temperature=0.7, dedup=dedup, sample_weight=weight)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    # Gradient check against central finite differences of the reference with the
    # weight frozen (what stop_gradient means).
    eps = 1e-3
    b = q.shape[0]
    scores = (q.astype(np.float64) @ c.T) / 0.7
    s_p = scores[np.arange(b), np.arange(b)]
    mask = np.ones(scores.shape, bool)
    mask[np.arange(b), np.arange(b)] = False
    mask &= ids[None, :] != ids[:b, None]
    if dedup:
        first = np.array([list(ids).index(x) == j for j, x in enumerate(ids)])
        mask &= first[None, :]
    lqp = np.log(prob.astype(np.float64))[None, :] - np.log1p(-prob[:b].astype(np.float64))[:, None]
    w = loss_corrected(s_p, scores, lqp, mask)[3]

    def frozen(qq):
        sc = (qq @ c.T.astype(np.float64)) / 0.7
        sp = sc[np.arange(b), np.arange(b)]
        total = 0.0
        for r in range(b):
            adj = (sc[r] - lqp[r])[mask[r]]
            if adj.size:
                lse = np.log(np.exp(adj - adj.max()).sum()) + adj.max()
                total += weight[r] * w[r] * (lse - sp[r])
        return total

    num = np.zeros_like(q, np.float64)
    for i in range(q.shape[0]):
        for j in range(q.shape[1]):
            d = np.zeros_like(q, np.float64)
            d[i, j] = eps
            num[i, j] = (frozen(q + d) - frozen(q - d)) / (2 * eps)
    np.testing.assert_allclose(gq, num, rtol=2e-3, atol=2e-4)


def test_corrected_task_is_sum_of_pure_function():
    q, c, ids, prob, _ = _batch(seed=4, num_extra=3)
    total = CorrectedRetrieval()(q, c, candidate_ids=ids, candidate_sampling_probability=prob)
    np.testing.assert_allclose(total.numpy(), reference_corrected(q, c, ids, prob).sum(), rtol=1e-5)


@pytest.mark.parametrize("reduction,expect", [("sum", "sum"), ("sum_over_batch_size", "mean")])
def test_reductions(reduction, expect):
    q, c, ids, prob, weight = _batch(seed=5)
    loss = CorrectedRetrieval(reduction=reduction)(
        q, c, candidate_ids=ids, candidate_sampling_probability=prob, sample_weight=weight
    )
    ref = reference_corrected(q, c, ids, prob, sample_weight=weight)
    np.testing.assert_allclose(loss.numpy(), getattr(np, expect)(ref), rtol=1e-5)


def test_score_mask_and_log_probabilities():
    q, c, ids, prob, _ = _batch(seed=6, num_extra=4)
    rng = np.random.default_rng(0)
    score_mask = rng.uniform(size=(8, 12)) > 0.3
    loss = CorrectedRetrieval(reduction="none")(
        q, c, candidate_ids=ids, candidate_log_sampling_probability=np.log(prob),
        score_mask=score_mask,
    )
    ref = reference_corrected(q, c, ids, prob, score_mask=score_mask)
    np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_all_candidates_share_the_positive_id_gives_zero_loss_and_finite_grads():
    q, c, _, prob, _ = _batch(seed=7)
    ids = np.zeros(8, np.int64)
    loss, gq, gc = _loss_and_grads(
        CorrectedRetrieval(reduction="none"), q, c, candidate_ids=ids,
        candidate_sampling_probability=prob,
    )
    assert np.all(loss == 0) and np.isfinite(gq).all() and np.isfinite(gc).all()


def test_mixed_precision_embeddings():
    q, c, ids, prob, _ = _batch(seed=8)
    for dtype in (tf.float16, tf.bfloat16):
        loss = CorrectedRetrieval(reduction="none")(
            tf.constant(q, dtype), tf.constant(c, dtype), candidate_ids=ids,
            candidate_sampling_probability=prob,
        )
        assert loss.dtype == tf.float32
        qr = tf.cast(tf.constant(q, dtype), tf.float32).numpy()
        cr = tf.cast(tf.constant(c, dtype), tf.float32).numpy()
        scores16 = tf.cast(tf.matmul(tf.constant(qr, dtype), tf.constant(cr, dtype),
                                     transpose_b=True), tf.float64).numpy()
        assert np.isfinite(loss.numpy()).all()
        # Within half-precision rounding of the scores.
        ref = reference_corrected(qr, cr, ids, prob)
        tol = 0.05 if dtype == tf.bfloat16 else 0.01
        np.testing.assert_allclose(loss.numpy(), ref, rtol=tol, atol=tol)
        assert np.abs(scores16).max() > 0


@pytest.mark.parametrize("jit", [False, True])
def test_graph_and_xla(jit):
    q, c, ids, prob, _ = _batch(seed=9, num_extra=2)
    task = CorrectedRetrieval(reduction="none", deduplicate_candidates=not jit)
    fn = tf.function(
        lambda q, c, i, p: task(q, c, candidate_ids=i, candidate_sampling_probability=p),
        jit_compile=jit,
    )
    np.testing.assert_allclose(
        fn(q, c, ids, prob).numpy(),
        reference_corrected(q, c, ids, prob, dedup=not jit),
        rtol=1e-5, atol=1e-6,
    )


def test_config_json_round_trip():
    task = CorrectedRetrieval(
        correction="corrected", deduplicate_candidates=True, reduction="sum_over_batch_size",
        temperature=0.3, num_hard_negatives=5, min_sampling_probability=1e-8, name="t",
    )
    config = json.loads(json.dumps(task.get_config()))
    clone = CorrectedRetrieval.from_config(config)
    assert clone.get_config() == task.get_config()
    q, c, ids, prob, _ = _batch(seed=10, num_extra=3)
    kw = dict(candidate_ids=ids, candidate_sampling_probability=prob)
    np.testing.assert_allclose(task(q, c, **kw).numpy(), clone(q, c, **kw).numpy(), rtol=1e-6)


def test_extra_negatives_with_ids_feed_factorized_metrics():
    # TFRS passes unsliced ids with sliced embeddings; shapes must agree here.
    q, c, ids, prob, _ = _batch(seed=11, num_extra=4, num_ids=1000)
    ids = np.arange(12, dtype=np.int64)
    candidates = tf.data.Dataset.from_tensor_slices((ids[:8], c[:8])).batch(4)
    metric = tfrs.metrics.FactorizedTopK(
        candidates=tfrs.layers.factorized_top_k.BruteForce(k=3).index_from_dataset(candidates),
        ks=(1, 3),
    )
    task = CorrectedRetrieval(metrics=metric, batch_metrics=[tf.keras.metrics.AUC()])
    task(q, c, candidate_ids=ids, candidate_sampling_probability=prob)
    values = {m.name: m.result().numpy() for m in metric.metrics}
    # Reference: top-3 by brute-force over the 8 positives.
    scores = q @ c[:8].T
    top3 = np.argsort(-scores, axis=1)[:, :3]
    expected = np.mean([i in top3[i] for i in range(8)])
    assert values["factorized_top_k/top_3_categorical_accuracy"] == pytest.approx(expected)


def test_errors():
    q, c, ids, prob, _ = _batch()
    with pytest.raises(ValueError, match="correction"):
        CorrectedRetrieval(correction="LOGQ")
    with pytest.raises(ValueError, match="reduction"):
        CorrectedRetrieval(reduction="mean")
    with pytest.raises(ValueError, match=r"^correction='corrected' needs `candidate_ids`[^\n]*$"):
        CorrectedRetrieval()(q, c, candidate_sampling_probability=prob)
    with pytest.raises(ValueError, match=r"^correction='corrected' needs "
                       r"`candidate_sampling_probability`[^\n]*correction='none'\.$"):
        CorrectedRetrieval()(q, c, candidate_ids=ids)
    # TFRS's call with neither: one line naming both and the stock form.
    with pytest.raises(ValueError, match=r"^[^\n]*`candidate_ids`[^\n]* and "
                       r"`candidate_sampling_probability`[^\n]*$"):
        CorrectedRetrieval()(q, c)
    with pytest.raises(ValueError, match=r"^correction='logq-tfrs' needs "):
        CorrectedRetrieval(correction="logq-tfrs")(q, c)
    with pytest.raises(ValueError, match="candidate_ids.*entries"):
        CorrectedRetrieval()(q, c, candidate_ids=ids[:3], candidate_sampling_probability=prob)
    with pytest.raises(ValueError, match="candidate_sampling_probability.*entries"):
        CorrectedRetrieval()(q, c, candidate_ids=ids, candidate_sampling_probability=prob[:2])
    with pytest.raises(ValueError, match="num_candidates >= num_queries"):
        CorrectedRetrieval(correction="none")(q, c[:3])


def test_mirrored_strategy_two_replicas_matches_per_replica_reference(mirrored_strategy):
    strategy = mirrored_strategy
    q, c, ids, prob, _ = _batch(seed=12, num_queries=16, num_ids=50)
    with strategy.scope():
        task = CorrectedRetrieval()
    data = tf.data.Dataset.from_tensor_slices((q, c, ids, prob)).batch(16)
    dist = strategy.experimental_distribute_dataset(data)

    @tf.function
    def step(batch):
        return strategy.run(
            lambda q, c, i, p: task(q, c, candidate_ids=i, candidate_sampling_probability=p),
            args=batch,
        )

    per_replica = strategy.experimental_local_results(step(next(iter(dist))))
    expected = [
        reference_corrected(q[s:s + 8], c[s:s + 8], ids[s:s + 8], prob[s:s + 8]).sum()
        for s in (0, 8)
    ]
    np.testing.assert_allclose([v.numpy() for v in per_replica], expected, rtol=1e-5)


def test_model_fit_under_mirrored_strategy_reduces_loss(mirrored_strategy):
    strategy = mirrored_strategy
    rng = np.random.default_rng(0)
    users = rng.integers(0, 20, 512)
    items = (users * 3 + rng.integers(0, 2, 512)) % 40
    freq = np.bincount(items, minlength=40) / len(items)

    class TwoTower(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user = tf.keras.layers.Embedding(20, 8)
            self.item = tf.keras.layers.Embedding(40, 8)
            self.task = CorrectedRetrieval()

        def compute_loss(self, features, training=False):
            return self.task(
                self.user(features["user"]), self.item(features["item"]),
                candidate_ids=features["item"], candidate_sampling_probability=features["q"],
                compute_metrics=False,
            )

    with strategy.scope():
        model = TwoTower()
        model.compile(optimizer=tf.keras.optimizers.Adam(0.05))
    ds = tf.data.Dataset.from_tensor_slices(
        {"user": users, "item": items, "q": freq[items].astype(np.float32)}
    ).batch(64)
    history = model.fit(ds, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


@pytest.mark.parametrize("correction", ["none", "logq-tfrs"])
@pytest.mark.parametrize("hits", [False, True])
def test_dedup_and_score_mask_for_none_and_logq_keep_the_positive(correction, hits):
    # Row i's positive id may occur earlier in the batch: its own column is then a
    # duplicate, yet it must stay the row's positive.
    q, c, _, prob, _ = _batch(seed=13, num_extra=3)
    ids = np.array([4, 4, 7, 4, 9, 7, 1, 2, 4, 3, 9], np.int64)
    rng = np.random.default_rng(1)
    score_mask = rng.uniform(size=(8, 11)) > 0.2
    task = CorrectedRetrieval(correction=correction, deduplicate_candidates=True,
                              remove_accidental_hits=hits, reduction="none")
    kw = dict(candidate_ids=ids, score_mask=score_mask)
    if correction == "logq-tfrs":
        kw["candidate_sampling_probability"] = prob
    loss = task(q, c, **kw).numpy()
    scores = q.astype(np.float64) @ c.T.astype(np.float64)
    log_q = np.log(prob.astype(np.float64)) if correction == "logq-tfrs" else np.zeros(11)
    first = np.array([list(ids).index(x) == j for j, x in enumerate(ids)])
    for i in range(8):
        neg = first & score_mask[i]
        neg[i] = False
        if hits:
            neg &= ids != ids[i]
        terms = np.concatenate([[scores[i, i] - log_q[i]], (scores[i] - log_q)[neg]])
        m = terms.max()
        expected = m + np.log(np.exp(terms - m).sum()) - (scores[i, i] - log_q[i])
        assert loss[i] == pytest.approx(expected, rel=1e-5, abs=1e-5)


# --- string ids, replicas, Q <= 1, deduplicated proposal, named steps ---------------


@pytest.mark.parametrize("options", [
    {"correction": "corrected"},
    {"correction": "none", "remove_accidental_hits": True},
    {"correction": "logq-tfrs", "remove_accidental_hits": True},
    {"correction": "logq-official", "remove_accidental_hits": True},
    {"correction": "corrected", "deduplicate_candidates": True},
    {"correction": "corrected", "num_hard_negatives": 3},
], ids=["corrected", "none-hits", "logq-tfrs-hits", "logq-official-hits", "corrected-dedup",
     "corrected-hard"])
def test_string_candidate_ids_equal_integer_ids(options):
    q, c, ids, prob, weight = _batch(seed=21, num_extra=4)
    names = np.array([f"movie-{i:03d}" for i in ids])
    kwargs = dict(candidate_sampling_probability=prob, sample_weight=weight)
    by_int = CorrectedRetrieval(reduction="none", **options)(q, c, candidate_ids=ids, **kwargs)
    by_name = CorrectedRetrieval(reduction="none", **options)(q, c, candidate_ids=names, **kwargs)
    np.testing.assert_allclose(by_name.numpy(), by_int.numpy(), rtol=1e-6)
    # And in a graph with an unknown number of candidates (TFRS models call it so).
    fn = tf.function(lambda n: CorrectedRetrieval(reduction="none", **options)(
        q, c, candidate_ids=n, **kwargs), input_signature=[tf.TensorSpec([None], tf.string)])
    np.testing.assert_allclose(fn(tf.constant(names)).numpy(), by_int.numpy(), rtol=1e-6)


def test_string_ids_feed_factorized_metrics_with_the_original_ids():
    q, c, ids, prob, _ = _batch(seed=22, num_ids=50)

    def accuracy(candidate_ids):
        candidates = tf.data.Dataset.from_tensor_slices((candidate_ids, c)).batch(4)
        metric = tfrs.metrics.FactorizedTopK(
            candidates=tfrs.layers.factorized_top_k.Streaming(k=3).index_from_dataset(candidates),
            ks=(3,))
        CorrectedRetrieval(metrics=metric)(
            q, c, candidate_ids=candidate_ids, candidate_sampling_probability=prob)
        return float(metric.result()[0])

    by_name = accuracy(tf.constant([f"m{i}" for i in ids]))
    assert by_name == accuracy(tf.constant(ids)) and by_name > 0


def test_sum_over_batch_size_divides_by_the_global_batch(mirrored_strategy):
    strategy = mirrored_strategy
    q, c, ids, prob, _ = _batch(seed=23, num_queries=16, num_ids=50)
    with strategy.scope():
        task = CorrectedRetrieval(reduction="sum_over_batch_size")
    dist = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((q, c, ids, prob)).batch(16))

    @tf.function
    def step(batch):
        return strategy.run(
            lambda q, c, i, p: task(q, c, candidate_ids=i, candidate_sampling_probability=p),
            args=batch)

    per_replica = [v.numpy() for v in strategy.experimental_local_results(step(next(iter(dist))))]
    # Each replica's loss is its sum over the global batch of 16, so the replicas'
    # summed gradients equal one replica's on the whole batch's mean.
    expected = [reference_corrected(q[s:s + 8], c[s:s + 8], ids[s:s + 8], prob[s:s + 8]).sum() / 16
                for s in (0, 8)]
    np.testing.assert_allclose(per_replica, expected, rtol=1e-5)


@pytest.mark.parametrize("bad", [
    {"candidate_sampling_probability": "batch"},
    {"candidate_log_sampling_probability": "positive"},
], ids=["probability>1", "log-probability>0"])
def test_probabilities_above_one_are_rejected(bad):
    q, c, ids, prob, _ = _batch(seed=24)
    key = next(iter(bad))
    value = prob * 16 if bad[key] == "batch" else np.log(prob) + 2.0
    task = CorrectedRetrieval()
    with pytest.raises(ValueError, match=f"^`{key}` must hold per-draw proposal probabilities"):
        task(q, c, candidate_ids=ids, **{key: value})
    graph = tf.function(lambda v: task(q, c, candidate_ids=ids, **{key: v}))
    with pytest.raises(tf.errors.InvalidArgumentError, match="per-draw proposal probabilities"):
        graph(tf.constant(value))


def test_negative_probabilities_are_rejected_with_the_same_message():
    q, c, ids, prob, _ = _batch(seed=26)
    with pytest.raises(ValueError, match="must hold per-draw proposal probabilities .*"
                                         "received a negative or NaN probability"):
        CorrectedRetrieval()(q, c, candidate_ids=ids, candidate_sampling_probability=-prob)


def test_per_draw_to_inclusion_matches_reference():
    q, c, ids, prob, _ = _batch(seed=25, num_queries=8, num_ids=5)
    b = len(q)
    inclusion = 1.0 - (1.0 - prob.astype(np.float64)) ** b
    got = CorrectedRetrieval(deduplicate_candidates=True,
                             sampling_probability="per_draw_to_inclusion", reduction="none")(
        q, c, candidate_ids=ids, candidate_sampling_probability=prob).numpy()
    expected = reference_corrected(q, c, ids, inclusion.astype(np.float32), dedup=True,
                                   inclusion=True)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    # The same inclusion probabilities passed in by the caller (its own deduplication).
    direct = CorrectedRetrieval(deduplicate_candidates=True, sampling_probability="inclusion",
                                reduction="none")(
        q, c, candidate_ids=ids,
        candidate_sampling_probability=inclusion.astype(np.float32)).numpy()
    np.testing.assert_allclose(direct, got, rtol=1e-5)
    per_draw = CorrectedRetrieval(deduplicate_candidates=True, reduction="none")(
        q, c, candidate_ids=ids, candidate_sampling_probability=prob).numpy()
    np.testing.assert_allclose(per_draw, reference_corrected(q, c, ids, prob, dedup=True),
                               rtol=1e-5)
    assert not np.allclose(got, per_draw)
    with pytest.raises(ValueError, match="sampling_probability"):
        CorrectedRetrieval(sampling_probability="batch")
    with pytest.raises(ValueError, match="pass deduplicate_candidates=True"):
        CorrectedRetrieval(sampling_probability="per_draw_to_inclusion")
    with pytest.raises(TypeError):  # one argument per concept: the old second name is gone
        CorrectedRetrieval(deduplicated_proposal="inclusion")


def test_docstring_examples_figure_is_the_papers_formula():
    """CorrectedRetrieval's docstring example (run by test_doctests.py) prints 0.208: the
    paper's formula in numpy gives it."""
    from tfrs_logq import tasks

    assert "round(float(loss), 3)\n    0.208" in tasks.CorrectedRetrieval.__doc__
    s_p, s_n, q_prime = 2.0, np.array([0.0, 1.0]), np.array([0.1, 0.2]) / (1 - 0.5)
    total = np.sum(np.exp(s_n) / q_prime)
    w = 1 - np.exp(s_p) / (np.exp(s_p) + total / 2)
    assert round(w * (np.log(total) - s_p), 3) == 0.208


def test_negative_mask_step():
    from tfrs_logq.masks import negative_mask

    ids = tf.constant([4, 4, 9, 7, 9])
    is_negative, count = negative_mask(ids, 2, 5, remove_accidental_hits=True, deduplicate=False)
    np.testing.assert_array_equal(is_negative.numpy(), [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(count.numpy(), [3, 3])
    is_negative, count = negative_mask(ids, 3, 5, remove_accidental_hits=True, deduplicate=True)
    np.testing.assert_array_equal(is_negative.numpy(),
                                  [[0, 0, 1, 1, 0], [0, 0, 1, 1, 0], [1, 0, 0, 1, 0]])
    np.testing.assert_array_equal(count.numpy(), [2, 2, 2])
    keep = tf.constant([[True, True, False, True, True], [True] * 5])
    is_negative, count = negative_mask(ids, 2, 5, remove_accidental_hits=False,
                                       deduplicate=False, score_mask=keep)
    np.testing.assert_array_equal(is_negative.numpy(), keep.numpy())
    assert count is None
    assert negative_mask(None, 2, 5, remove_accidental_hits=False, deduplicate=False) == (None,
                                                                                         None)


def test_coded_ids_and_log_q_steps():
    from tfrs_logq.masks import coded_candidate_ids
    from tfrs_logq.proposal import inclusion_log_q
    from tfrs_logq.tasks import proposal_log_q, reduce_loss

    codes = coded_candidate_ids(tf.constant(["b", "a", "b", "c"])).numpy()
    assert codes[0] == codes[2] and len({codes[0], codes[1], codes[3]}) == 3
    np.testing.assert_array_equal(coded_candidate_ids(tf.constant([[5], [3]])).numpy(), [5, 3])
    with pytest.raises(ValueError, match="candidate_ids"):
        coded_candidate_ids(tf.zeros([2, 2], tf.int32))
    np.testing.assert_allclose(proposal_log_q([0.5, 1e-9]).numpy(), np.log([0.5, 1e-6]),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="received neither"):
        proposal_log_q()
    np.testing.assert_allclose(inclusion_log_q(tf.math.log([0.01]), 100).numpy(),
                               np.log([1 - 0.99 ** 100]), rtol=1e-5)
    per_example = tf.constant([1.0, 2.0, 3.0])
    assert float(reduce_loss(per_example, "sum")) == 6.0
    assert float(reduce_loss(per_example, "sum_over_batch_size", [1.0, 1.0, 2.0])) == 3.0


def test_positive_scores_step_is_the_diagonal_of_candidate_scores():
    from tfrs_logq.tasks import candidate_scores, positive_scores

    q, c, *_ = _batch(num_extra=3)
    for temperature in (None, 0.5):
        np.testing.assert_allclose(
            positive_scores(q, c, temperature).numpy(),
            np.diag(candidate_scores(q, c, temperature).numpy()), rtol=1e-6, atol=1e-6)
    heads = np.random.default_rng(1).normal(size=(8, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(positive_scores(heads, c).numpy(),
                               np.einsum("qne,qe->qn", heads, c[:8]).max(axis=1), rtol=1e-6)
    half = positive_scores(tf.constant(q, tf.float16), tf.constant(c, tf.float16))
    assert half.dtype == tf.float32  # computed in float32, as the loss is


@pytest.mark.parametrize("num_extra", [0, 5])
def test_in_batch_loss_with_given_positives_and_masked_diagonal_is_unchanged(num_extra):
    from tfrs_logq.losses import in_batch_softmax_loss

    q, c, ids, prob, _ = _batch(seed=3, num_extra=num_extra)
    is_negative = tf.constant(ids[None, :] != ids[:len(q), None])  # diagonal False: hits
    log_q = tf.math.log(tf.constant(prob))
    results = []
    for fast in (False, True):
        qv, cv = tf.Variable(q), tf.Variable(c)
        with tf.GradientTape() as tape:
            scores = tf.matmul(qv, cv, transpose_b=True)
            extra = {}
            if fast:
                extra = dict(positive_logits=tf.reduce_sum(qv * cv[:len(q)], axis=-1),
                             positives_masked=True)
            loss = tf.reduce_sum(in_batch_softmax_loss(
                scores, correction="corrected", log_q=log_q, is_negative=is_negative, **extra))
        results.append([loss.numpy()] + [g.numpy() for g in tape.gradient(loss, [qv, cv])])
    ref = reference_corrected(q, c, ids, prob).sum()
    np.testing.assert_allclose(results[1][0], ref, rtol=1e-5)
    for slow, fast in zip(results[0], results[1]):
        np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6)


# --- the two standard forms: "logq-tfrs" (TFRS) and "logq-official" (the paper's code) -------


def reference_standard(q, c, ids, prob, form, *, temperature=1.0, hits=False,
                       num_hard=None, sample_weight=None):
    """Per-row standard logQ loss and its gradients in q and c (numpy, float64):
    ``logq-tfrs`` ``log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)}) - (s_p - log Q(p))``,
    ``logq-official`` ``log(e^{s_p} + sum_i e^{s_i - log Q(d_i)}) - s_p``; ``num_hard``
    keeps each row's largest ``s_i - log Q(d_i)`` among its negatives."""
    q64, c64 = q.astype(np.float64), c.astype(np.float64)
    scores = q64 @ c64.T / temperature
    b, n = scores.shape
    log_q = np.log(prob.astype(np.float64))
    weight = np.ones(b) if sample_weight is None else sample_weight.astype(np.float64)
    loss, d_scores = np.zeros(b), np.zeros((b, n))
    for i in range(b):
        neg = np.ones(n, bool)
        neg[i] = False
        if hits:
            neg &= ids != ids[i]
        cols = np.flatnonzero(neg)
        adjusted = scores[i, cols] - log_q[cols]
        if num_hard is not None:
            keep = np.argsort(-adjusted)[:num_hard]
            cols, adjusted = cols[keep], adjusted[keep]
        positive = scores[i, i] - (log_q[i] if form == "logq-tfrs" else 0.0)
        terms = np.concatenate([[positive], adjusted])
        m = terms.max()
        lse = m + np.log(np.exp(terms - m).sum())
        loss[i] = weight[i] * (lse - positive)
        soft = np.exp(terms - lse)
        d_scores[i, i] = weight[i] * (soft[0] - 1.0)
        d_scores[i, cols] = weight[i] * soft[1:]
    d_scores /= temperature
    return loss, d_scores @ c64, d_scores.T @ q64


@pytest.mark.parametrize("options", [
    {},
    {"temperature": 0.5},
    {"remove_accidental_hits": True},
    {"num_hard_negatives": 3},
    {"temperature": 0.7, "remove_accidental_hits": True, "num_hard_negatives": 4},
], ids=["plain", "temperature", "hits", "hard", "all"])
@pytest.mark.parametrize("form", ["logq-tfrs", "logq-official"])
@pytest.mark.parametrize("num_extra", [0, 5])
def test_standard_forms_equal_numpy_references_values_and_gradients(form, options, num_extra):
    q, c, ids, prob, weight = _batch(seed=31, num_extra=num_extra)
    task = CorrectedRetrieval(correction=form, reduction="none", **options)
    loss, gq, gc = _loss_and_grads(task, q, c, candidate_ids=ids,
                                   candidate_sampling_probability=prob, sample_weight=weight)
    ref, ref_gq, ref_gc = reference_standard(
        q, c, ids, prob, form, temperature=options.get("temperature", 1.0),
        hits=options.get("remove_accidental_hits", False),
        num_hard=options.get("num_hard_negatives"), sample_weight=weight)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gq, ref_gq, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gc, ref_gc, rtol=1e-4, atol=1e-5)


def test_logq_official_is_logq_tfrs_with_the_positives_log_q_zeroed():
    """The form the paper's code trains: what the two-tower loop got before by passing
    ``log Q(p) = 0`` for the positives' columns to ``logq-tfrs``, its score mask leaving
    the other rows' positives out of a row's negatives (the loop's negatives are drawn
    apart, after the positives)."""
    q, c, ids, prob, _ = _batch(seed=32, num_extra=4, num_ids=40)
    log_q = np.log(prob)
    zeroed = log_q.copy()
    zeroed[:len(q)] = 0.0
    common = dict(candidate_ids=ids, score_mask=np.concatenate(
        [np.eye(len(q), dtype=bool), np.ones((len(q), 4), bool)], axis=1))
    official = _loss_and_grads(
        CorrectedRetrieval(correction="logq-official", remove_accidental_hits=True), q, c,
        candidate_log_sampling_probability=log_q, **common)
    old_way = _loss_and_grads(
        CorrectedRetrieval(correction="logq-tfrs", remove_accidental_hits=True), q, c,
        candidate_log_sampling_probability=zeroed, **common)
    assert not np.allclose(zeroed, log_q)
    for a, b in zip(official, old_way):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_bare_logq_is_refused_by_the_task_and_the_in_batch_loss():
    from tfrs_logq.losses import hard_negative_softmax_loss, in_batch_softmax_loss

    message = (r"^correction 'logq' is ambiguous: use 'logq-tfrs' \(TFRS's Retrieval: the "
               r"positive's logit corrected too\) or 'logq-official' \(the paper's code: the "
               r"positive uncorrected\)\.$")
    with pytest.raises(ValueError, match=message):
        CorrectedRetrieval(correction="logq")
    scores = tf.zeros([2, 3])
    with pytest.raises(ValueError, match=message):
        in_batch_softmax_loss(scores, correction="logq", log_q=tf.zeros([3]))
    with pytest.raises(ValueError, match=message):
        hard_negative_softmax_loss(scores, tf.zeros([3]), None, 1, "logq")
    with pytest.raises(ValueError, match="`correction` must be one of none, logq-tfrs"):
        CorrectedRetrieval(correction="logq-paper")


@pytest.mark.parametrize("form", ["logq-tfrs", "logq-official"])
def test_in_batch_loss_standard_forms_without_a_mask(form):
    from tfrs_logq.losses import in_batch_softmax_loss

    q, c, ids, prob, _ = _batch(seed=33, num_extra=3)
    loss = in_batch_softmax_loss(tf.matmul(q, c, transpose_b=True), correction=form,
                                 log_q=tf.math.log(tf.constant(prob)))
    ref, _, _ = reference_standard(q, c, ids, prob, form)
    np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-5, atol=1e-5)
