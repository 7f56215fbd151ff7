"""`keras_logq.CorrectedRetrieval`: the loss on a score matrix against the numpy references,
accidental hits removed for real, deduplication, extra negatives, config and `.keras` round
trips."""

import json

import keras
import keras_logq
import numpy as np
import pytest
import reference
from conftest import BACKEND, jit, to_numpy, value_and_grads
from keras_logq import CorrectedRetrieval, SampledNegatives


def reference_layer(scores, ids, log_q, correction, *, remove_hits=True, dedup=False,
                    is_negative=None, inclusion=False):
    """numpy: per-row loss and d(sum loss)/d scores, built from tests/reference.py;
    ``inclusion``: ``log_q`` holds ``log pi`` (no ``Q(p)`` excluded, the Horvitz-Thompson
    weight)."""
    b, c = scores.shape
    s_p = scores[np.arange(b), np.arange(b)]
    mask = ~np.eye(b, c, dtype=bool)
    ids2 = None if ids is None else np.broadcast_to(ids, (b, c)) if ids.ndim == 1 else ids
    if remove_hits or correction == "corrected":
        positive_ids = ids2[np.arange(b), np.arange(b)]
        mask &= ids2 != positive_ids[:, None]
    if dedup:
        first = np.array([ids[j] not in ids[:j] for j in range(c)])
        mask &= first[None, :]
    if is_negative is not None:
        mask &= is_negative
    if correction == "none":
        loss, g_p, g_n = reference.loss_none(s_p, scores, mask)
    else:
        log_q2 = np.broadcast_to(log_q, (b, c))
        log_q_p = log_q2[np.arange(b), np.arange(b)]
        if correction == "logq-tfrs":
            loss, g_p, g_n = reference.loss_logq(s_p, scores, log_q2, mask, log_q_p)
            loss = loss + log_q_p  # -log softmax(s - log Q)[p]: TFRS's numerator
        elif correction == "logq-official":  # the positive's logit uncorrected
            loss, g_p, g_n = reference.loss_logq(s_p, scores, log_q2, mask, None)
        else:
            log_q_prime = log_q2 if inclusion else log_q2 - np.log1p(-np.exp(log_q_p))[:, None]
            loss, g_p, g_n, _ = reference.loss_corrected(s_p, scores, log_q_prime, mask,
                                                         inclusion)
    grad = g_n.copy()
    grad[np.arange(b), np.arange(b)] += g_p
    return loss, grad


def _layer_grads(layer, scores, *rest):
    return value_and_grads(lambda s, *r: layer(s, *r), [scores, *rest], wrt=[0])


@pytest.mark.parametrize("correction", ["none", "logq-tfrs", "logq-official", "corrected"])
def test_in_batch_with_hits_matches_reference(rng, correction):
    b = 6
    scores = rng.normal(size=(b, b)).astype("float32") * 2
    ids = np.array([3, 5, 3, 8, 5, 9], "int32")  # rows 0/2 and 1/4 share their positive
    log_q = np.log(rng.uniform(0.01, 0.2, size=b)).astype("float32")
    layer = CorrectedRetrieval(correction=correction, reduction="none")
    loss, (grad,) = _layer_grads(layer, scores, ids, log_q)
    ref, ref_grad = reference_layer(scores.astype(np.float64), ids, log_q.astype(np.float64),
                                    correction)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    # An accidental hit gets no gradient: it is out of the row's sum.
    assert grad[0, 2] == 0.0 and grad[2, 0] == 0.0 and grad[1, 4] == 0.0


def test_accidental_hits_are_removed_for_real(rng):
    """A hit with a huge logit: removed, it changes nothing; kept (or "masked" by adding
    1e-40, as Keras-RS 0.4's RemoveAccidentalHits does), it dominates the row."""
    b = 4
    scores = rng.normal(size=(b, b)).astype("float32")
    ids = np.array([7, 1, 7, 2], "int32")
    scores[0, 2] = scores[2, 0] = 30.0  # the hits
    layer = CorrectedRetrieval(correction="none", reduction="none")
    ours = to_numpy(layer(scores, ids))
    ref, _ = reference_layer(scores.astype(np.float64), ids, None, "none")
    kept, _ = reference_layer(scores.astype(np.float64), ids, None, "none", remove_hits=False)
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    assert kept[0] - ref[0] > 20.0  # the check below can tell the two apart
    # The same logits after adding 1e-40 to the hits (what RemoveAccidentalHits 0.4 does)
    # are bit-identical to the unmasked ones in float32: such a "mask" fails the check.
    assert np.array_equal(scores + np.float32(1e-40) * (ids[None, :] == ids[:4, None]), scores)


def test_keras_rs_remove_accidental_hits_would_fail_this_check(rng):
    """Keras-RS's own layer, where installed: its output keeps the hit's full softmax share."""
    keras_rs = pytest.importorskip("keras_rs")
    if not keras_rs.__version__.startswith("0.4."):
        pytest.skip(f"documents keras-rs 0.4's no-op (PR #206); found {keras_rs.__version__}")
    b = 4
    scores = rng.normal(size=(b, b)).astype("float32")
    ids = np.array([7, 1, 7, 2], "int32")
    scores[0, 2] = scores[2, 0] = 30.0
    labels = np.eye(b, dtype="float32")
    masked = to_numpy(keras_rs.layers.RemoveAccidentalHits()(scores, labels, ids))
    theirs = [reference.logsumexp(row) - row[i] for i, row in enumerate(masked.astype(float))]
    ref, _ = reference_layer(scores.astype(np.float64), ids, None, "none")
    ours = to_numpy(CorrectedRetrieval(correction="none", reduction="none")(scores, ids))
    assert not np.allclose(theirs, ref, rtol=1e-3)
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


@pytest.mark.parametrize("correction", ["none", "logq-tfrs", "logq-official", "corrected"])
def test_two_dimensional_ids_are_per_row(rng, correction):
    """`[batch, num_candidates]` ids: row r's hits are judged by row r's positive
    (Keras-RS 0.4 compares every row with row 0's positive id)."""
    b, c = 3, 5
    scores = rng.normal(size=(b, c)).astype("float32")
    ids = np.array([[1, 2, 3, 1, 4],
                    [5, 6, 7, 6, 1],
                    [8, 9, 10, 11, 10]], "int32")  # each row has one hit of its own positive
    log_q = np.log(rng.uniform(0.01, 0.2, size=(b, c))).astype("float32")
    layer = CorrectedRetrieval(correction=correction, reduction="none")
    loss, (grad,) = _layer_grads(layer, scores, ids, log_q)
    ref, ref_grad = reference_layer(scores.astype(np.float64), ids, log_q.astype(np.float64),
                                    correction)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    row0_rule, _ = reference_layer(scores.astype(np.float64),
                                   np.broadcast_to(ids[0], (b, c)).copy(), None, "none")
    assert grad[1, 3] == 0.0 and grad[2, 4] == 0.0 and not np.allclose(loss[1:], row0_rule[1:])


@pytest.mark.parametrize("correction", ["logq-tfrs", "logq-official", "corrected"])
def test_deduplicate_counts_each_id_once(rng, correction):
    b, c = 4, 7
    scores = rng.normal(size=(b, c)).astype("float32")
    ids = np.array([1, 2, 3, 4, 2, 5, 5], "int32")
    log_q = np.log(rng.uniform(0.01, 0.2, size=c)).astype("float32")
    layer = CorrectedRetrieval(correction=correction, deduplicate=True, reduction="none")
    loss, (grad,) = _layer_grads(layer, scores, ids, log_q)
    ref, ref_grad = reference_layer(scores.astype(np.float64), ids, log_q.astype(np.float64),
                                    correction, dedup=True)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert (grad[:, 6] == 0).all() and (grad[[0, 2, 3], 4] == 0).all()


def test_extra_sampled_negatives_with_score_mask(rng):
    """Candidates = [positives; k sampled]; the score mask keeps only the sampled ones."""
    b, k = 4, 3
    positives = np.array([1, 2, 3, 4], "int32")
    negatives = SampledNegatives(np.array([9, 2, 0], "int32"),
                                 np.log(np.array([0.1, 0.2, 1.0], "float32")),
                                 np.array([True, True, False]))
    ids = np.concatenate([positives, negatives.ids])
    log_q = np.concatenate([np.log(rng.uniform(0.01, 0.2, size=b)).astype("float32"),
                            negatives.log_q])
    mask = to_numpy(negatives.score_mask(b))
    assert mask.shape == (b, b + k) and mask[0, 0] and not mask[0, 1] and not mask[0, -1]
    scores = rng.normal(size=(b, b + k)).astype("float32")
    layer = CorrectedRetrieval(reduction="none")
    loss, (grad,) = _layer_grads(layer, scores, ids, log_q, mask)
    ref, ref_grad = reference_layer(scores.astype(np.float64), ids, log_q.astype(np.float64),
                                    "corrected", is_negative=mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert grad[1, b + 1] == 0.0  # row 1's hit (id 2) among the sampled negatives


def test_reductions_temperature_and_sample_weight(rng):
    b = 5
    scores = rng.normal(size=(b, b)).astype("float32")
    ids = np.arange(1, b + 1).astype("int32")
    log_q = np.log(np.full(b, 0.1, "float32"))
    weights = rng.uniform(size=b).astype("float32")
    ref, _ = reference_layer(scores.astype(np.float64) / 2.0, ids, log_q.astype(np.float64),
                             "corrected")
    per_row = to_numpy(CorrectedRetrieval(temperature=2.0, reduction="none")(
        scores, ids, log_q, sample_weight=weights))
    np.testing.assert_allclose(per_row, ref * weights, rtol=1e-5)
    total = to_numpy(CorrectedRetrieval(temperature=2.0, reduction="sum")(scores, ids, log_q))
    mean = to_numpy(CorrectedRetrieval(temperature=2.0)(scores, ids, log_q))
    np.testing.assert_allclose(total, ref.sum(), rtol=1e-5)
    np.testing.assert_allclose(mean, ref.mean(), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_scores(rng, dtype):
    b = 5
    scores = rng.normal(size=(b, b)).astype("float32")
    ids = np.arange(1, b + 1).astype("int32")
    log_q = np.log(np.full(b, 0.1, "float32"))
    half = keras.ops.convert_to_tensor(scores, dtype=dtype)
    out = CorrectedRetrieval(reduction="none")(half, ids, log_q)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    rounded = to_numpy(keras.ops.cast(half, "float32")).astype(np.float64)
    ref, _ = reference_layer(rounded, ids, log_q.astype(np.float64), "corrected")
    np.testing.assert_allclose(to_numpy(out), ref, rtol=1e-5, atol=1e-6)


def test_jit_compiled_layer(rng):
    b = 6
    scores = rng.normal(size=(b, b + 2)).astype("float32")
    ids = np.array([3, 5, 3, 8, 5, 9, 3, 1], "int32")
    log_q = np.log(rng.uniform(0.01, 0.2, size=b + 2)).astype("float32")
    layer = CorrectedRetrieval(deduplicate=True, reduction="none")
    out = jit(lambda s, i, q: layer(s, i, q))(*[keras.ops.convert_to_tensor(a)
                                              for a in (scores, ids, log_q)])
    ref, _ = reference_layer(scores.astype(np.float64), ids, log_q.astype(np.float64),
                             "corrected", dedup=True)
    np.testing.assert_allclose(to_numpy(out), ref, rtol=1e-5, atol=1e-6)


def test_get_config_json_round_trip(rng):
    layer = CorrectedRetrieval(correction="logq-tfrs", remove_accidental_hits=False,
                               deduplicate=True, temperature=0.5, reduction="sum", name="ret")
    config = json.loads(json.dumps(layer.get_config()))
    clone = CorrectedRetrieval.from_config(config)
    scores = rng.normal(size=(3, 5)).astype("float32")
    ids = np.array([1, 2, 3, 2, 4], "int32")
    log_q = np.log(np.full(5, 0.1, "float32"))
    np.testing.assert_allclose(to_numpy(clone(scores, ids, log_q)),
                               to_numpy(layer(scores, ids, log_q)))
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize("correction", ["logq-tfrs", "logq-official", "corrected"])
@pytest.mark.parametrize("sampling_probability", ["inclusion", "per_draw_to_inclusion"])
def test_inclusion_sampling_probabilities_match_reference(rng, correction,
                                                          sampling_probability):
    """tfrs_logq's ``sampling_probability``: ``"inclusion"`` takes ``pi(d)`` as given,
    ``"per_draw_to_inclusion"`` turns per-draw ``Q`` into ``pi = 1 - (1 - Q)^B``; the
    standard forms correct with ``log pi``, ``"corrected"`` excludes no ``Q(p)`` and
    weights with the Horvitz-Thompson ``P``. Deduplicated candidates, extra negatives."""
    b, c = 5, 8
    scores = rng.normal(size=(b, c)).astype("float32") * 2
    ids = np.array([3, 5, 3, 8, 9, 5, 11, 12], "int32")
    q = rng.uniform(0.01, 0.2, size=c).astype("float32")
    pi = (1.0 - (1.0 - q.astype(np.float64)) ** b)
    given = pi.astype("float32") if sampling_probability == "inclusion" else q
    layer = CorrectedRetrieval(correction=correction, deduplicate=True, reduction="none",
                               sampling_probability=sampling_probability)
    assert layer.proposal == "inclusion"
    loss, (grad,) = value_and_grads(
        lambda s: layer(s, ids, candidate_sampling_probability=given), [scores], [0])
    ref, ref_grad = reference_layer(scores.astype(np.float64), ids, np.log(pi), correction,
                                    dedup=True, inclusion=True)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-5)
    per_draw = to_numpy(CorrectedRetrieval(correction=correction, deduplicate=True,
                                           reduction="none")(scores, ids, np.log(given)))
    per_draw_ref, _ = reference_layer(scores.astype(np.float64), ids,
                                      np.log(given.astype(np.float64)), correction, dedup=True)
    np.testing.assert_allclose(per_draw, per_draw_ref, rtol=1e-5, atol=1e-5)
    if sampling_probability == "inclusion" and correction == "corrected":
        assert np.all(np.abs(per_draw - loss) > 1e-4)  # the weight and log Q' differ


def test_per_draw_to_inclusion_jit_compiled(rng):
    b, c = 4, 6
    scores = rng.normal(size=(b, c)).astype("float32")
    ids = np.array([1, 2, 3, 4, 2, 6], "int32")
    q = rng.uniform(0.01, 0.2, size=c).astype("float32")
    layer = CorrectedRetrieval(deduplicate=True, reduction="none",
                               sampling_probability="per_draw_to_inclusion")
    out = jit(lambda s, i, lq: layer(s, i, lq))(
        *[keras.ops.convert_to_tensor(a) for a in (scores, ids, np.log(q))])
    pi = 1.0 - (1.0 - q.astype(np.float64)) ** b
    ref, _ = reference_layer(scores.astype(np.float64), ids, np.log(pi), "corrected",
                             dedup=True, inclusion=True)
    np.testing.assert_allclose(to_numpy(out), ref, rtol=1e-5, atol=1e-5)


def test_sampling_probability_is_checked_and_saved(rng):
    with pytest.raises(ValueError, match=r"^`sampling_probability` must be one of \('per_draw', "
                                         r"'inclusion', 'per_draw_to_inclusion'\), received 'set'"):
        CorrectedRetrieval(sampling_probability="set")
    with pytest.raises(ValueError, match="per_draw_to_inclusion.*deduplicate=True"):
        CorrectedRetrieval(sampling_probability="per_draw_to_inclusion")
    layer = CorrectedRetrieval(sampling_probability="inclusion", reduction="none")
    clone = CorrectedRetrieval.from_config(json.loads(json.dumps(layer.get_config())))
    assert clone.sampling_probability == "inclusion" and clone.proposal == "inclusion"
    scores = rng.normal(size=(3, 5)).astype("float32")
    ids = np.array([1, 2, 3, 4, 5], "int32")
    log_pi = np.log(rng.uniform(0.05, 0.5, size=5)).astype("float32")
    np.testing.assert_allclose(to_numpy(clone(scores, ids, log_pi)),
                               to_numpy(layer(scores, ids, log_pi)))
    assert CorrectedRetrieval().proposal == "per_draw"


@keras.saving.register_keras_serializable(package="keras_logq_tests")
class ScoreMatrix(keras.layers.Layer):
    def call(self, queries, candidates):
        return keras.ops.matmul(queries, keras.ops.transpose(candidates))


def test_saving_and_loading_a_keras_model_that_uses_the_layer(tmp_path, rng):
    query = keras.Input((4,), name="query")
    item = keras.Input((4,), name="item")
    ids = keras.Input((), dtype="int32", name="ids")
    log_q = keras.Input((), name="log_q")
    scores = ScoreMatrix()(keras.layers.Dense(8, name="q")(query),
                           keras.layers.Dense(8, name="i")(item))
    loss = CorrectedRetrieval(reduction="none", name="retrieval")(scores, ids, log_q)
    model = keras.Model([query, item, ids, log_q], loss)
    inputs = [rng.normal(size=(6, 4)).astype("float32"), rng.normal(size=(6, 4)).astype("float32"),
              np.array([1, 2, 1, 3, 4, 5], "int32"),
              np.log(rng.uniform(0.01, 0.2, size=6)).astype("float32")]
    before = to_numpy(model(inputs))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(inputs)), before, rtol=1e-6)
    layer = loaded.get_layer("retrieval")
    assert isinstance(layer, CorrectedRetrieval) and layer.correction == "corrected"
    # and the loss itself is the reference's on the model's scores
    s = to_numpy(ScoreMatrix()(loaded.get_layer("q")(inputs[0]), loaded.get_layer("i")(inputs[1])))
    ref, _ = reference_layer(s.astype(np.float64), inputs[2], inputs[3].astype(np.float64),
                             "corrected")
    np.testing.assert_allclose(before, ref, rtol=1e-4, atol=1e-5)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="correction"):
        CorrectedRetrieval(correction="sampled")
    with pytest.raises(ValueError, match="reduction"):
        CorrectedRetrieval(reduction="mean")
    with pytest.raises(ValueError, match="temperature"):
        CorrectedRetrieval(temperature=0.0)
    scores = np.zeros((2, 3), "float32")
    with pytest.raises(ValueError, match="candidate_ids"):
        CorrectedRetrieval()(scores)
    with pytest.raises(ValueError, match="needs `candidate_sampling_probability` .*neither"):
        CorrectedRetrieval()(scores, np.array([1, 2, 3], "int32"))
    with pytest.raises(ValueError, match="scores"):
        CorrectedRetrieval(correction="none", remove_accidental_hits=False)(np.zeros(3, "float32"))
    # More rows than candidates: rows without a positive on the diagonal (a silent
    # positive logit of 0 before), refused naming the shape.
    with pytest.raises(ValueError, match=r"at least as many candidates as rows.*\(4, 3\)"):
        CorrectedRetrieval()(np.zeros((4, 3), "float32"), np.array([1, 2, 3], "int32"),
                             candidate_log_sampling_probability=np.log(np.full(3, 0.1, "float32")))


def test_public_api_imports():
    for name in keras_logq.__all__:
        assert getattr(keras_logq, name) is not None, name
    assert BACKEND in ("jax", "torch", "tensorflow")
