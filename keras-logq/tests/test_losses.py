"""`keras_logq.losses.sampled_softmax_loss`: values and gradients against the numpy
references of the paper's formulas (tests/reference.py), on the current backend."""

import numpy as np
import pytest
import reference
from conftest import jit, to_numpy, value_and_grads
from keras_logq.losses import sampled_softmax_loss

B, N = 5, 7


def _case(rng, poison=True):
    """Logits, per-row log Q, a mask with an all-masked last row, masked entries poisoned."""
    s_p = rng.normal(size=B)
    s_n = rng.normal(size=(B, N)) * 2.0
    log_q = np.log(rng.uniform(0.01, 0.3, size=(B, N)))
    log_q_p = np.log(rng.uniform(0.01, 0.3, size=B))
    mask = rng.uniform(size=(B, N)) > 0.3
    mask[0] = True
    mask[-1] = False  # no valid negative
    s_n_in, log_q_in = s_n.copy(), log_q.copy()
    if poison:  # masked entries may hold anything
        s_n_in[~mask] = np.where(rng.uniform(size=(~mask).sum()) > 0.5, np.inf, np.nan)
        log_q_in[~mask] = np.nan
    return s_p, s_n, log_q, log_q_p, mask, s_n_in, log_q_in


def _run(correction, s_p, s_n, mask, log_q=None, log_q_p=None, dtype="float32"):
    args = [s_p.astype(dtype), s_n.astype(dtype), mask]
    if log_q is not None:
        args.append(log_q.astype(dtype))
    if log_q_p is not None:
        args.append(log_q_p.astype(dtype))

    def fn(sp, sn, m, *rest):
        kwargs = {}
        if log_q is not None:
            kwargs["negative_log_q"] = rest[0]
        if log_q_p is not None:
            kwargs["positive_log_q"] = rest[1]
        return sampled_softmax_loss(sp, sn, correction=correction, is_negative=m, **kwargs)

    return value_and_grads(fn, args, wrt=[0, 1])


def test_none_matches_reference(rng):
    s_p, s_n, _, _, mask, s_n_in, _ = _case(rng)
    loss, (g_p, g_n) = _run("none", s_p, s_n_in, mask)
    ref, ref_p, ref_n = reference.loss_none(s_p, s_n, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_n, rtol=1e-5, atol=1e-6)
    assert loss[-1] == 0.0 and g_p[-1] == 0.0


@pytest.mark.parametrize("correction", ["logq-official", "logq-tfrs"])
def test_logq_matches_reference(rng, correction):
    """``logq-official``: the positive's term e^{s_p}; ``logq-tfrs``: e^{s_p - log Q(p)}."""
    s_p, s_n, log_q, log_q_p, mask, s_n_in, log_q_in = _case(rng)
    lqp = log_q_p if correction == "logq-tfrs" else None
    loss, (g_p, g_n) = _run(correction, s_p, s_n_in, mask, log_q_in, lqp)
    ref, ref_p, ref_n = reference.loss_logq(s_p, s_n, log_q, mask, lqp)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_n, rtol=1e-5, atol=1e-6)
    assert np.isfinite(g_n).all()


def test_the_two_standard_forms_on_a_worked_example():
    # s_p = 0, negatives 0, 0 with Q = 0.5, 0.25, Q(p) = 0.5: official log(1 + 2 + 4),
    # tfrs log(2 + 2 + 4).
    args = (np.zeros(1, "float32"), np.zeros((1, 2), "float32"))
    log_q = np.log([[0.5, 0.25]]).astype("float32")
    official = sampled_softmax_loss(*args, correction="logq-official", negative_log_q=log_q)
    tfrs = sampled_softmax_loss(*args, correction="logq-tfrs", negative_log_q=log_q,
                                positive_log_q=np.log([0.5]).astype("float32"))
    np.testing.assert_allclose(to_numpy(official), [np.log(7.0)], rtol=1e-6)
    np.testing.assert_allclose(to_numpy(tfrs), [np.log(8.0)], rtol=1e-6)


def test_a_bare_logq_is_refused_naming_both_forms():
    args = (np.zeros(1, "float32"), np.zeros((1, 2), "float32"))
    message = (r"^correction 'logq' is ambiguous: use 'logq-tfrs' \(TFRS's Retrieval: the "
               r"positive's logit corrected too\) or 'logq-official' \(the paper's code: the "
               r"positive uncorrected\)\.$")
    with pytest.raises(ValueError, match=message):
        sampled_softmax_loss(*args, correction="logq", negative_log_q=np.zeros((1, 2)))
    from keras_logq import CorrectedRetrieval, CorrectedRetrievalLoss

    with pytest.raises(ValueError, match=message):
        CorrectedRetrieval(correction="logq")
    with pytest.raises(ValueError, match=message):
        CorrectedRetrievalLoss(correction="logq")


def test_positive_log_q_is_required_by_logq_tfrs_and_refused_by_the_others():
    args = (np.zeros(2, "float32"), np.zeros((2, 3), "float32"))
    log_q = np.full((2, 3), -1.0, "float32")
    with pytest.raises(ValueError, match="`positive_log_q` is required for "
                                         "correction='logq-tfrs'"):
        sampled_softmax_loss(*args, correction="logq-tfrs", negative_log_q=log_q)
    for correction in ("logq-official", "corrected"):
        with pytest.raises(ValueError, match="`positive_log_q` is only used by "
                                             "correction='logq-tfrs'"):
            sampled_softmax_loss(*args, correction=correction, negative_log_q=log_q,
                                 positive_log_q=np.zeros(2, "float32"))


def test_corrected_matches_reference_with_stop_gradient_weight(rng):
    s_p, s_n, log_q, _, mask, s_n_in, log_q_in = _case(rng)
    loss, (g_p, g_n) = _run("corrected", s_p, s_n_in, mask, log_q_in)
    ref, ref_p, ref_n, weights = reference.loss_corrected(s_p, s_n, log_q, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    # dL/ds_p = -w exactly: the weight is held constant (stop-gradient).
    np.testing.assert_allclose(g_p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, -weights, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_n, rtol=1e-5, atol=1e-6)
    # The row without a valid negative: loss 0, zero (finite) gradients.
    assert loss[-1] == 0.0 and g_p[-1] == 0.0 and (g_n[-1] == 0.0).all()


def test_corrected_paper_example():
    # s_p = 2; negatives s = 0, 1 with Q = 0.1, 0.2; Q(p) = 0.5: log Q' = log 0.2, log 0.4.
    loss = sampled_softmax_loss(np.array([2.0], "float32"), np.array([[0.0, 1.0]], "float32"),
                                correction="corrected",
                                negative_log_q=np.log([[0.2, 0.4]]).astype("float32"))
    ref = reference.loss_corrected(np.array([2.0]), np.array([[0.0, 1.0]]),
                                   np.log([[0.2, 0.4]]), np.ones((1, 2), bool))[0]
    np.testing.assert_allclose(to_numpy(loss), ref, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(loss), [0.2076], atol=1e-4)


def test_one_dimensional_log_q_is_shared_by_rows(rng):
    s_p, s_n = rng.normal(size=B), rng.normal(size=(B, N))
    log_q = np.log(rng.uniform(0.01, 0.3, size=N))
    mask = np.ones((B, N), bool)
    for correction, ref_fn in (("logq-official", reference.loss_logq),
                               ("corrected", reference.loss_corrected)):
        loss = sampled_softmax_loss(s_p.astype("float32"), s_n.astype("float32"),
                                    correction=correction,
                                    negative_log_q=log_q.astype("float32"))
        ref = ref_fn(s_p, s_n, np.broadcast_to(log_q, (B, N)), mask)[0]
        np.testing.assert_allclose(to_numpy(loss), ref, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("correction", ["none", "logq-official", "corrected"])
def test_half_precision_inputs_computed_in_float32(rng, dtype, correction):
    import keras

    s_p, s_n, log_q, _, mask, s_n_in, log_q_in = _case(rng, poison=False)
    cast = lambda x: keras.ops.convert_to_tensor(x.astype("float32"), dtype=dtype)  # noqa: E731
    rounded = lambda x: to_numpy(keras.ops.cast(cast(x), "float32")).astype(np.float64)  # noqa
    kwargs = {} if correction == "none" else {"negative_log_q": cast(log_q)}
    loss = sampled_softmax_loss(cast(s_p), cast(s_n), correction=correction,
                                is_negative=mask, **kwargs)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"
    # Exactly the float32 loss of the rounded inputs (no half-precision arithmetic inside).
    if correction == "none":
        ref = reference.loss_none(rounded(s_p), rounded(s_n), mask)[0]
    elif correction == "logq-official":
        ref = reference.loss_logq(rounded(s_p), rounded(s_n), rounded(log_q), mask)[0]
    else:
        ref = reference.loss_corrected(rounded(s_p), rounded(s_n), rounded(log_q), mask)[0]
    np.testing.assert_allclose(to_numpy(loss), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("correction", ["none", "logq-official", "corrected"])
def test_jit_compiled_equals_reference(rng, correction):
    s_p, s_n, log_q, _, mask, s_n_in, log_q_in = _case(rng)

    def fn(sp, sn, lq, m):
        kwargs = {} if correction == "none" else {"negative_log_q": lq}
        return sampled_softmax_loss(sp, sn, correction=correction, is_negative=m, **kwargs)

    compiled = jit(fn)
    import keras

    args = [keras.ops.convert_to_tensor(a) for a in
            (s_p.astype("float32"), s_n_in.astype("float32"), log_q_in.astype("float32"), mask)]
    out = to_numpy(compiled(*args))
    if correction == "none":
        ref = reference.loss_none(s_p, s_n, mask)[0]
    elif correction == "logq-official":
        ref = reference.loss_logq(s_p, s_n, log_q, mask)[0]
    else:
        ref = reference.loss_corrected(s_p, s_n, log_q, mask)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_bad_input_raises_value_error_naming_the_argument():
    s_p, s_n = np.zeros(3, "float32"), np.zeros((3, 4), "float32")
    with pytest.raises(ValueError, match="correction"):
        sampled_softmax_loss(s_p, s_n, correction="sampled")
    with pytest.raises(ValueError, match="negative_log_q"):
        sampled_softmax_loss(s_p, s_n, correction="corrected")
    with pytest.raises(ValueError, match="positive_log_q"):
        sampled_softmax_loss(s_p, s_n, correction="corrected", negative_log_q=s_n,
                             positive_log_q=s_p)
    with pytest.raises(ValueError, match="positive_logits.*floating"):
        sampled_softmax_loss(np.zeros(3, "int32"), s_n, correction="none")
    with pytest.raises(ValueError, match="negative_logits.*rows"):
        sampled_softmax_loss(s_p, np.zeros((2, 4), "float32"), correction="none")
    with pytest.raises(ValueError, match="is_negative.*bool"):
        sampled_softmax_loss(s_p, s_n, correction="none", is_negative=np.ones((3, 4), "int32"))
    with pytest.raises(ValueError, match="negative_log_q.*entries"):
        sampled_softmax_loss(s_p, s_n, correction="logq-official",
                             negative_log_q=np.zeros(5, "float32"))


# ------------------------------------------------ proposals: per draw, inclusion (tfrs_logq's)

def _run_proposal(proposal, s_p, s_n, mask, log_q, dtype="float32"):
    def fn(sp, sn, m, lq):
        return sampled_softmax_loss(sp, sn, correction="corrected", is_negative=m,
                                    negative_log_q=lq, proposal=proposal)

    return value_and_grads(fn, [s_p.astype(dtype), s_n.astype(dtype), mask,
                                log_q.astype(dtype)], wrt=[0, 1])


def test_inclusion_proposal_matches_the_horvitz_thompson_formula(rng):
    """``proposal="inclusion"``: ``negative_log_q`` holds ``log pi(d)`` (deduplicated draws);
    the weight's P(p|u) is e^{s_p} / (e^{s_p} + sum_i e^{s_i} / pi_i), no 1/n
    (tests/reference.py, as tfrs_logq's test)."""
    s_p, s_n, log_pi, _, mask, s_n_in, log_pi_in = _case(rng)
    loss, (g_p, g_n) = _run_proposal("inclusion", s_p, s_n_in, mask, log_pi_in)
    ref, ref_p, ref_n, weights = reference.loss_corrected(s_p, s_n, log_pi, mask,
                                                          inclusion=True)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, -weights, rtol=1e-5, atol=1e-6)  # w held constant
    np.testing.assert_allclose(g_n, ref_n, rtol=1e-5, atol=1e-6)
    assert loss[-1] == 0.0 and g_p[-1] == 0.0 and (g_n[-1] == 0.0).all()  # no negative
    assert (g_n[~mask] == 0.0).all()
    per_draw, (per_draw_p, _) = _run_proposal("per_draw", s_p, s_n_in, mask, log_pi_in)
    np.testing.assert_allclose(per_draw, reference.loss_corrected(s_p, s_n, log_pi, mask)[0],
                               rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(loss - per_draw)[:-1] > 1e-4)  # the 1/n: the proposals differ


@pytest.mark.parametrize("proposal", ["per_draw", "inclusion"])
def test_jit_compiled_proposal_equals_reference(rng, proposal):
    import keras

    s_p, s_n, log_q, _, mask, s_n_in, log_q_in = _case(rng)
    compiled = jit(lambda sp, sn, lq, m: sampled_softmax_loss(
        sp, sn, correction="corrected", negative_log_q=lq, is_negative=m, proposal=proposal))
    args = [keras.ops.convert_to_tensor(a) for a in
            (s_p.astype("float32"), s_n_in.astype("float32"), log_q_in.astype("float32"), mask)]
    ref = reference.loss_corrected(s_p, s_n, log_q, mask, inclusion=proposal == "inclusion")[0]
    np.testing.assert_allclose(to_numpy(compiled(*args)), ref, rtol=1e-5, atol=1e-6)


def test_the_standard_forms_read_log_q_as_given_whatever_the_proposal(rng):
    s_p, s_n, log_q, _, mask, s_n_in, log_q_in = _case(rng)
    args = (s_p.astype("float32"), s_n_in.astype("float32"))
    for proposal in ("per_draw", "inclusion"):
        got = sampled_softmax_loss(*args, correction="logq-official", is_negative=mask,
                                   negative_log_q=log_q_in.astype("float32"),
                                   proposal=proposal)
        np.testing.assert_allclose(to_numpy(got), reference.loss_logq(s_p, s_n, log_q, mask)[0],
                                   rtol=1e-5, atol=1e-6)


def test_an_unknown_proposal_is_refused_naming_the_argument():
    args = (np.zeros(2, "float32"), np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"^`proposal` must be one of \('per_draw', "
                                         r"'inclusion'\), received 'set'\.$"):
        sampled_softmax_loss(*args, correction="corrected", negative_log_q=np.full(
            (2, 3), -1.0, "float32"), proposal="set")


@pytest.mark.parametrize("proposal", ["per_draw", "inclusion"])
def test_corrected_weight_is_one_minus_p_with_no_gradient(rng, proposal):
    """`corrected_weight` against the reference's ``1 - P`` (0 where a row has no negative),
    and its gradient is zero (stop-gradient)."""
    from keras_logq.losses import corrected_weight

    s_p, s_n, log_q, _, mask, _, _ = _case(rng)
    inclusion = proposal == "inclusion"
    weights = reference.loss_corrected(s_p, s_n, log_q, mask, inclusion=inclusion)[3]
    lse = np.array([reference.logsumexp((s_n[r] - log_q[r])[mask[r]]) for r in range(B)])
    lse[~mask.any(1)] = 0.0  # -inf for an empty row: any finite value
    num_valid = mask.sum(1).astype("int32")
    args = [s_p.astype("float32"), lse.astype("float32"), num_valid]
    w = to_numpy(corrected_weight(*args, proposal))
    np.testing.assert_allclose(w, weights, rtol=1e-5, atol=1e-6)
    assert w[-1] == 0.0
    # d(w s_p)/ds_p = w and d(w s_p)/d lse = 0: w is a constant to the gradient.
    _, (g_p, g_lse) = value_and_grads(
        lambda sp, ls, n: corrected_weight(sp, ls, n, proposal) * sp, args, wrt=[0, 1])
    np.testing.assert_allclose(g_p, w, rtol=1e-6, atol=1e-7)
    assert (g_lse == 0.0).all()


def test_excluded_log_q_is_log_q_minus_log_one_minus_q_p(rng):
    """``log Q'(d) = log Q(d) - log(1 - Q(p))`` from `[n]` or `[batch, n]` ``log Q``;
    ``Q(p)`` capped at 1 - 1e-6 (``Q(p) = 1`` stays finite), as tfrs_logq."""
    from keras_logq.losses import excluded_log_q, log_complement

    log_q = np.log(rng.uniform(0.01, 0.3, size=(B, N)))
    q_p = rng.uniform(0.01, 0.9, size=B)
    q_p[0] = 1.0
    cap = float(np.float32(1.0 - 1e-6))  # the float32 cap
    want = log_q - np.log1p(-np.minimum(q_p, cap))[:, None]
    got = to_numpy(excluded_log_q(log_q.astype("float32"), np.log(q_p).astype("float32")))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got[0, 0] == pytest.approx(log_q[0, 0] + 13.80, abs=0.01)
    shared = to_numpy(excluded_log_q(log_q[0].astype("float32"), np.log(q_p).astype("float32")))
    np.testing.assert_allclose(shared, log_q[0][None, :] - np.log1p(-np.minimum(q_p, cap))[:, None],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(log_complement(np.log(q_p[1:]).astype("float32"))),
                               np.log1p(-q_p[1:]), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"`positive_log_q` must be `\[batch\]`"):
        excluded_log_q(log_q, log_q)
    with pytest.raises(ValueError, match="`negative_log_q` must have rank 1 or 2"):
        excluded_log_q(np.zeros((2, 3, 4)), np.zeros(2))


def test_corrected_with_excluded_log_q_matches_the_reference(rng):
    """What the accelerator study runs: ``"corrected"`` fed `excluded_log_q` of a shared
    `[n]` ``log Q`` and each row's ``log Q(p)``; values and gradients."""
    from keras_logq.losses import excluded_log_q

    s_p, s_n, _, log_q_p, mask, s_n_in, _ = _case(rng)
    log_q = np.log(rng.uniform(0.01, 0.3, size=N))

    def fn(sp, sn, m, lq, lqp):
        return sampled_softmax_loss(sp, sn, correction="corrected", is_negative=m,
                                    negative_log_q=excluded_log_q(lq, lqp))

    loss, (g_p, g_n) = value_and_grads(
        fn, [s_p.astype("float32"), s_n_in.astype("float32"), mask, log_q.astype("float32"),
             log_q_p.astype("float32")], wrt=[0, 1])
    log_q_prime = log_q[None, :] - np.log1p(-np.exp(log_q_p))[:, None]
    ref, ref_p, ref_n, _ = reference.loss_corrected(s_p, s_n, log_q_prime, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_n, rtol=1e-5, atol=1e-6)


def test_inclusion_log_q_is_the_chance_that_b_draws_include_the_item(rng):
    from keras_logq.losses import inclusion_log_q

    q = rng.uniform(1e-4, 0.2, size=7)
    for draws in (1, 16, 100):
        got = to_numpy(inclusion_log_q(np.log(q).astype("float32"), draws))
        np.testing.assert_allclose(np.exp(got), 1.0 - (1.0 - q) ** draws, rtol=1e-5)
    assert float(np.exp(to_numpy(inclusion_log_q(np.log([0.01], dtype="float32"), 100))[0])) \
        == pytest.approx(0.634, abs=1e-3)  # not B * Q = 1
