"""Specification of the item-frequency estimators in `tfrs_logq.frequency`."""

import math
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from reference import COUNT_MIN_PRIME as P
from reference import count_min_cells

from tfrs_logq.frequency import CountMinSketch, ExactFrequency, StreamingFrequency


def _zipf_stream(num_items, size, seed=0, s=1.1):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_items + 1) ** s
    p /= p.sum()
    return rng.choice(num_items, size=size, p=p), p


def test_exact_from_dataset_matches_numpy_counts():
    ids, _ = _zipf_stream(50, 2000)
    ds = tf.data.Dataset.from_tensor_slices(ids.reshape(-1, 10))
    est = ExactFrequency.from_dataset(ds, num_items=60)
    counts = np.bincount(ids, minlength=60)
    np.testing.assert_allclose(est.counts.numpy(), counts)
    query = np.array([0, 1, 7, 49, 55])
    expected = np.log(np.maximum(counts[query], 1.0) / counts.sum())
    np.testing.assert_allclose(est.log_q(query).numpy(), expected, rtol=1e-6)


def test_exact_update_in_graph_and_checkpoint(tmp_path):
    est = ExactFrequency(10)
    tf.function(est.update)(tf.constant([1, 1, 2, 9]))
    np.testing.assert_allclose(est.counts.numpy()[[1, 2, 9]], [2, 1, 1])
    path = tf.train.Checkpoint(est=est).save(str(tmp_path / "ckpt"))
    restored = ExactFrequency(10)
    tf.train.Checkpoint(est=restored).restore(path).assert_consumed()
    np.testing.assert_allclose(restored.log_q([1, 2]).numpy(), est.log_q([1, 2]).numpy())


def test_exact_rejects_bad_input():
    with pytest.raises(ValueError, match="num_items"):
        ExactFrequency(0)
    with pytest.raises(ValueError, match="counts"):
        ExactFrequency.from_counts([1, -2])
    with pytest.raises(ValueError, match="ids.*integer"):
        ExactFrequency(3).log_q([0.5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids must lie"):
        ExactFrequency(3).update([5])


def test_count_min_never_undercounts_and_respects_error_bound():
    ids, _ = _zipf_stream(20000, 200_000, seed=1)
    sketch = CountMinSketch(depth=4, width=2048, seed=3)
    update = tf.function(sketch.update)
    for chunk in np.array_split(ids, 20):
        update(tf.constant(chunk))
    true = np.bincount(ids, minlength=20000)
    est = sketch.count(np.arange(20000)).numpy()
    assert (est >= true).all()
    bound = sketch.error_bound()
    assert bound == pytest.approx(math.e / 2048 * len(ids))
    # P(est > true + eps N) <= delta = e^-4 ~ 1.8% per item; allow 2x slack.
    assert np.mean(est > true + bound) <= 2 * sketch.delta
    # Frequent items are estimated accurately in log space.
    top = np.argsort(-true)[:20]
    np.testing.assert_allclose(
        sketch.log_q(top).numpy(), np.log(true[top] / len(ids)), atol=0.05
    )


@pytest.mark.parametrize("depth,width,seed", [(1, 7, 0), (3, 50, 5), (4, 64, 7)])
def test_count_min_counters_are_the_documented_hashes_and_numpy_computes_the_same(
        depth, width, seed):
    """The in-graph sketch and the batch pipeline's numpy hashes
    (`tfrs_logq._util.universal_hash`) both match the formula, ids beyond p included."""
    from tfrs_logq._util.universal_hash import flat_cells, hash_coefficients

    ids = np.array([0, 1, 2, 41, 7, 7, P - 1, P, P + 3, 2**40 + 11, -5], np.int64)
    expected = np.zeros(depth * width)
    np.add.at(expected, count_min_cells(ids, depth, width, seed).reshape(-1), 1.0)
    sketch = CountMinSketch(depth=depth, width=width, seed=seed)
    tf.function(sketch.update)(tf.constant(ids))
    np.testing.assert_array_equal(sketch.counters.numpy(), expected)
    a, b = hash_coefficients(depth, seed)
    np.testing.assert_array_equal(flat_cells(ids, a, b, width),
                                  count_min_cells(ids, depth, width, seed))
    # count: the minimum over the rows of each id's counters.
    np.testing.assert_array_equal(
        sketch.count(ids).numpy(), expected[count_min_cells(ids, depth, width, seed)].min(0))


def test_the_shared_hashes_load_without_tensorflow():
    code = ("import sys, tfrs_logq._util.universal_hash, tfrs_logq.pipelines.item_statistics; "
            "print('tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_count_min_from_error_bound_and_merge():
    a = CountMinSketch.from_error_bound(epsilon=0.01, delta=0.01, seed=7)
    assert a.width == math.ceil(math.e / 0.01) and a.depth == math.ceil(math.log(100))
    b = CountMinSketch.from_error_bound(epsilon=0.01, delta=0.01, seed=7)
    whole = CountMinSketch.from_error_bound(epsilon=0.01, delta=0.01, seed=7)
    ids, _ = _zipf_stream(1000, 5000, seed=2)
    a.update(ids[:2500])
    b.update(ids[2500:])
    whole.update(ids)
    a.merge(b)
    np.testing.assert_allclose(a.counters.numpy(), whole.counters.numpy())
    assert float(a.total.numpy()) == 5000
    with pytest.raises(ValueError, match="merge"):
        a.merge(CountMinSketch(depth=2, width=10))


def test_streaming_converges_on_stationary_stream():
    num_items, batch = 200, 256
    ids, p = _zipf_stream(num_items, 1500 * batch, seed=4, s=1.0)
    est = StreamingFrequency(num_buckets=4096, num_hashes=2, alpha=0.01, seed=1)
    update = tf.function(est.update)
    for step in range(1500):
        update(tf.constant(ids[step * batch:(step + 1) * batch]))
    top = np.arange(30)  # items seen at least every ~2 steps
    log_q = est.log_q(top).numpy()
    # Within 25% of the true probability on popular items.
    np.testing.assert_allclose(np.exp(log_q), p[top], rtol=0.25)
    # And the ranking of popularity is preserved.
    assert np.corrcoef(log_q, np.log(p[top]))[0, 1] > 0.95


def test_streaming_is_unbiased_on_the_tail_of_a_zipf_catalog():
    """Rare items: median estimated / true Q near 1 at popularity ranks 300-3k and 3k-20k
    (a gap average started at 0 gave 5x and 38x)."""
    num_items, batch, steps = 20_000, 512, 2000
    ids, p = _zipf_stream(num_items, steps * batch, seed=7, s=1.0)
    est = StreamingFrequency(num_buckets=1 << 17, num_hashes=2, alpha=0.01, seed=3)
    update = tf.function(est.update)
    for step in range(steps):
        update(tf.constant(ids[step * batch:(step + 1) * batch]))
    counts = np.bincount(ids, minlength=num_items)
    for low, high in [(300, 3000), (3000, 20_000)]:
        ranks = np.arange(low, high)
        ranks = ranks[counts[ranks] >= 3]  # items seen at least three times
        ratio = np.exp(est.log_q(ranks).numpy()) / p[ranks]
        assert 0.7 < np.median(ratio) < 1.4, (low, high, np.median(ratio))


def test_streaming_tracks_a_popularity_shift():
    batch = 128
    rng = np.random.default_rng(5)
    est = StreamingFrequency(num_buckets=1024, num_hashes=2, alpha=0.02, seed=2)
    update = tf.function(est.update)
    # Phase 1: item 1 has probability 0.2, item 2 has 0.01; phase 2: swapped.
    for phase, (p1, p2) in enumerate([(0.2, 0.01), (0.01, 0.2)]):
        for _ in range(400):
            u = rng.uniform(size=batch)
            ids = np.where(u < p1, 1, np.where(u < p1 + p2, 2, rng.integers(10, 500, batch)))
            update(tf.constant(ids))
        q = np.exp(est.log_q([1, 2]).numpy())
        np.testing.assert_allclose(q, [p1, p2], rtol=0.3, err_msg=f"phase {phase}")


def test_streaming_duplicates_in_a_step_are_evenly_spaced_hits():
    est = StreamingFrequency(num_buckets=64, num_hashes=1, alpha=0.5)
    est.update([3])  # t=1: first sighting, gap = 1 (the wait from the start)
    est.update([3, 3, 3])  # t=2: 3 hits with gap 1/3 each
    gap = est.estimated_gap([3]).numpy()[0]
    g = 1.0
    for _ in range(3):  # learning rate max(alpha, 1 / n) = 0.5 for n = 2, 3, 4
        g = 0.5 * g + 0.5 * (1.0 / 3.0)
    assert gap == pytest.approx(g)
    # An id never seen is taken as seen at most once in all steps so far.
    assert est.estimated_gap([5]).numpy()[0] == pytest.approx(2.0)


def test_estimators_under_mirrored_strategy_see_the_global_stream(mirrored_strategy):
    strategy = mirrored_strategy
    with strategy.scope():
        sketch = CountMinSketch(depth=3, width=256)
        exact = ExactFrequency(100)
    ids = np.arange(40, dtype=np.int64) % 20
    dist = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(ids).batch(40)
    )

    @tf.function
    def step(batch):
        def fn(x):
            sketch.update(x)
            exact.update(x)
            return exact.log_q(x)

        return strategy.run(fn, args=(batch,))

    step(next(iter(dist)))
    np.testing.assert_allclose(exact.counts.numpy()[:20], np.full(20, 2.0))
    assert float(exact.total.numpy()) == 40
    assert float(sketch.total.numpy()) == 40
    assert (sketch.count(np.arange(20)).numpy() >= 2).all()


def test_exact_keyed_by_strings_from_a_dataset_and_from_counts(tmp_path):
    ids, _ = _zipf_stream(30, 600, seed=3)
    titles = np.array([f"title {i}" for i in ids])
    est = ExactFrequency.from_dataset(tf.data.Dataset.from_tensor_slices(titles).batch(7))
    vocabulary, counts = np.unique(titles, return_counts=True)
    np.testing.assert_array_equal(est.vocabulary.astype(str), vocabulary)
    query = np.array([vocabulary[0], vocabulary[-1], "never seen"])
    expected = np.log(np.array([counts[0], counts[-1], 1.0]) / counts.sum())
    np.testing.assert_allclose(est.log_q(query).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(est.probability(query).numpy(), np.exp(expected), rtol=1e-6)
    # From counts with the ids, updated in a graph, checkpointed.
    built = ExactFrequency.from_counts(counts, ids=vocabulary)
    tf.function(built.update)(tf.constant([vocabulary[1], vocabulary[1]]))
    assert built.count([vocabulary[1]]).numpy()[0] == counts[1] + 2
    path = tf.train.Checkpoint(est=built).save(str(tmp_path / "ckpt"))
    restored = ExactFrequency(vocabulary=vocabulary)
    tf.train.Checkpoint(est=restored).restore(path).assert_consumed()
    np.testing.assert_allclose(restored.log_q(query).numpy(), built.log_q(query).numpy())
    # Integer ids without num_items: the ids seen are the vocabulary, not positions.
    sparse = ExactFrequency.from_dataset(tf.data.Dataset.from_tensor_slices(
        tf.constant([10**12, 7, 10**12], tf.int64)))
    np.testing.assert_allclose(sparse.probability([10**12, 7]).numpy(), [2 / 3, 1 / 3],
                               rtol=1e-6)


def test_exact_vocabulary_refusals():
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids must be in the vocabulary"):
        ExactFrequency(vocabulary=["a", "b"]).update(tf.constant(["c"]))
    with pytest.raises(ValueError, match="each id once"):
        ExactFrequency(vocabulary=["a", "a"])
    with pytest.raises(ValueError, match="are int64 but the vocabulary holds string"):
        ExactFrequency(vocabulary=["a", "b"]).log_q(tf.constant([1], tf.int64))
    with pytest.raises(ValueError, match="one count per id"):
        ExactFrequency.from_counts([1, 2], ids=["a"])
    with pytest.raises(ValueError, match="map it to the id column"):
        ExactFrequency.from_dataset(tf.data.Dataset.from_tensor_slices({"t": ["a"]}))


@pytest.mark.parametrize("make", [lambda: CountMinSketch(depth=3, width=512),
                                  lambda: StreamingFrequency(num_buckets=512)])
def test_hashed_estimators_take_strings_as_their_fingerprints(make):
    """A string id is its 64-bit fingerprint: the estimator fed the strings equals the one
    fed `tf.strings.to_hash_bucket_fast(ids, 2**63 - 1)`, in a graph too."""
    ids, _ = _zipf_stream(40, 400, seed=5)
    titles = tf.constant([f"t{i}" for i in ids])
    keys = tf.strings.to_hash_bucket_fast(titles, (1 << 63) - 1)
    by_string, by_key = make(), make()
    for start in range(0, 400, 50):
        tf.function(by_string.update)(titles[start:start + 50])
        by_key.update(keys[start:start + 50])
    np.testing.assert_allclose(by_string.log_q(titles[:20]).numpy(),
                               by_key.log_q(keys[:20]).numpy())
    if isinstance(by_string, CountMinSketch):
        counts = np.bincount(ids)
        assert (by_string.count(titles).numpy() >= counts[ids]).all()  # never undercounts
        from_dataset = CountMinSketch.from_dataset(
            tf.data.Dataset.from_tensor_slices(titles).batch(64), depth=3, width=512)
        np.testing.assert_allclose(from_dataset.counters.numpy(), by_string.counters.numpy())


def test_counts_restored_into_another_vocabulary_are_refused(tmp_path):
    saved = ExactFrequency.from_counts([10, 1], ids=["Heat", "Up"])
    path = tf.train.Checkpoint(est=saved).save(str(tmp_path / "ckpt"))
    other = ExactFrequency(vocabulary=["Alien", "Heat"])
    tf.train.Checkpoint(est=other).restore(path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="another vocabulary"):
        other.log_q(["Heat"])
    same = ExactFrequency(vocabulary=["Heat", "Up"])
    tf.train.Checkpoint(est=same).restore(path).assert_consumed()
    np.testing.assert_allclose(same.probability(["Heat"]).numpy(), [10 / 11], rtol=1e-6)


def test_one_id_per_element_is_read_in_batches():
    """`from_dataset(ratings.map(lambda x: x["title"]))`, unbatched: equal counts."""
    titles = np.array([f"t{i % 7}" for i in range(3000)])
    unbatched = ExactFrequency.from_dataset(tf.data.Dataset.from_tensor_slices(titles))
    np.testing.assert_allclose(np.sort(unbatched.counts.numpy()),
                               np.sort(np.unique(titles, return_counts=True)[1]))


@pytest.mark.parametrize("make", [lambda: CountMinSketch(depth=4, width=1 << 16),
                                  lambda: StreamingFrequency(num_buckets=1 << 16)])
def test_ids_equal_mod_p_do_not_collide_in_every_row(make):
    """Two 64-bit keys congruent mod 2^31 - 1 (string fingerprints, large integer ids)
    are hashed apart: the count-min bound holds for them."""
    first = np.int64(5_000_000_000)
    second = first + np.int64(P)  # first + (2^31 - 1): equal mod p
    estimator = make()
    for _ in range(10):
        estimator.update(tf.constant([first] * 100, tf.int64))
    if isinstance(estimator, CountMinSketch):
        assert estimator.count(tf.constant([second], tf.int64)).numpy()[0] == 0
    else:
        assert estimator.log_q(tf.constant([second], tf.int64)).numpy()[0] < \
            estimator.log_q(tf.constant([first], tf.int64)).numpy()[0]
