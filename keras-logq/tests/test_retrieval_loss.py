"""`keras_logq.CorrectedRetrievalLoss`: the corrected loss as a `keras.losses.Loss`, called
as Keras-RS's retrieval examples call theirs (``loss_fn(y_true, scores, sample_weight)``) and
through ``model.compile(loss=...)``, against a numpy transcription of the paper's formula:

    L = -w (s_p - log sum_i exp(s_i - log Q'(d_i))),   log Q'(d) = log Q(d) - log(1 - Q(p)),
    w = stop_gradient(1 - P),   P = e^{s_p} / (e^{s_p} + (1/n) sum_i exp(s_i - log Q'(d_i))),

the sum over the row's negatives: every candidate but the positive, accidental hits (a
candidate with the positive's id) masked."""

import json

import keras
import numpy as np
import pytest
from conftest import to_numpy, value_and_grads
from keras_logq import CorrectedRetrievalLoss


def paper_loss(scores, positive_col, ids, q):
    """numpy, float64: per-row loss and d(sum L)/d scores (w held constant)."""
    b, c = scores.shape
    loss, grad = np.zeros(b), np.zeros((b, c))
    for r in range(b):
        p = positive_col[r]
        negatives = [j for j in range(c) if j != p and ids[r][j] != ids[r][p]]
        log_q_prime = np.log(q[r][negatives]) - np.log(1.0 - q[r][p])
        adjusted = scores[r, negatives] - log_q_prime
        lse = np.log(np.sum(np.exp(adjusted)))
        n = len(negatives)
        P = np.exp(scores[r, p]) / (np.exp(scores[r, p]) + np.exp(lse) / n)
        w = 1.0 - P
        loss[r] = -w * (scores[r, p] - lse)
        grad[r, p] = -w
        grad[r, negatives] = w * np.exp(adjusted - lse)
    return loss, grad


def _case(rng, b=6, extra=0):
    c = b + extra
    scores = rng.normal(size=(b, c)).astype("float32") * 2
    ids = np.array([3, 5, 3, 8, 5, 9, 11, 3, 4][:c], "int32")  # hits: rows 0/2, 1/4, extra 3
    q = rng.uniform(0.01, 0.2, size=c).astype("float32")
    q[ids == 3] = q[0]  # one item, one Q
    q[ids == 5] = q[1]
    return scores, ids, q


def _rows(x, b):
    return np.broadcast_to(x, (b,) + x.shape)


@pytest.mark.parametrize("name", ["candidate_sampling_probability",
                                  "candidate_log_sampling_probability"])
def test_dict_y_true_matches_the_paper_formula_values_and_gradients(rng, name):
    b = 6
    scores, ids, q = _case(rng, b, extra=3)
    prob = q if name == "candidate_sampling_probability" else np.log(q)
    loss_fn = CorrectedRetrievalLoss(reduction="none")
    y_true = {"candidate_ids": ids, name: prob}
    loss, (grad,) = value_and_grads(lambda s: loss_fn(y_true, s), [scores], [0])
    ref, ref_grad = paper_loss(scores.astype(float), np.arange(b), _rows(ids, b),
                               _rows(q.astype(float), b))
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)
    assert grad[0, 2] == 0.0 and grad[0, 7] == 0.0 and grad[1, 4] == 0.0  # hits
    # The reduced loss is the mean, as Keras's losses.
    mean = to_numpy(CorrectedRetrievalLoss()(y_true, scores))
    np.testing.assert_allclose(mean, ref.mean(), rtol=1e-5)


def test_labels_choose_the_positive_as_keras_rs_eye_does(rng):
    """``labels``: the positive is each row's 1 (Keras-RS passes ``eye``); here permuted."""
    b = 5
    scores, ids, q = _case(rng, b)
    perm = np.array([2, 0, 1, 4, 3])
    labels = np.eye(b, dtype="float32")[perm]
    loss_fn = CorrectedRetrievalLoss(reduction="none")
    y_true = {"labels": labels, "candidate_ids": ids, "candidate_sampling_probability": q}
    loss, (grad,) = value_and_grads(lambda s: loss_fn(y_true, s), [scores], [0])
    ref, ref_grad = paper_loss(scores.astype(float), perm, _rows(ids, b),
                               _rows(q.astype(float), b))
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)
    eye = to_numpy(loss_fn({**y_true, "labels": np.eye(b, dtype="float32")}, scores))
    np.testing.assert_allclose(eye, paper_loss(scores.astype(float), np.arange(b),
                                               _rows(ids, b), _rows(q.astype(float), b))[0],
                               rtol=1e-5, atol=1e-6)


def test_mask_drops_candidates_and_sample_weight_reduces_as_keras(rng):
    b = 5
    scores, ids, q = _case(rng, b, extra=2)
    mask = np.ones(scores.shape, bool)
    mask[:, :b] = np.eye(b, dtype=bool)  # only the 2 extra candidates are negatives
    weights = rng.uniform(size=b).astype("float32")
    y_true = {"candidate_ids": ids, "candidate_sampling_probability": q, "mask": mask}
    per_row = to_numpy(CorrectedRetrievalLoss(reduction="none")(y_true, scores))
    only_extra = np.tile(np.arange(b, b + 2), (b, 1))
    rows_ids = np.concatenate([ids[:b, None], ids[only_extra]], axis=1)
    rows_q = np.concatenate([q[:b, None], q[only_extra]], axis=1)
    rows_scores = np.concatenate([scores[np.arange(b), np.arange(b)][:, None],
                                  np.take_along_axis(scores, only_extra, axis=1)], axis=1)
    ref, _ = paper_loss(rows_scores.astype(float), np.zeros(b, int), rows_ids,
                        rows_q.astype(float))
    np.testing.assert_allclose(per_row, ref, rtol=1e-5, atol=1e-6)
    for reduction, expected in [("sum", (ref * weights).sum()),
                                ("sum_over_batch_size", (ref * weights).mean()),
                                ("mean_with_sample_weight", (ref * weights).sum() / weights.sum())]:
        got = to_numpy(CorrectedRetrievalLoss(reduction=reduction)(y_true, scores, weights))
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=reduction)


def test_ids_keep_their_integer_dtype(rng):
    """Keras's Loss casts y_true to float32: 2**24 and 2**24 + 1 would become one id, an
    accidental hit. Here they stay two items."""
    b = 4
    scores = rng.normal(size=(b, b)).astype("float32")
    ids = np.array([2**24, 2**24 + 1, 7, 9], "int32")
    q = np.full(b, 0.1, "float32")
    got = to_numpy(CorrectedRetrievalLoss(reduction="none")(
        {"candidate_ids": ids, "candidate_sampling_probability": q}, scores))
    ref, _ = paper_loss(scores.astype(float), np.arange(b), _rows(ids.astype(np.int64), b),
                        _rows(q.astype(float), b))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_refuses_probability_above_one(rng):
    scores, ids, q = _case(rng, 4)
    loss_fn = CorrectedRetrievalLoss()
    with pytest.raises(ValueError, match="0 <= Q <= 1"):
        loss_fn({"candidate_ids": ids[:4], "candidate_sampling_probability": q[:4] * 20},
                scores[:, :4])
    with pytest.raises(ValueError, match="log Q <= 0"):
        loss_fn({"candidate_ids": ids[:4], "candidate_log_sampling_probability": -np.log(q[:4])},
                scores[:, :4])
    with pytest.raises(ValueError, match="not both"):
        loss_fn({"candidate_ids": ids[:4], "candidate_sampling_probability": q[:4],
                 "candidate_log_sampling_probability": np.log(q[:4])}, scores[:, :4])
    with pytest.raises(ValueError, match="item_log_sampling_probability.*log Q <= 0"):
        CorrectedRetrievalLoss(item_log_sampling_probability=np.array([0.5, -1.0]))
    with pytest.raises(ValueError, match=r"unknown keys \['candidate_log_q'\]"):
        loss_fn({"candidate_ids": ids[:4], "candidate_log_q": np.log(q[:4])}, scores[:, :4])


def test_get_config_json_round_trip(rng):
    b = 5
    scores, ids, q = _case(rng, b)
    table = np.log(np.full(12, 1 / 12)).astype("float32")
    loss_fn = CorrectedRetrievalLoss(correction="logq-tfrs", temperature=0.5, deduplicate=True,
                                     item_log_sampling_probability=table, reduction="sum",
                                     name="retrieval")
    clone = CorrectedRetrievalLoss.from_config(json.loads(json.dumps(loss_fn.get_config())))
    np.testing.assert_allclose(to_numpy(clone(ids, scores)), to_numpy(loss_fn(ids, scores)))
    assert clone.get_config() == loss_fn.get_config()


@pytest.mark.parametrize("sampling_probability", ["inclusion", "per_draw_to_inclusion"])
@pytest.mark.parametrize("given", ["dict", "item_table"])
def test_inclusion_sampling_probabilities_match_the_horvitz_thompson_formula(
        rng, sampling_probability, given):
    """``sampling_probability`` as `CorrectedRetrieval`'s (tfrs_logq's): ``pi(d)`` given, or
    per-draw ``Q`` turned into ``pi = 1 - (1 - Q)^B``, from ``y_true`` or the item table;
    the loss of tests/reference.py with inclusion probabilities, values and gradients."""
    import reference

    b = 6
    scores, ids, q = _case(rng, b)
    pi = 1.0 - (1.0 - q.astype(np.float64)) ** b
    given_q = pi.astype("float32") if sampling_probability == "inclusion" else q
    table = np.zeros(12, "float32")
    table[ids] = np.log(given_q)  # one item, one Q (`_case`)
    loss_fn = CorrectedRetrievalLoss(deduplicate=True, reduction="none",
                                     sampling_probability=sampling_probability,
                                     item_log_sampling_probability=table)
    y_true = ({"candidate_ids": ids, "candidate_sampling_probability": given_q}
              if given == "dict" else ids)
    loss, (grad,) = value_and_grads(lambda s: loss_fn(y_true, s), [scores], [0])
    s64 = scores.astype(np.float64)
    first = np.array([ids[j] not in ids[:j] for j in range(b)])
    mask = (ids[None, :] != ids[:, None]) & first[None, :]  # hits and duplicates out
    ref, g_p, g_n, _ = reference.loss_corrected(np.diag(s64), s64, _rows(np.log(pi), b), mask,
                                                inclusion=True)
    ref_grad = g_n + np.diag(g_p)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-5)
    clone = CorrectedRetrievalLoss.from_config(json.loads(json.dumps(loss_fn.get_config())))
    assert clone.sampling_probability == sampling_probability
    np.testing.assert_allclose(to_numpy(clone(y_true, scores)), loss, rtol=1e-6)
    with pytest.raises(ValueError, match="per_draw_to_inclusion.*deduplicate=True"):
        CorrectedRetrievalLoss(sampling_probability="per_draw_to_inclusion")


class TwoTower(keras.Model):
    """``model(x)`` is the `[batch, batch]` score matrix of the batch's users and items."""

    def __init__(self, num_users=20, num_items=12, dim=4, **kwargs):
        super().__init__(**kwargs)
        self.users = keras.layers.Embedding(num_users, dim)
        self.items = keras.layers.Embedding(num_items, dim)

    def call(self, inputs):
        return keras.ops.matmul(self.users(inputs["user"]),
                                keras.ops.transpose(self.items(inputs["item"])))


def test_model_compile_loss_evaluate_and_fit(rng):
    """compile(loss=...) with y = the item ids (Keras-RS's retrieval ``y``) and log Q from a
    fixed table: evaluate gives the paper's loss of the batch; fit trains."""
    b, num_items = 8, 12
    counts = rng.integers(1, 50, size=num_items).astype(np.float64)
    q_table = counts / counts.sum()
    users = rng.integers(0, 20, size=4 * b).astype("int32")
    items = np.array([3, 5, 3, 8, 5, 9, 11, 1] * 4, "int32")
    keras.utils.set_random_seed(0)
    model = TwoTower()
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=CorrectedRetrievalLoss(item_log_sampling_probability=np.log(q_table)))
    x = {"user": users, "item": items}
    first = {"user": users[:b], "item": items[:b]}
    scores = to_numpy(model(first)).astype(np.float64)
    ref, _ = paper_loss(scores, np.arange(b), _rows(items[:b], b), _rows(q_table[items[:b]], b))
    got = model.evaluate(first, items[:b], batch_size=b, verbose=0)
    np.testing.assert_allclose(got, ref.mean(), rtol=1e-4)
    before = to_numpy(model.users.embeddings).copy()
    history = model.fit(x, items, batch_size=b, epochs=3, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not np.allclose(to_numpy(model.users.embeddings), before)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_compute_loss_with_model_side_log_q(rng):
    """The Keras-RS retrieval examples' form: ``self.loss_fn(y_true, scores, sample_weight)``
    in compute_loss, here with the candidates' Q computed by the model."""
    b = 6
    scores, ids, q = _case(rng, b)

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.loss_fn = CorrectedRetrievalLoss()

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return self.loss_fn({"candidate_ids": y_pred["ids"],
                                 "candidate_sampling_probability": y_pred["q"]},
                                y_pred["scores"], sample_weight)

    model = Model()
    got = to_numpy(model.compute_loss(y_pred={"scores": scores, "ids": ids, "q": q}))
    ref, _ = paper_loss(scores.astype(float), np.arange(b), _rows(ids, b),
                        _rows(q.astype(float), b))
    np.testing.assert_allclose(got, ref.mean(), rtol=1e-5)


def test_ids_y_true_with_extra_candidates_asks_for_a_dict(rng):
    scores = rng.normal(size=(4, 6)).astype("float32")
    with pytest.raises(ValueError, match="extra negatives pass a dict"):
        CorrectedRetrievalLoss(correction="none")(np.arange(4, dtype="int32"), scores)
