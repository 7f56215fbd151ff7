"""Specification of the sequence objectives (`tfrs_logq.sasrec.objectives`) and their losses."""

import numpy as np
import pytest
import tensorflow as tf
from reference import logsumexp, loss_corrected

from tfrs_logq.losses import full_softmax_loss, gbce_loss
from tfrs_logq.sasrec.objectives import OBJECTIVES, make_objective, objective_spec


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("t", [0.0, 0.75, 1.0])
def test_gbce_matches_formula(t):
    rng = np.random.default_rng(0)
    s_p, s_n = rng.normal(size=5) * 3, rng.normal(size=(5, 7)) * 3
    mask = rng.uniform(size=(5, 7)) > 0.2
    alpha = 7 / 99
    beta = alpha * (t * (1 - 1 / alpha) + 1 / alpha)
    ref = -np.log(_sigmoid(s_p) ** beta) - np.sum(np.where(mask, np.log(1 - _sigmoid(s_n)), 0), 1)
    got = gbce_loss(s_p, s_n, sampling_rate=alpha, t=t, is_negative=mask).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    if t == 0.0:
        assert beta == pytest.approx(1.0)  # plain BCE


def test_full_softmax_matches_formula_and_excludes_padding():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 9)) * 4
    targets = np.array([1, 8, 3, 3])
    exclude = np.arange(9) == 0
    got = full_softmax_loss(logits, targets, exclude=exclude).numpy()
    ref = [logsumexp(row[1:]) - row[t] for row, t in zip(logits, targets)]
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def _batch(seed=0, batch=3, length=5, dim=4, num_items=12):
    rng = np.random.default_rng(seed)
    queries = rng.normal(size=(batch, length, dim)).astype(np.float32)
    table = rng.normal(size=(num_items + 1, dim)).astype(np.float32)
    targets = rng.integers(1, 7, size=(batch, length))  # few distinct: all become negatives
    targets[0, :2] = 0  # padding positions
    is_target = targets > 0
    counts = rng.integers(1, 50, size=num_items + 1)
    counts[0] = 0
    return queries, table, targets, is_target, counts


@pytest.mark.parametrize("correction", ["none", "logq-tfrs", "logq-official", "corrected"])
def test_in_batch_objective_matches_the_paper_formulas(correction):
    queries, table, targets, is_target, counts = _batch()
    objective = make_objective(f"inbatch-{correction}", 12, counts, num_negatives=64)
    loss = objective(queries, targets, is_target, table).numpy()
    q = queries.reshape(-1, 4).astype(np.float64)
    t = targets.reshape(-1)
    valid = is_target.reshape(-1)
    negatives = np.unique(t[valid])  # k exceeds the distinct targets: all are used
    s_p = np.einsum("nd,nd->n", q, table[t])
    s_n = q @ table[negatives].T
    mask = negatives[None, :] != t[:, None]
    total_count = counts.sum()
    if correction == "none":
        per = [logsumexp(np.concatenate([[s_p[i]], s_n[i][mask[i]]])) - s_p[i]
               for i in range(len(t))]
    elif correction in ("logq-tfrs", "logq-official"):
        # official: the positive uncorrected; tfrs: its term e^{s_p - log Q(p)}
        lq = np.log(counts[negatives] / total_count)
        lq_p = (np.log(np.maximum(counts[t], 1) / total_count) if correction == "logq-tfrs"
                else np.zeros(len(t)))
        per = [logsumexp(np.concatenate([[s_p[i] - lq_p[i]], (s_n[i] - lq)[mask[i]]]))
               - s_p[i] for i in range(len(t))]
    else:  # Q'(d) = #d / (N - #p)
        lq = np.log(counts[negatives][None, :] / (total_count - counts[t])[:, None])
        per = loss_corrected(s_p, s_n, lq, mask)[0]
    expected = np.sum(np.asarray(per)[valid]) / valid.sum()
    assert loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", OBJECTIVES)
def test_every_objective_is_finite_and_trains_the_table(name):
    queries, table, targets, is_target, counts = _batch(seed=2)
    objective = make_objective(name, 12, counts, num_negatives=8)
    q, tbl = tf.Variable(queries), tf.Variable(table)
    with tf.GradientTape() as tape:
        loss = objective(q, targets, is_target, tbl)
    gq, gt = tape.gradient(loss, [q, tbl])
    assert np.isfinite(loss.numpy())
    gt = tf.convert_to_tensor(gt).numpy()
    assert np.isfinite(gt).all() and np.abs(gt).sum() > 0
    # Padding positions contribute nothing.
    np.testing.assert_array_equal(gq.numpy()[0, :2], 0.0)


def test_a_parsed_name_is_taken_as_its_text_is():
    """The trainer passes its config's parsed `LossName` (checked once, by the config);
    the objective is the one its text names, and a `LossName` of no objective is refused."""
    from tfrs_logq.corrections import LossName, parse_loss_name

    for name in OBJECTIVES:
        assert objective_spec(parse_loss_name(name, None), 64) == objective_spec(name, 64)
    assert objective_spec(LossName("mns", "logq-tfrs")).correction == "logq-tfrs"
    for bad in (LossName("softmax"), LossName("mns"), LossName("sampled", "corrected")):
        with pytest.raises(ValueError, match=r"^`loss` must be one of bce, gbce, "):
            objective_spec(bad)


def test_objective_names_and_errors():
    assert objective_spec("mns-corrected").num_uniform == 128
    assert objective_spec("mns-corrected").num_in_batch == 128
    assert objective_spec("gbce").gbce_t == 0.75
    with pytest.raises(ValueError, match=r"^`loss` must be one of bce, gbce, uniform, "
                                         r"inbatch-none, .*; received 'softmax'\.$"):
        objective_spec("softmax")
    with pytest.raises(ValueError, match="^loss 'mns-logq' is ambiguous: use 'mns-logq-tfrs'"):
        objective_spec("mns-logq")
    with pytest.raises(ValueError, match="item_counts"):
        make_objective("inbatch-corrected", 10, None)


def test_cross_replica_negatives_pool_targets_of_all_replicas(mirrored_strategy):
    strategy = mirrored_strategy
    _, _, _, _, counts = _batch()
    with strategy.scope():
        objective = make_objective("inbatch-corrected", 12, counts, num_negatives=16,
                                   cross_replica_negatives=True)
    data = tf.data.Dataset.from_tensor_slices(np.array([[1, 2], [3, 4]], np.int32)).batch(2)
    dist = strategy.experimental_distribute_dataset(
        data.map(lambda x: tf.reshape(x, [-1])).unbatch().batch(4))

    @tf.function
    def step(targets):
        return strategy.run(lambda t: objective.sample(t).in_batch, args=(targets,))

    per_replica = strategy.experimental_local_results(step(next(iter(dist))))
    for ids in per_replica:  # each replica drew from all four targets
        assert set(ids.numpy().tolist()) - {0} == {1, 2, 3, 4}


def test_replicas_draw_different_negatives_from_one_seed(mirrored_strategy):
    """Each replica folds its id into the sampling key: given the same targets, the
    two replicas' uniform negatives differ (before, both drew the same ids), while
    in-batch negatives from the all-gathered pool are shared; one counter per
    replica, saved as the first replica's."""
    strategy = mirrored_strategy
    _, _, _, _, counts = _batch()
    with strategy.scope():
        objective = make_objective("mns-corrected", 12, counts, num_negatives=64,
                                   cross_replica_negatives=True)
    same = tf.constant([[1, 2, 3, 4]], tf.int32)

    @tf.function
    def step():
        def draw():
            drawn = objective.sample(same)
            return drawn.uniform, drawn.in_batch
        return strategy.run(draw)

    uniform, in_batch = step()
    u = [t.numpy() for t in strategy.experimental_local_results(uniform)]
    b = [t.numpy() for t in strategy.experimental_local_results(in_batch)]
    assert u[0].shape == u[1].shape == (4, 32)
    assert not np.array_equal(u[0], u[1])
    np.testing.assert_array_equal(b[0], b[1])
    # The draw counter advanced once per `sample` on each replica.
    assert [int(v.numpy()) for v in strategy.experimental_local_results(objective._calls)] \
        == [1, 1]
    # The shared in-batch negatives are a single device's draw from the global batch:
    # the same pool, the same key (seed, draw) without a replica fold.
    single = make_objective("mns-corrected", 12, counts, num_negatives=64)
    global_batch = tf.concat([same, same], axis=1)
    np.testing.assert_array_equal(single.sample(global_batch).in_batch.numpy(), b[0])


def test_sampling_is_the_public_draw_keyed_by_seed_and_draw_counter():
    """`sample` is `tfrs_logq.sampling.draw_negative_ids` at (seed, draw counter): the
    uniform part per position, the in-batch part from the targets; a second sample
    draws the next key, and a fresh objective of the same seed draws the same again."""
    from tfrs_logq.sampling import draw_negative_ids

    _, _, targets, is_target, counts = _batch(seed=2)
    objective = make_objective("mns-corrected", 12, counts, num_negatives=16, seed=7)
    pool = tf.constant(np.where(is_target, targets, 0).reshape(-1), tf.int32)
    draws = [objective.sample(targets, is_target) for _ in range(2)]
    for draw, got in enumerate(draws, 1):
        want = draw_negative_ids(pool, 7, draw, num_uniform=8, num_in_batch=8,
                                 num_items=12, num_rows=targets.size, dtype=tf.int32)
        for part in ("uniform", "in_batch", "in_batch_valid"):
            np.testing.assert_array_equal(getattr(got, part).numpy(),
                                          getattr(want, part).numpy())
    assert not np.array_equal(draws[0].uniform.numpy(), draws[1].uniform.numpy())
    again = make_objective("mns-corrected", 12, counts, num_negatives=16, seed=7)
    np.testing.assert_array_equal(again.sample(targets, is_target).uniform.numpy(),
                                  draws[0].uniform.numpy())


SCORINGS = ["native", "native-sparse", "dense", "gather"]


def _set_scoring(objective, scoring, monkeypatch):
    """Scores per-position negatives with the native kernel (dense or, as for large
    catalogs, sparse table gradient), one catalog matmul, or a gather."""
    from tfrs_logq.sasrec import native, objectives
    if scoring.startswith("native") and not native.available():
        pytest.skip("the native kernel cannot be built here (no compiler, or turned off)")
    objective.native_kernels = scoring.startswith("native")
    if scoring == "native-sparse":
        monkeypatch.setattr(objectives, "NATIVE_DENSE_TABLE_ROWS", 0)
    objective._dense_uniform = scoring == "dense"


@pytest.mark.parametrize("correction", ["none", "logq-tfrs", "logq-official", "corrected"])
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("scoring", SCORINGS)
def test_mns_objective_with_given_negatives_matches_the_paper_formulas(correction, compact,
                                                                         scoring, monkeypatch):
    """Per-position uniform negatives + shared in-batch negatives (the official code's
    MNS), every negative corrected with the unigram log Q (Q' for corrected)."""
    from tfrs_logq.sasrec.objectives import SampledIds

    queries, table, targets, is_target, counts = _batch(seed=3)
    objective = make_objective(f"mns-{correction}", 12, counts, num_negatives=8,
                               compact_positions=compact)
    assert objective._dense_uniform  # 13 ids <= 32 x 4 uniform negatives
    _set_scoring(objective, scoring, monkeypatch)  # every way of scoring them
    n = targets.size
    rng = np.random.default_rng(4)
    uniform = rng.integers(1, 13, size=(n, 4)).astype(np.int32)
    in_batch = np.array([5, 2, 0, 0], np.int32)
    valid = np.array([True, True, False, False])
    loss = objective.loss(queries, targets, is_target, table,
                          SampledIds(tf.constant(uniform), tf.constant(in_batch),
                                     tf.constant(valid))).numpy()
    q = queries.reshape(-1, 4).astype(np.float64)
    t = targets.reshape(-1)
    total = counts.sum()
    per = []
    for i in np.flatnonzero(is_target.reshape(-1)):
        ids = np.concatenate([uniform[i], in_batch[valid]])
        ids = ids[ids != t[i]]  # accidental hits masked
        s_p, s_n = q[i] @ table[t[i]], table[ids] @ q[i]
        if correction == "none":
            per.append(logsumexp(np.concatenate([[s_p], s_n])) - s_p)
        elif correction in ("logq-tfrs", "logq-official"):
            lq_p = np.log(counts[t[i]] / total) if correction == "logq-tfrs" else 0.0
            per.append(logsumexp(np.concatenate([[s_p - lq_p],
                                                 s_n - np.log(counts[ids] / total)])) - s_p)
        else:
            log_q = np.log(counts[ids] / (total - counts[t[i]]))
            per.append(loss_corrected(np.array([s_p]), s_n[None], log_q[None],
                                      np.ones((1, len(ids)), bool))[0][0])
    assert loss == pytest.approx(np.mean(per), rel=1e-5)


def test_sampling_draws_per_position_uniform_and_in_batch_from_targets_only():
    _, _, targets, is_target, counts = _batch(seed=5)
    is_target = is_target.copy()
    is_target[1, 0] = False  # a target whose input is padding: not in the pool
    objective = make_objective("mns-corrected", 12, counts, num_negatives=64)
    drawn = objective.sample(targets, is_target)
    assert drawn.uniform.shape == (targets.size, 32)
    u = drawn.uniform.numpy()
    assert u.min() >= 1 and u.max() <= 12
    assert len({tuple(r) for r in u}) == targets.size  # drawn per position
    pool = set(targets[is_target].tolist())
    got = drawn.in_batch.numpy()[drawn.in_batch_valid.numpy()]
    assert set(got.tolist()) == pool and len(got) == len(pool)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("scatter", ["bincount", "large", "deterministic"])
def test_dense_sampled_logits_and_their_gradients_equal_the_gather_of_the_matmul(
        jit, scatter, monkeypatch):
    """`_sampled_logits_dense` (its own gradient: a per-row bincount, or a segment sum
    for large matrices and under op determinism, and two matmuls) against
    TensorFlow's gradient of ``gather(q @ table.T, ids, batch_dims=1)``, with
    repeated ids in a row (their gradients add up) and ids never drawn."""
    from tfrs_logq.sasrec import objectives
    from tfrs_logq.sasrec.objectives import _sampled_logits_dense

    if scatter == "large":
        monkeypatch.setattr(objectives, "BINCOUNT_MAX_CELLS", 0)
    if scatter == "deterministic":
        monkeypatch.setattr(objectives, "_op_determinism_enabled", lambda: True)

    rng = np.random.default_rng(7)
    q = tf.constant(rng.normal(size=(9, 6)), tf.float32)
    table = tf.constant(rng.normal(size=(11, 6)), tf.float32)
    ids = rng.integers(0, 8, size=(9, 14)).astype(np.int32)  # ids 8..10 never drawn
    ids[0, :5] = 3  # one id five times in a row
    ids = tf.constant(ids)
    upstream = tf.constant(rng.normal(size=(9, 14)), tf.float32)

    def value_and_grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, table])
            logits = fn(q, table, ids)
            loss = tf.reduce_sum(logits * upstream)
        return [logits, *tape.gradient(loss, [q, table])]

    got = tf.function(lambda: value_and_grads(_sampled_logits_dense), jit_compile=jit)()
    want = value_and_grads(
        lambda a, b, i: tf.gather(tf.matmul(a, b, transpose_b=True), i, batch_dims=1))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[2].numpy()[8:], 0.0)  # never drawn: no gradient
    q64, t64 = q.numpy().astype(np.float64), table.numpy().astype(np.float64)
    np.testing.assert_allclose(got[0].numpy(),
                               np.einsum("nd,nkd->nk", q64, t64[ids.numpy()]), rtol=1e-5)


@pytest.mark.parametrize("name", ["mns-none", "mns-corrected", "uniform", "gbce", "bce"])
@pytest.mark.parametrize("compact", [True, False])
def test_every_uniform_scoring_gives_the_same_loss_and_gradients(name, compact, monkeypatch):
    """The native kernel (dense and sparse table gradients), the one-matmul scoring
    (small catalogs) and the [positions, k, dim] gather (large ones) are the same
    function of the queries and the table."""
    queries, table, targets, is_target, counts = _batch(seed=6)
    from tfrs_logq.sasrec import native

    results = []
    for scoring in SCORINGS if native.available() else ["dense", "gather"]:
        objective = make_objective(name, 12, counts, num_negatives=8, seed=3,
                                   compact_positions=compact)
        with monkeypatch.context() as patch:
            _set_scoring(objective, scoring, patch)
            negatives = objective.sample(targets, is_target)  # same seed: same draws
            q, tbl = tf.Variable(queries), tf.Variable(table)
            with tf.GradientTape() as tape:
                loss = objective.loss(q, targets, is_target, tbl, negatives)
            results.append([loss, *tape.gradient(loss, [q, tbl])])
        assert objective._native == scoring.startswith("native")
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                                       tf.convert_to_tensor(b).numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(tf.convert_to_tensor(results[0][2]).numpy()).sum() > 0
