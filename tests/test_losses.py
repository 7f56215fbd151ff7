"""Specification of `tfrs_logq.losses.sampled_softmax_loss` against numpy references."""

import numpy as np
import pytest
import tensorflow as tf
from reference import loss_corrected, loss_logq, loss_none

from tfrs_logq.losses import sampled_softmax_loss


def _inputs(seed=0, batch=6, n=9, scale=3.0, mask_rate=0.3):
    rng = np.random.default_rng(seed)
    s_p = rng.normal(size=batch) * scale
    s_n = rng.normal(size=(batch, n)) * scale
    log_q = np.log(rng.dirichlet(np.ones(n) * 0.5, size=batch) + 1e-4)
    log_q_p = np.log(rng.uniform(0.001, 0.3, size=batch))
    mask = rng.uniform(size=(batch, n)) > mask_rate
    mask[0] = False  # a row with no valid negative
    mask[1] = True
    return s_p, s_n, log_q, log_q_p, mask


def _loss_and_grads(correction, s_p, s_n, dtype=tf.float32, **kw):
    p = tf.Variable(tf.constant(s_p, dtype))
    n = tf.Variable(tf.constant(s_n, dtype))
    with tf.GradientTape() as tape:
        loss = sampled_softmax_loss(p, n, correction=correction, **kw)
        total = tf.reduce_sum(loss)
    g_p, g_n = tape.gradient(total, [p, n])
    return loss.numpy(), g_p.numpy(), g_n.numpy()


def test_none_matches_formula_values_and_gradients():
    s_p, s_n, _, _, mask = _inputs()
    loss, g_p, g_n = _loss_and_grads("none", s_p, s_n, is_negative=mask)
    ref, ref_gp, ref_gn = loss_none(s_p, s_n, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_p, ref_gp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_gn, rtol=1e-5, atol=1e-6)
    assert loss[0] == pytest.approx(0.0, abs=1e-6)  # no negative: softmax over the positive


@pytest.mark.parametrize("correction", ["logq-official", "logq-tfrs"])
def test_logq_matches_formula(correction):
    """``logq-official``: -s_p + log(e^{s_p} + sum_i e^{s_i - log Q(d_i)}); ``logq-tfrs``:
    the positive's term e^{s_p - log Q(p)} (value and gradient, numpy references)."""
    s_p, s_n, log_q, log_q_p, mask = _inputs(seed=1)
    kw = dict(negative_log_q=log_q, is_negative=mask)
    if correction == "logq-tfrs":
        kw["positive_log_q"] = log_q_p
    loss, g_p, g_n = _loss_and_grads(correction, s_p, s_n, **kw)
    ref, ref_gp, ref_gn = loss_logq(s_p, s_n, log_q, mask, kw.get("positive_log_q"))
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_p, ref_gp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_gn, rtol=1e-5, atol=1e-6)


def test_the_two_standard_forms_differ_only_in_the_positives_term():
    # One row, s_p = 0, two negatives scored 0 with Q = 0.5 and 0.25, Q(p) = 0.5.
    # logq-official: log(1 + 2 + 4) = log 7; logq-tfrs: log(2 + 2 + 4) = log 8.
    s_p, s_n = np.zeros(1), np.zeros((1, 2))
    log_q = np.log([[0.5, 0.25]])
    official, g_official, _ = _loss_and_grads("logq-official", s_p, s_n, negative_log_q=log_q)
    tfrs_form, g_tfrs, _ = _loss_and_grads("logq-tfrs", s_p, s_n, negative_log_q=log_q,
                                           positive_log_q=np.log([0.5]))
    np.testing.assert_allclose(official, [np.log(7.0)], rtol=1e-6)
    np.testing.assert_allclose(tfrs_form, [np.log(8.0)], rtol=1e-6)
    np.testing.assert_allclose(g_official, [1 / 7 - 1], rtol=1e-6)  # softmax_p - 1
    np.testing.assert_allclose(g_tfrs, [2 / 8 - 1], rtol=1e-6)


def test_a_bare_logq_is_refused_naming_both_forms():
    s_p, s_n, log_q, _, _ = _inputs()
    with pytest.raises(ValueError, match=r"^correction 'logq' is ambiguous: use 'logq-tfrs' "
                                         r"\(TFRS's Retrieval.*or 'logq-official' \(the paper's"):
        sampled_softmax_loss(s_p, s_n, correction="logq", negative_log_q=log_q)


def test_positive_log_q_is_required_by_logq_tfrs_and_refused_by_logq_official():
    s_p, s_n, log_q, log_q_p, _ = _inputs()
    with pytest.raises(ValueError, match="`positive_log_q` is required for "
                                         "correction='logq-tfrs'"):
        sampled_softmax_loss(s_p, s_n, correction="logq-tfrs", negative_log_q=log_q)
    with pytest.raises(ValueError, match="`positive_log_q` is only used by "
                                         "correction='logq-tfrs'"):
        sampled_softmax_loss(s_p, s_n, correction="logq-official", negative_log_q=log_q,
                             positive_log_q=log_q_p)


def test_logq_accepts_shared_log_q_vector():
    s_p, s_n, log_q, _, mask = _inputs(seed=2)
    shared = log_q[3]
    loss, _, _ = _loss_and_grads("logq-official", s_p, s_n, negative_log_q=shared,
                                 is_negative=mask)
    ref, _, _ = loss_logq(s_p, s_n, np.broadcast_to(shared, s_n.shape), mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-5)


def test_corrected_matches_formula_and_weight_gets_no_gradient():
    s_p, s_n, log_q, _, mask = _inputs(seed=3)
    loss, g_p, g_n = _loss_and_grads(
        "corrected", s_p, s_n, negative_log_q=log_q, is_negative=mask
    )
    ref, ref_gp, ref_gn, w = loss_corrected(s_p, s_n, log_q, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    # With w held constant: dL/ds_p = -w and dL/ds_i = w softmax_i. A gradient
    # flowing through w would add dw/ds terms and break both equalities.
    np.testing.assert_allclose(g_p, ref_gp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_gn, rtol=1e-5, atol=1e-6)
    assert (w[1:] > 0).all() and (w < 1).all()
    # The empty row contributes 0 with finite (zero) gradients.
    assert loss[0] == 0.0 and g_p[0] == 0.0 and np.all(g_n[0] == 0.0)


def test_corrected_positive_not_in_denominator():
    # Raising s_p by a lot drives the weight to 0, but the log-ratio term keeps
    # growing linearly: the positive is absent from the normaliser.
    s_n = np.zeros((1, 4))
    log_q = np.full((1, 4), np.log(0.25))
    for s in (0.0, 5.0):
        loss, _, _ = _loss_and_grads("corrected", np.array([s]), s_n, negative_log_q=log_q)
        ref, _, _, w = loss_corrected(np.array([s]), s_n, log_q, np.ones((1, 4), bool))
        np.testing.assert_allclose(loss, ref, rtol=1e-6)
    # At s_p = 0: sum_i e^{0 - log .25} = 16, P = 1 / (1 + 16/4) = 0.2, w = 0.8.
    loss, g_p, _ = _loss_and_grads("corrected", np.array([0.0]), s_n, negative_log_q=log_q)
    np.testing.assert_allclose(g_p, [-0.8], rtol=1e-6)
    np.testing.assert_allclose(loss, [0.8 * np.log(16.0)], rtol=1e-6)


@pytest.mark.parametrize("correction", ["none", "logq-official", "corrected"])
def test_extreme_logits_are_finite(correction):
    s_p = np.array([1e4, -1e4, 0.0, 1e4])
    s_n = np.array([[-1e4, 1e4, 0.0], [1e4, 1e4, -1e4], [0.0, 0.0, 1e4], [1e4, 1e4, 1e4]])
    log_q = np.log(np.full((4, 3), 0.1))
    mask = np.array([[1, 1, 1], [1, 0, 1], [1, 1, 0], [0, 1, 1]], bool)
    kw = dict(is_negative=mask)
    if correction != "none":
        kw["negative_log_q"] = log_q
    loss, g_p, g_n = _loss_and_grads(correction, s_p, s_n, **kw)
    assert np.isfinite(loss).all() and np.isfinite(g_p).all() and np.isfinite(g_n).all()
    if correction == "none":
        ref = loss_none(s_p, s_n, mask)[0]
    elif correction == "logq-official":
        ref = loss_logq(s_p, s_n, log_q, mask)[0]
    else:
        ref = loss_corrected(s_p, s_n, log_q, mask)[0]
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-2)


def test_masked_entries_may_hold_inf_and_nan():
    s_p, s_n, log_q, _, mask = _inputs(seed=4)
    dirty = s_n.copy()
    dirty[~mask] = np.inf
    dirty_q = log_q.copy()
    dirty_q[~mask] = np.nan
    loss, g_p, g_n = _loss_and_grads(
        "corrected", s_p, dirty, negative_log_q=dirty_q, is_negative=mask
    )
    ref, ref_gp, ref_gn, _ = loss_corrected(s_p, s_n, log_q, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_gn, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("correction", ["none", "logq-official", "corrected"])
def test_half_precision_inputs_compute_in_float32(dtype, correction):
    s_p, s_n, log_q, _, mask = _inputs(seed=5, scale=2.0)
    kw = dict(is_negative=mask)
    if correction != "none":
        kw["negative_log_q"] = tf.constant(log_q, dtype)
    loss, g_p, g_n = _loss_and_grads(correction, s_p, s_n, dtype=dtype, **kw)
    assert loss.dtype == np.float32
    # Reference on the half-precision-rounded inputs.
    sp = tf.cast(tf.constant(s_p, dtype), tf.float64).numpy()
    sn = tf.cast(tf.constant(s_n, dtype), tf.float64).numpy()
    lq = tf.cast(tf.constant(log_q, dtype), tf.float64).numpy()
    ref = {
        "none": lambda: loss_none(sp, sn, mask)[0],
        "logq-official": lambda: loss_logq(sp, sn, lq, mask)[0],
        "corrected": lambda: loss_corrected(sp, sn, lq, mask)[0],
    }[correction]()
    np.testing.assert_allclose(loss, ref, rtol=1e-4, atol=1e-4)
    assert np.isfinite(g_n.astype(np.float32)).all()


def test_float64_inputs_stay_float64():
    s_p, s_n, log_q, _, mask = _inputs(seed=6)
    loss = sampled_softmax_loss(
        tf.constant(s_p), tf.constant(s_n), correction="corrected",
        negative_log_q=tf.constant(log_q), is_negative=mask,
    )
    assert loss.dtype == tf.float64
    np.testing.assert_allclose(loss.numpy(), loss_corrected(s_p, s_n, log_q, mask)[0], rtol=1e-12)


@pytest.mark.parametrize("jit", [False, True])
def test_graph_mode_and_xla_match_eager(jit):
    s_p, s_n, log_q, _, mask = _inputs(seed=7)
    args = [tf.constant(x, tf.float32) for x in (s_p, s_n, log_q)]

    @tf.function(jit_compile=jit)
    def f(p, n, q, m):
        with tf.GradientTape() as tape:
            tape.watch(n)
            loss = sampled_softmax_loss(
                p, n, correction="corrected", negative_log_q=q, is_negative=m
            )
            total = tf.reduce_sum(loss)
        return loss, tape.gradient(total, n)

    loss, grad = f(*args, tf.constant(mask))
    ref, _, ref_gn, _ = loss_corrected(s_p, s_n, log_q, mask)
    np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad.numpy(), ref_gn, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_logq_lowers_the_logit_of_a_popular_negative(correction):
    # Two negatives with equal scores; the popular one (higher Q) must receive a
    # smaller push-down gradient than the rare one: its effective logit is lower.
    s_p = np.array([0.5])
    s_n = np.array([[1.0, 1.0, 0.0]])
    log_q = np.log(np.array([[0.5, 0.01, 0.1]]))
    _, _, g_n = _loss_and_grads(correction, s_p, s_n, negative_log_q=log_q)
    assert g_n[0, 0] < g_n[0, 1]
    _, _, g_none = _loss_and_grads("none", s_p, s_n)
    assert g_none[0, 0] == pytest.approx(g_none[0, 1])


def test_errors_name_the_argument():
    s_p, s_n, log_q, _, _ = _inputs()
    with pytest.raises(ValueError, match="correction"):
        sampled_softmax_loss(s_p, s_n, correction="bogus")
    with pytest.raises(ValueError, match="negative_log_q.*required"):
        sampled_softmax_loss(s_p, s_n, correction="corrected")
    with pytest.raises(ValueError, match="positive_logits.*rank 1"):
        sampled_softmax_loss(s_n, s_n, correction="none")
    with pytest.raises(ValueError, match="negative_logits.*rows"):
        sampled_softmax_loss(s_p[:3], s_n, correction="none")
    with pytest.raises(ValueError, match="negative_log_q.*columns"):
        sampled_softmax_loss(s_p, s_n, correction="logq-official", negative_log_q=log_q[:, :2])
    with pytest.raises(ValueError, match="is_negative.*bool"):
        sampled_softmax_loss(s_p, s_n, correction="none", is_negative=np.ones_like(s_n))
    with pytest.raises(ValueError, match="positive_logits.*floating"):
        sampled_softmax_loss(np.arange(6), s_n, correction="none")
    with pytest.raises(ValueError, match="positive_log_q"):
        sampled_softmax_loss(
            s_p, s_n, correction="corrected", negative_log_q=log_q, positive_log_q=s_p
        )


def test_inclusion_proposal_matches_the_horvitz_thompson_formula():
    """``proposal="inclusion"``: log_q holds log pi(d) (deduplicated draws); the weight's
    P(p|u) is e^{s_p} / (e^{s_p} + sum_i e^{s_i} / pi_i), no 1/n (tests/reference.py)."""
    s_p, s_n, log_pi, _, mask = _inputs(seed=4)
    loss, g_p, g_n = _loss_and_grads("corrected", s_p, s_n, negative_log_q=log_pi,
                                     is_negative=mask, proposal="inclusion")
    ref, ref_gp, ref_gn, _ = loss_corrected(s_p, s_n, log_pi, mask, inclusion=True)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, ref_gp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_gn, rtol=1e-5, atol=1e-6)
    per_draw = _loss_and_grads("corrected", s_p, s_n, negative_log_q=log_pi,
                               is_negative=mask)[0]
    assert not np.allclose(loss[1:], per_draw[1:])
    with pytest.raises(ValueError, match="proposal"):
        sampled_softmax_loss(s_p, s_n, correction="corrected", negative_log_q=log_pi,
                             proposal="set")


def test_inclusion_weight_estimates_one_minus_p_on_deduplicated_draws():
    """The weight on deduplicated in-batch draws, at a model equal to the truth (a row's
    P(d|u) proportional to Q(d) times a random preference): with pi = 1 - (1 - Q)^B and the
    Horvitz-Thompson normaliser its mean is the true mean of 1 - P(p|u) and that of the
    paper's per-draw estimate on the same draws without deduplication; the per-draw
    formula fed pi (the 1/n and 1 - pi(p) factors) is far below it."""
    from tfrs_logq.losses import corrected_weight

    rng = np.random.default_rng(0)
    num_items, batch, rows = 2_000, 256, 400
    q = 1.0 / np.arange(1, num_items + 1) ** 1.05
    q /= q.sum()
    pi = 1.0 - (1.0 - q) ** batch
    s = np.log(q) + rng.normal(size=(rows, num_items)) * 2.5  # each row's true logits
    p_true = np.exp(s - s.max(1, keepdims=True))
    p_true /= p_true.sum(1, keepdims=True)
    positives = np.array([rng.choice(num_items, p=p_true[r]) for r in range(rows)])
    lse, lse_misread, lse_draws, num_valid, num_draws = [], [], [], [], []
    for r, p in enumerate(positives):
        draws = rng.choice(num_items, size=batch - 1, p=q)  # the others' positives
        draws = draws[draws != p]
        pool = np.unique(draws)
        lse.append(np.logaddexp.reduce(s[r, pool] - np.log(pi[pool])))
        # pi read as a per-draw Q, Q(p) capped at 1 - 1e-6 as `proposal.log_complement` does
        lse_misread.append(lse[-1] + np.log1p(-min(pi[p], 1 - 1e-6)))
        lse_draws.append(np.logaddexp.reduce(s[r, draws] - np.log(q[draws] / (1 - q[p]))))
        num_valid.append(len(pool))
        num_draws.append(len(draws))

    def weight(lse_rows, counts, proposal="per_draw"):
        s_p = tf.constant(s[np.arange(rows), positives])
        return np.mean(corrected_weight(s_p, tf.constant(lse_rows), tf.constant(counts),
                                        proposal=proposal).numpy())

    truth = np.mean(1.0 - p_true[np.arange(rows), positives])
    w = weight(lse, num_valid, "inclusion")
    assert w == pytest.approx(truth, abs=0.02)
    assert w == pytest.approx(weight(lse_draws, num_draws), abs=0.01)  # the paper's, i.i.d.
    assert weight(lse_misread, num_valid) < truth - 0.3


# log Q > 0 is a probability above 1: refused as CorrectedRetrieval refuses it.
# The old function returned a negative loss for it.
def _above_one_inputs():
    s_p = np.array([2.0, 1.0])
    s_n = np.array([[0.5, 1.5, 0.0], [1.0, 0.2, 3.0]])
    log_q = np.log(np.array([[0.1, 0.2, 0.3], [0.1, 8.0, 0.3]]))  # Q = 8 in row 1
    return s_p, s_n, log_q


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_log_q_above_zero_is_refused_eagerly(correction):
    s_p, s_n, log_q = _above_one_inputs()
    with pytest.raises(ValueError, match=r"`negative_log_q` must hold per-draw proposal .*"
                                         r"received 2\.079 \(Q = 8\)"):
        sampled_softmax_loss(s_p, s_n, correction=correction, negative_log_q=log_q)
    # A shared [n] log Q.
    with pytest.raises(ValueError, match="`negative_log_q` must hold per-draw proposal"):
        sampled_softmax_loss(s_p, s_n, correction=correction, negative_log_q=log_q[1])


def test_positive_log_q_above_zero_is_refused():
    s_p, s_n, log_q = _above_one_inputs()
    with pytest.raises(ValueError, match="`positive_log_q` must hold per-draw proposal"):
        sampled_softmax_loss(s_p, s_n, correction="logq-tfrs",
                             negative_log_q=log_q[:1].repeat(2, 0),
                             positive_log_q=np.array([-1.0, 0.5]))


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_log_q_above_zero_is_refused_in_a_tf_function(correction):
    s_p, s_n, log_q = _above_one_inputs()
    spec = tf.TensorSpec([None, 3], tf.float64)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64), spec, spec])
    def loss(p, n, q):
        return sampled_softmax_loss(p, n, correction=correction, negative_log_q=q)

    good = np.log(np.full((2, 3), 0.2))
    assert np.all(np.isfinite(loss(s_p, s_n, good).numpy()))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="`negative_log_q` must hold per-draw proposal probabilities"):
        loss(s_p, s_n, log_q)


@pytest.mark.parametrize("correction", ["logq-official", "corrected"])
def test_masked_entries_may_hold_log_q_above_zero(correction):
    s_p, s_n, log_q = _above_one_inputs()
    mask = np.ones((2, 3), bool)
    mask[1, 1] = False  # the Q = 8 entry: an accidental hit, say
    clean = log_q.copy()
    clean[1, 1] = np.log(0.2)
    loss = sampled_softmax_loss(s_p, s_n, correction=correction, negative_log_q=log_q,
                                is_negative=mask)
    ref = (loss_logq(s_p, s_n, clean, mask) if correction == "logq-official"
           else loss_corrected(s_p, s_n, clean, mask))[0]
    np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-6)

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float64)] * 2)
    def graph_loss(q, is_negative_float):
        return sampled_softmax_loss(s_p, s_n, correction=correction, negative_log_q=q,
                                    is_negative=is_negative_float > 0)

    np.testing.assert_allclose(graph_loss(log_q, mask.astype(np.float64)).numpy(), ref,
                               rtol=1e-6)


def test_validate_false_skips_the_log_q_check():
    s_p, s_n, log_q = _above_one_inputs()
    loss = sampled_softmax_loss(s_p, s_n, correction="logq-official", negative_log_q=log_q,
                                validate=False)
    np.testing.assert_allclose(loss.numpy(), loss_logq(s_p, s_n, log_q, np.ones((2, 3), bool))[0],
                               rtol=1e-6)
