"""Specification of `tfrs_logq.proposal` (log Q, log Q', inclusion, mixture, clipping) and of
the weight ``w``; and proof that the losses, the task, the objectives and `diagnose` use them.

References are numpy, from the paper's formulas: ``Q'(d) = Q(d) / (1 - Q(p))``,
``P = e^{s_p} / (e^{s_p} + (1/n) sum_i e^{s_i - log Q'(d_i)})``, ``w = 1 - P``.
"""


import numpy as np
import pytest
import tensorflow as tf
from reference import loss_corrected

from tfrs_logq.losses import (
    corrected_weight,
    in_batch_softmax_loss,
    sampled_softmax_loss,
)
from tfrs_logq.proposal import (
    COMPLEMENT_EPSILON,
    MIN_PROBABILITY,
    excluded_log_q,
    inclusion_log_q,
    log_complement,
    log_q_from_probability,
    mixture_probability,
    proposal_log_q_table,
    unigram_log_tables,
)

# ------------------------------------------------------------------- the formulas


def test_log_q_from_probability_clips_to_min_probability_and_one():
    q = np.array([0.3, 1e-9, 0.0, 1.0])
    got = log_q_from_probability(q).numpy()
    np.testing.assert_allclose(got, np.log(np.clip(q, 1e-6, 1.0)), rtol=1e-12)
    assert MIN_PROBABILITY == 1e-6
    np.testing.assert_allclose(log_q_from_probability([1e-9], 1e-12).numpy(), np.log([1e-9]))


def test_excluded_log_q_is_log_q_over_one_minus_q_of_the_positive():
    rng = np.random.default_rng(0)
    q_neg = rng.uniform(0.001, 0.3, size=(4, 5))
    q_pos = rng.uniform(0.001, 0.9, size=4)
    got = excluded_log_q(np.log(q_neg), np.log(q_pos)).numpy()
    np.testing.assert_allclose(got, np.log(q_neg / (1.0 - q_pos[:, None])), rtol=1e-10)
    # The positive excluded, Q' renormalises: over a catalog it sums to 1 without p.
    catalog = rng.dirichlet(np.ones(6))
    q_prime = np.exp(excluded_log_q(np.log(catalog)[None, :], np.log(catalog[2:3])).numpy()[0])
    assert np.delete(q_prime, 2).sum() == pytest.approx(1.0, rel=1e-12)


def test_log_complement_caps_q_below_one():
    got = log_complement(np.log([0.25, 1.0, 0.9999999])).numpy()
    np.testing.assert_allclose(got, np.log1p(-np.minimum([0.25, 1.0, 0.9999999],
                                                          1 - COMPLEMENT_EPSILON)), rtol=1e-10)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("b", [1, 7, 100])
def test_inclusion_log_q_is_one_minus_the_chance_of_no_draw(b):
    q = np.array([1e-5, 0.01, 0.3, 1.0])
    got = inclusion_log_q(np.log(q), b).numpy()
    expected = np.log(1.0 - (1.0 - np.minimum(q, 1 - COMPLEMENT_EPSILON)) ** b)
    np.testing.assert_allclose(got, expected, rtol=1e-8)


def test_mixture_probability_on_numpy_and_tensors():
    unigram = np.array([0.5, 0.3, 0.2, 0.0])
    expected = 0.25 / 4 + 0.75 * unigram
    np.testing.assert_allclose(mixture_probability(unigram, 0.25, 4), expected)
    np.testing.assert_allclose(mixture_probability(tf.constant(unigram), 0.25, 4).numpy(),
                               expected)
    assert mixture_probability(unigram, 0.25, 4).sum() == pytest.approx(1.0)


def test_unigram_log_tables_are_log_counts_total_and_remaining():
    counts = np.array([0, 3, 1, 6])
    log_counts, log_total, log_remaining = unigram_log_tables(counts)
    np.testing.assert_allclose(log_counts, np.log([1, 3, 1, 6]))
    assert log_total == pytest.approx(np.log(10))
    np.testing.assert_allclose(log_remaining, np.log([9, 7, 9, 4]))
    # log Q'(d) from the tables is log(Q(d) / (1 - Q(p))) with Q = counts / N.
    q = counts / 10
    np.testing.assert_allclose(log_counts[1] - log_remaining[3], np.log(q[1] / (1 - q[3])))
    # One item holding every interaction: N - #p is floored at 1, logs stay finite.
    assert np.isfinite(unigram_log_tables([0, 5])[2]).all()


def test_corrected_weight_is_one_minus_p_with_zero_gradient():
    rng = np.random.default_rng(1)
    s_p = rng.normal(size=5)
    adjusted = rng.normal(size=(5, 4)) * 2
    mask = rng.uniform(size=(5, 4)) > 0.3
    mask[0] = False  # a row with no negative: weight 0
    _, _, _, weights = loss_corrected(s_p, adjusted, np.zeros_like(adjusted), mask)
    lse = np.array([np.log(np.exp(a[m]).sum()) if m.any() else 0.0
                    for a, m in zip(adjusted, mask)])
    s_p_tf = tf.constant(s_p)
    with tf.GradientTape() as tape:
        tape.watch(s_p_tf)
        w = corrected_weight(s_p_tf, tf.constant(lse), mask.sum(1))
    np.testing.assert_allclose(w.numpy(), weights, rtol=1e-10)
    assert w.numpy()[0] == 0.0
    assert tape.gradient(w, s_p_tf) is None or not np.any(tape.gradient(w, s_p_tf).numpy())


# ---------------------------------------------------- the four callers agree


def _in_batch_case(seed=0, batch=5, extra=3, dim=4):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, dim)).astype(np.float32)
    c = rng.normal(size=(batch + extra, dim)).astype(np.float32)
    ids = np.array([0, 1, 2, 1, 3, 4, 5, 2][:batch + extra])  # accidental hits included
    prob = rng.uniform(0.01, 0.4, size=batch + extra).astype(np.float32)
    return q, c, ids, prob


def _reference_with_excluded_log_q(q, c, ids, prob):
    """sampled_softmax_loss on each row's negatives with log Q' = proposal.excluded_log_q."""
    batch = len(q)
    scores = q @ c.T
    s_p = np.diag(scores[:, :batch])
    is_negative = ids[None, :] != ids[:batch, None]
    log_q = np.log(prob)
    log_q_prime = excluded_log_q(np.broadcast_to(log_q, scores.shape), log_q[:batch])
    loss = sampled_softmax_loss(s_p, scores, correction="corrected",
                                negative_log_q=log_q_prime, is_negative=is_negative)
    numpy_loss = loss_corrected(s_p, scores, np.log(prob / (1 - prob[:batch, None])),
                                is_negative)[0]
    np.testing.assert_allclose(loss.numpy(), numpy_loss, rtol=1e-5, atol=1e-6)
    return loss.numpy()


def test_in_batch_loss_task_and_hard_negative_task_agree_with_excluded_log_q():
    from tfrs_logq.tasks import CorrectedRetrieval

    q, c, ids, prob = _in_batch_case()
    expected = _reference_with_excluded_log_q(q, c, ids, prob)
    scores = tf.constant(q @ c.T)
    is_negative = tf.constant(ids[None, :] != ids[:len(q), None])
    got_loss = in_batch_softmax_loss(scores, correction="corrected",
                                     log_q=tf.math.log(prob), is_negative=is_negative)
    np.testing.assert_allclose(got_loss.numpy(), expected, rtol=1e-5)
    for hard in (None, len(ids)):  # every negative kept: the hard-negative path, same loss
        task = CorrectedRetrieval(reduction="none", num_hard_negatives=hard)
        got = task(q, c, candidate_sampling_probability=prob, candidate_ids=ids,
                   compute_metrics=False)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, err_msg=str(hard))


def test_sequence_objective_agrees_with_excluded_log_q_from_counts():
    from tfrs_logq.sasrec.objectives import SampledIds, make_objective

    rng = np.random.default_rng(3)
    num_items, dim = 9, 4
    queries = rng.normal(size=(2, 3, dim)).astype(np.float32)
    table = rng.normal(size=(num_items + 1, dim)).astype(np.float32)
    targets = np.array([[1, 4, 4], [0, 2, 7]])
    is_target = targets > 0
    counts = rng.integers(1, 30, size=num_items + 1)
    counts[0] = 0
    objective = make_objective("inbatch-corrected", num_items, counts, num_negatives=4,
                               native_kernels=False)
    in_batch = np.array([4, 2, 7, 1], np.int32)
    negatives = SampledIds(None, tf.constant(in_batch), tf.constant([True] * 4))
    got = objective.loss(queries, targets, is_target, table, negatives).numpy()

    q = queries.reshape(-1, dim)[is_target.reshape(-1)]
    t = targets.reshape(-1)[is_target.reshape(-1)]
    s_p = np.sum(q * table[t], axis=1)
    s_n = q @ table[in_batch].T
    log_q = np.log(np.maximum(counts, 1) / counts.sum())  # row 0 (padding) is never read
    log_q_prime = excluded_log_q(np.broadcast_to(log_q[in_batch], s_n.shape), log_q[t])
    per_position = sampled_softmax_loss(s_p, s_n, correction="corrected",
                                        negative_log_q=log_q_prime,
                                        is_negative=in_batch[None, :] != t[:, None])
    assert got == pytest.approx(float(np.mean(per_position.numpy())), rel=1e-5)


def test_diagnose_uses_the_losses_log_q_prime_and_weight():
    from tfrs_logq.studies.diagnose import _sampled_gradients

    rng = np.random.default_rng(4)
    n, num_items, dim = 4, 7, 3
    queries = rng.normal(size=(n, dim))
    items = rng.normal(size=(num_items, dim))
    positives = np.array([0, 1, 2, 2])
    negatives = np.array([[1, 2, 0], [1, 1, 3], [4, 5, 6], [2, 2, 2]])  # row 3: all hits
    q = rng.dirichlet(np.ones(num_items))
    grad, w_hat = _sampled_gradients("corrected", tf.constant(queries), tf.constant(items),
                                     tf.constant(positives), tf.constant(negatives),
                                     tf.constant(np.log(q)))
    s_p = np.sum(queries * items[positives], axis=1)
    s_n = np.einsum("nd,nkd->nk", queries, items[negatives])
    mask = negatives != positives[:, None]
    _, _, _, weights = loss_corrected(s_p, s_n, np.log(q[negatives] / (1 - q[positives, None])),
                                      mask)
    np.testing.assert_allclose(w_hat.numpy(), weights, rtol=1e-10)
    u = tf.constant(queries)
    with tf.GradientTape() as tape:
        tape.watch(u)
        loss = tf.reduce_sum(sampled_softmax_loss(
            tf.einsum("nd,nd->n", u, items[positives]),
            tf.einsum("nd,nkd->nk", u, items[negatives]),
            correction="corrected", is_negative=mask,
            negative_log_q=excluded_log_q(np.log(q[negatives]), np.log(q[positives]))))
    np.testing.assert_allclose(grad.numpy(), tape.gradient(loss, u).numpy(),
                               rtol=1e-12, atol=1e-15)


def test_a_positive_with_q_one_is_clipped_the_same_way_everywhere():
    """Q(p) = 1 (a caller's log Q of 0): every caller caps it at 1 - 1e-6, finite and equal."""
    from tfrs_logq.studies.diagnose import _sampled_gradients
    from tfrs_logq.tasks import CorrectedRetrieval

    q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    c = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], np.float32)
    log_q = np.log(np.array([1.0, 0.2, 0.1], np.float32))
    scores = q @ c.T
    is_negative = np.array([[False, True, True], [True, False, True]])
    expected = sampled_softmax_loss(
        np.diag(scores), scores, correction="corrected", is_negative=is_negative,
        negative_log_q=np.broadcast_to(log_q, (2, 3)) - np.log(  # the cap, in float32
            [[1 - float(np.float32(1 - COMPLEMENT_EPSILON))], [1 - 0.2]]).astype(np.float32),
        validate=False,  # log Q' above 0 is legitimate beside Q(p) = 1 (derived, not given)
    ).numpy()
    assert np.isfinite(expected).all()
    by_loss = in_batch_softmax_loss(tf.constant(scores), correction="corrected", log_q=log_q,
                                    is_negative=tf.constant(is_negative)).numpy()
    task = CorrectedRetrieval(reduction="none", num_hard_negatives=3)
    by_task = task(q, c, candidate_log_sampling_probability=log_q, candidate_ids=[0, 1, 2],
                   compute_metrics=False).numpy()
    np.testing.assert_allclose(by_loss, expected, rtol=1e-5)
    np.testing.assert_allclose(by_task, expected, rtol=1e-5)
    _, w_hat = _sampled_gradients("corrected", tf.constant(q, tf.float64),
                                  tf.constant(c, tf.float64), tf.constant([0, 1]),
                                  tf.constant([[1, 2], [0, 2]]), tf.constant(log_q, tf.float64))
    assert np.isfinite(w_hat.numpy()).all()


def test_mixture_log_q_is_the_same_in_the_sampler_and_in_diagnose():
    from tfrs_logq.frequency import ExactFrequency
    from tfrs_logq.sampling import InBatchSampler, MixedSampler, UniformSampler
    from tfrs_logq.studies.diagnose import Proposal

    counts = np.array([0, 6, 3, 1], np.float64)
    unigram = counts / counts.sum()
    frequency = ExactFrequency.from_counts(counts)
    sampler = MixedSampler(UniformSampler(3, 2, seed=1),
                           InBatchSampler(2, frequency=frequency, seed=1), log_q="mixture")
    drawn = sampler(tf.constant([1, 2, 3, 1]))
    valid = drawn.is_valid.numpy()
    ids = drawn.ids.numpy()[valid]
    # The sampler's catalog is ids 1..3; diagnose's rows are 0..3 with row 0 never drawn.
    expected = np.log(mixture_probability(unigram[ids], 0.5, 3))
    np.testing.assert_allclose(drawn.log_q.numpy()[valid], expected, rtol=1e-6)
    diag = Proposal("mixed", 4, unigram[1:])
    np.testing.assert_allclose(diag.log_q(), np.log(0.5 / 3 + 0.5 * unigram[1:]), rtol=1e-12)
    np.testing.assert_allclose(Proposal("mixed-unigram", 4, unigram[1:]).log_q(),
                               np.log(unigram[1:]), rtol=1e-12)


def test_proposal_log_q_table_of_each_kind_from_the_unigram_table():
    counts = np.array([0.0, 6.0, 3.0, 1.0])  # row 0: padding, never drawn
    with np.errstate(divide="ignore"):
        unigram = np.log(counts / counts.sum())
    np.testing.assert_array_equal(proposal_log_q_table(unigram, "unigram"), unigram)
    # MNS with 3 uniform and 1 in-batch negative per step over V = 3 items: a = 3 / 4.
    q = counts / counts.sum()
    mixture = proposal_log_q_table(unigram, "mixture", num_items=3, num_uniform=3,
                                   num_in_batch=1)
    np.testing.assert_allclose(mixture, np.log(0.75 / 3 + 0.25 * q), rtol=1e-12)
    # Deduplicated in-batch negatives of a batch of 4 draws: 1 - (1 - Q)^4.
    with np.errstate(divide="ignore"):
        inclusion = proposal_log_q_table(unigram, "inclusion", num_draws=4)
        expected = np.log(1.0 - (1.0 - q) ** 4)
    np.testing.assert_allclose(inclusion[1:], expected[1:], rtol=1e-9)
    assert inclusion[0] == -np.inf and inclusion.dtype == np.float64
    with pytest.raises(ValueError, match="^`proposal` must be one of unigram, mixture, "
                                         "inclusion, received 'per_draw'.$"):
        proposal_log_q_table(unigram, "per_draw")
