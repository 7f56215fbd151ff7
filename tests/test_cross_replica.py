"""`CorrectedRetrieval(cross_replica_negatives=True)` under `tf.distribute.MirroredStrategy`
on 2 and 4 logical CPUs: each replica's loss is its rows of the one-device loss on the
concatenated global batch, and the replicas' summed gradients are that batch's, for every
correction, against the paper's formulas in numpy (tests/reference.py): replicas of
different batch sizes, extra negatives on some, ids (integers and strings) shared across
replicas so that accidental hits and deduplication cross them. A score mask, which can
only speak of one replica's candidates, is refused. Without the option each replica keeps
its own negatives, as in stock TFRS.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
from deterministic_process import run_deterministic
from reference import loss_corrected, loss_logq, loss_none

from tfrs_logq import CorrectedRetrieval

CORRECTIONS = ("none", "logq-tfrs", "logq-official", "corrected")
DIM = 4


def _world(queries_per_replica, extras_per_replica, *, seed=0, num_ids=7):
    """Tables and each replica's rows. Candidate rows are in the one-device order (every
    replica's positives, then every replica's extras); query ``i`` of the global batch has
    candidate row ``i`` as its positive."""
    rng = np.random.default_rng(seed)
    num_queries, num_extras = sum(queries_per_replica), sum(extras_per_replica)
    world = {
        "queries": rng.normal(size=(num_queries, DIM)),
        "candidates": rng.normal(size=(num_queries + num_extras, DIM)),
        "ids": rng.integers(0, num_ids, num_queries + num_extras),
        "prob": rng.uniform(0.02, 0.3, num_queries + num_extras),
        "weight": rng.uniform(0.5, 2.0, num_queries),
        "replicas": [],
    }
    query_start, extra_start = 0, num_queries
    for b, e in zip(queries_per_replica, extras_per_replica):
        rows = np.arange(query_start, query_start + b)
        extra_rows = np.arange(extra_start, extra_start + e)
        mask = rng.uniform(size=(b, b + e)) > 0.25
        world["replicas"].append({"queries": rows,
                                  "candidates": np.concatenate([rows, extra_rows]),
                                  "score_mask": mask})
        query_start, extra_start = query_start + b, extra_start + e
    return world


def _one_device_mask(world, correction, *, hits, dedup, score_mask):
    """`[B, N]` which candidates are row ``i``'s negatives on one device."""
    ids = world["ids"]
    b, n = len(world["queries"]), len(world["candidates"])
    mask = np.ones((b, n), bool)
    mask[np.arange(b), np.arange(b)] = False
    if hits or correction == "corrected":
        mask &= ids[None, :] != ids[:b, None]
    if dedup:
        first = np.array([list(ids).index(x) == j for j, x in enumerate(ids)])
        mask &= first[None, :]
    if score_mask:
        for replica in world["replicas"]:
            rows, columns = replica["queries"], replica["candidates"]
            mask[np.ix_(rows, columns)] &= replica["score_mask"]
    return mask


def _reference(world, correction, *, hits=False, dedup=False, score_mask=False):
    """Per-row loss and the gradients of the weighted sum with respect to the two tables,
    from the paper's formulas (float64)."""
    queries, candidates = world["queries"], world["candidates"]
    scores = queries @ candidates.T
    b = len(queries)
    s_p = scores[np.arange(b), np.arange(b)]
    log_q = np.log(world["prob"])
    mask = _one_device_mask(world, correction, hits=hits, dedup=dedup, score_mask=score_mask)
    if correction == "none":
        loss, g_p, g_n = loss_none(s_p, scores, mask)
    elif correction == "logq-tfrs":  # TFRS's: the positive's logit corrected too
        loss, g_p, g_n = loss_logq(s_p, scores, np.broadcast_to(log_q, scores.shape), mask,
                                   log_q_p=log_q[:b])
        loss = loss + log_q[:b]  # TFRS's cross-entropy keeps log Q(p) in the numerator
    elif correction == "logq-official":
        loss, g_p, g_n = loss_logq(s_p, scores, np.broadcast_to(log_q, scores.shape), mask)
    else:
        log_q_prime = log_q[None, :] - np.log1p(-world["prob"][:b])[:, None]
        loss, g_p, g_n, _ = loss_corrected(s_p, scores,
                                           np.broadcast_to(log_q_prime, scores.shape), mask)
    weight = world["weight"]
    grad_scores = g_n * weight[:, None]
    grad_scores[np.arange(b), np.arange(b)] += g_p * weight
    return loss * weight, grad_scores @ candidates, grad_scores.T @ queries


def _distributed(strategy, world, correction, *, cross_replica=True, hits=False,
                 dedup=False, score_mask=False, string_ids=False, dtype=np.float32,
                 **task_options):
    """Each replica's summed loss, and the replicas' summed gradients of the tables."""
    replicas = world["replicas"]
    ids = world["ids"]
    ids = np.array([f"item {i}" for i in ids]) if string_ids else ids

    def per_replica(key_fn):
        return strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(key_fn(replicas[context.replica_id_in_sync_group])))

    query_rows = per_replica(lambda r: r["queries"])
    candidate_rows = per_replica(lambda r: r["candidates"])
    masks = per_replica(lambda r: r["score_mask"])
    with strategy.scope():
        query_table = tf.Variable(world["queries"].astype(dtype))
        candidate_table = tf.Variable(world["candidates"].astype(dtype))
    task = CorrectedRetrieval(correction=correction, remove_accidental_hits=hits,
                              deduplicate_candidates=dedup,
                              cross_replica_negatives=cross_replica, **task_options)
    ids_t, prob_t = tf.constant(ids), tf.constant(world["prob"].astype(np.float32))
    weight_t = tf.constant(world["weight"].astype(np.float32))

    def step(rows, columns, mask):
        with tf.GradientTape() as tape:
            kwargs = dict(candidate_ids=tf.gather(ids_t, columns),
                          sample_weight=tf.gather(weight_t, rows))
            if correction != "none":
                kwargs["candidate_sampling_probability"] = tf.gather(prob_t, columns)
            if score_mask:
                kwargs["score_mask"] = mask
            loss = task(tf.gather(query_table, rows), tf.gather(candidate_table, columns),
                        **kwargs)
        grads = tape.gradient(loss, [query_table, candidate_table])
        return loss, [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]

    @tf.function
    def run():
        loss, grads = strategy.run(step, args=(query_rows, candidate_rows, masks))
        return (strategy.experimental_local_results(loss),
                [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads])

    losses, grads = run()
    return np.array([float(v) for v in losses]), [g.numpy() for g in grads]


CASES = [
    dict(),
    dict(hits=True),
    dict(dedup=True, hits=True),
    dict(string_ids=True),
    dict(dedup=True, string_ids=True, hits=True),
]


def check_against_one_device(strategy, queries_per_replica, extras_per_replica,
                             cases=CASES):
    """Every correction and case on ``strategy``'s replicas: per-replica losses and summed
    gradients against the reference. ``strategy`` None: a MirroredStrategy over this
    process's logical CPUs (one strategy per process: two share collective keys)."""
    if strategy is None:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        strategy = tf.distribute.MirroredStrategy(devices)
    assert strategy.num_replicas_in_sync == len(queries_per_replica)
    world = _world(queries_per_replica, extras_per_replica)
    for correction in CORRECTIONS:
        for case in cases:
            options = {k: v for k, v in case.items() if k != "string_ids"}
            loss, grad_q, grad_c = _reference(world, correction, **options)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # 'none' given no Q: no warning
                got, (got_q, got_c) = _distributed(strategy, world, correction, **case)
            expected = [loss[r["queries"]].sum() for r in world["replicas"]]
            message = f"{correction} {case}"
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5, err_msg=message)
            np.testing.assert_allclose(got_q, grad_q, rtol=2e-4, atol=2e-5, err_msg=message)
            np.testing.assert_allclose(got_c, grad_c, rtol=2e-4, atol=2e-5, err_msg=message)


def test_two_replicas_equal_one_device_on_the_global_batch(mirrored_strategy):
    check_against_one_device(mirrored_strategy, (5, 3), (2, 0))


def test_four_replicas_equal_one_device_on_the_global_batch():
    """Four replicas of different sizes, in a process of four logical CPUs: the plain case
    and the one with every option (string ids, deduplication, hits, a score mask)."""
    run_deterministic(check_against_one_device, None, (3, 5, 4, 2), (2, 0, 1, 3),
                      [CASES[0], CASES[-1]], logical_cpus=4)


def test_the_reference_sees_other_replicas_negatives():
    """The check above can fail: the global pool differs from each replica's own."""
    world = _world((5, 3), (2, 0))
    global_loss = _reference(world, "corrected")[0]
    local = _world((5,), (2,))  # replica 0 alone: its rows, its candidates
    local["queries"], local["candidates"] = world["queries"][:5], world["candidates"][[
        0, 1, 2, 3, 4, 8, 9]]
    local["ids"], local["prob"] = world["ids"][[0, 1, 2, 3, 4, 8, 9]], \
        world["prob"][[0, 1, 2, 3, 4, 8, 9]]
    local["weight"] = world["weight"][:5]
    assert not np.allclose(global_loss[:5], _reference(local, "corrected")[0])


@pytest.mark.parametrize("correction", ["none", "logq-tfrs"])
def test_without_the_option_each_replica_keeps_its_negatives_as_stock_tfrs(
        mirrored_strategy, correction):
    world = _world((5, 3), (2, 0), seed=1)
    got, _ = _distributed(mirrored_strategy, world, correction, cross_replica=False)
    for replica, value in zip(world["replicas"], got):
        rows, columns = replica["queries"], replica["candidates"]
        kwargs = dict(sample_weight=world["weight"][rows].astype(np.float32))
        if correction == "logq-tfrs":
            kwargs["candidate_sampling_probability"] = world["prob"][columns].astype(np.float32)
        stock = tfrs.tasks.Retrieval()(world["queries"][rows].astype(np.float32),
                                       world["candidates"][columns].astype(np.float32), **kwargs)
        np.testing.assert_allclose(value, float(stock), rtol=1e-5)


def test_one_replica_warns_once_and_changes_nothing():
    task = CorrectedRetrieval(cross_replica_negatives=True)
    plain = CorrectedRetrieval()
    world = _world((6,), (2,))
    args = (world["queries"].astype(np.float32), world["candidates"].astype(np.float32))
    kwargs = dict(candidate_ids=world["ids"],
                  candidate_sampling_probability=world["prob"].astype(np.float32))
    with pytest.warns(UserWarning, match="one replica"):
        value = task(*args, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task(*args, **kwargs)  # once
    assert float(value) == float(plain(*args, **kwargs))


def test_option_is_in_the_config_and_refuses_non_bools():
    task = CorrectedRetrieval(cross_replica_negatives=True)
    assert CorrectedRetrieval(**{k: v for k, v in task.get_config().items()
                                 if k not in ("name", "loss")})._cross_replica_negatives
    with pytest.raises(ValueError, match="cross_replica_negatives"):
        CorrectedRetrieval(cross_replica_negatives="yes")


def test_model_fit_under_mirrored_strategy_with_global_negatives(mirrored_strategy):
    """A TFRS tutorial-style model through `model.fit` and `evaluate` on two replicas: the
    option trains (its loss differs: more negatives) and leaves the factorized metric's
    computation alone (same towers give the same metric)."""
    strategy = mirrored_strategy
    rng = np.random.default_rng(0)
    users = rng.integers(0, 20, 512)
    items = (users * 3 + rng.integers(0, 2, 512)) % 40
    freq = np.bincount(items, minlength=40) / len(items)
    data = tf.data.Dataset.from_tensor_slices(
        {"user": users, "item": items, "q": freq[items].astype(np.float32)}).batch(64)

    class TwoTower(tfrs.Model):
        def __init__(self, cross):
            super().__init__()
            self.user = tf.keras.layers.Embedding(20, 8)
            self.item = tf.keras.layers.Embedding(40, 8)
            index = tf.data.Dataset.range(40).batch(16).map(self.item)
            self.task = CorrectedRetrieval(
                metrics=tfrs.metrics.FactorizedTopK(candidates=index, ks=(1, 5)),
                cross_replica_negatives=cross)

        def compute_loss(self, features, training=False):
            return self.task(
                self.user(features["user"]), self.item(features["item"]),
                candidate_ids=features["item"], candidate_sampling_probability=features["q"],
                compute_metrics=not training)

    results = {}
    for cross in (False, True):
        with strategy.scope():
            tf.keras.utils.set_random_seed(0)
            model = TwoTower(cross)
            model.compile(optimizer=tf.keras.optimizers.Adam(0.05))
        untrained = model.evaluate(data, return_dict=True, verbose=0)
        history = model.fit(data, epochs=3, verbose=0)
        results[cross] = untrained, history.history["loss"]
    (untrained_local, _), (untrained_global, global_) = results[False], results[True]
    assert np.isfinite(global_).all() and global_[-1] < global_[0]
    # The same initial towers: the same factorized metric, whatever the negatives.
    for key in ("factorized_top_k/top_1_categorical_accuracy",
                "factorized_top_k/top_5_categorical_accuracy"):
        assert untrained_global[key] == untrained_local[key], key
    # More negatives per query: a larger loss before any step.
    assert untrained_global["loss"] > untrained_local["loss"]


def _one_device(world, correction, **task_options):
    """The task itself (no strategy) on the concatenated global batch: per-row losses."""
    task = CorrectedRetrieval(correction=correction, reduction="none", **task_options)
    kwargs = dict(candidate_ids=world["ids"], sample_weight=world["weight"].astype(np.float32))
    if correction != "none":
        kwargs["candidate_sampling_probability"] = world["prob"].astype(np.float32)
    return task(world["queries"].astype(np.float32), world["candidates"].astype(np.float32),
                **kwargs).numpy()


@pytest.mark.parametrize("correction, options", [
    ("corrected", dict(num_hard_negatives=3)),
    ("logq-tfrs", dict(num_hard_negatives=3, remove_accidental_hits=True)),
    ("corrected", dict(deduplicate_candidates=True,
                       sampling_probability="per_draw_to_inclusion")),
    ("logq-official", dict(temperature=0.5, reduction="sum_over_batch_size")),
])
def test_the_tasks_other_options_equal_one_device(mirrored_strategy, correction, options):
    """Hard negatives, the inclusion proposal of the global batch's draws, a temperature
    and the global batch's mean: each replica's loss is its rows of the one-device loss."""
    world = _world((5, 3), (2, 0), seed=3)
    options = dict(options)
    hits = options.pop("remove_accidental_hits", False)
    dedup = options.pop("deduplicate_candidates", False)
    reduction = options.pop("reduction", "sum")
    got, _ = _distributed(mirrored_strategy, world, correction, hits=hits, dedup=dedup,
                          reduction=reduction, **options)
    rows = _one_device(world, correction, remove_accidental_hits=hits,
                       deduplicate_candidates=dedup, **options)
    scale = len(world["queries"]) if reduction == "sum_over_batch_size" else 1
    expected = [rows[r["queries"]].sum() / scale for r in world["replicas"]]
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


def test_half_precision_embeddings_follow_the_float32_reference(mirrored_strategy):
    """bfloat16 towers (mixed precision): the gather and the scores in bfloat16, the loss
    in float32, within bfloat16's rounding of the reference."""
    world = _world((5, 3), (2, 0), seed=4)
    loss, grad_q, grad_c = _reference(world, "corrected")
    got, (got_q, got_c) = _distributed(mirrored_strategy, world, "corrected",
                                       dtype=tf.bfloat16.as_numpy_dtype)
    expected = [loss[r["queries"]].sum() for r in world["replicas"]]
    np.testing.assert_allclose(got, expected, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(got_c, grad_c, rtol=5e-2, atol=5e-2)


def test_a_score_mask_is_refused_with_global_negatives(mirrored_strategy):
    """A mask of one replica's candidates cannot say which of the others' to drop (the
    sampled-negatives pattern masks the other rows' positives: kept, they would be silent
    extra negatives)."""
    world = _world((5, 3), (2, 0))
    with pytest.raises(ValueError, match="`score_mask` with cross_replica_negatives=True"):
        _distributed(mirrored_strategy, world, "corrected", score_mask=True)
    # Without the option the mask applies to the replica's own candidates, as on one device.
    got, _ = _distributed(mirrored_strategy, world, "corrected", score_mask=True,
                          cross_replica=False)
    assert np.isfinite(got).all()


def test_float_ids_are_compared_by_value_across_replicas(mirrored_strategy):
    world = _world((5, 3), (2, 0), seed=5)
    loss = _reference(world, "corrected")[0]
    world["ids"] = world["ids"].astype(np.float32) / 4  # the same equalities
    got, _ = _distributed(mirrored_strategy, world, "corrected")
    np.testing.assert_allclose(got, [loss[r["queries"]].sum() for r in world["replicas"]],
                               rtol=2e-5, atol=2e-5)
