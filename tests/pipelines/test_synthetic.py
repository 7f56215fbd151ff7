"""Specification of the synthetic stream (`tfrs_logq.pipelines.synthetic`)."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfrs_logq.pipelines.synthetic import SyntheticConfig, SyntheticStream


@pytest.fixture(scope="module")
def small():
    return SyntheticStream(num_items=300, num_users=40, num_topics=7, seed=3)


def _reference_probs(stream, user):
    """P(d|u) for all items, from the generative story, in numpy."""
    cfg = stream.config
    logits = stream.user_topic_logits([user]).numpy()[0]
    p_topic = np.exp(logits - logits.max())
    p_topic /= p_topic.sum()
    d = np.arange(1, cfg.num_items + 1)
    pop = d ** -cfg.zipf_exponent
    topic = (d - 1) % cfg.num_topics
    z = np.bincount(topic, weights=pop, minlength=cfg.num_topics)
    return p_topic[topic] * pop / z[topic]


def test_true_probabilities_match_the_generative_story(small):
    ref = _reference_probs(small, 5)
    got = np.exp(small.true_log_prob(np.full(300, 5), np.arange(1, 301)).numpy())
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    assert got.sum() == pytest.approx(1.0)


def test_true_log_prob_scores_a_row_of_items_per_user(small):
    users = np.array([5, 0, 39])
    items = np.array([[1, 2, 300], [7, 8, 9], [150, 1, 42]])
    got = small.true_log_prob(users, items).numpy()
    assert got.shape == (3, 3)
    for i, user in enumerate(users):
        np.testing.assert_allclose(np.exp(got[i]), _reference_probs(small, user)[items[i] - 1],
                                   rtol=1e-10)


def test_stream_batches_equal_those_of_the_categorical_sampler_it_replaced():
    """Topics are drawn by binary search in the users' CDF table; before, by
    `stateless_categorical` over their logits, on the same key. Inside the stream's
    tf.data map the two draw the same batches (TensorFlow's CPU kernel inverts the CDF
    with one uniform per draw), so results of earlier versions reproduce. (In eager mode
    on more than ~100 rows the kernel draws otherwise: this is a property of the
    stream, not of `sample_topics` alone.)"""
    stream = SyntheticStream(num_items=5000, num_users=300, num_topics=40,
                             topic_sharpness=4.0, seed=2)

    def old_batch(index):  # the stream's _batch as it was, with stateless_categorical
        seed = tf.stack([tf.constant(2, tf.int64), index])
        s_user, s_items = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        users = tf.random.stateless_uniform([512], seed=s_user, maxval=300, dtype=tf.int64)
        s1, _ = tf.unstack(tf.random.experimental.stateless_split(s_items, 2))
        return tf.random.stateless_categorical(stream.user_topic_logits(users), 11, seed=s1,
                                               dtype=tf.int64)

    old = tf.data.Dataset.range(5, 9).map(old_batch)
    for batch, topics in zip(stream.dataset(512, num_batches=4, start_batch=5), old):
        items = np.concatenate([batch["history"].numpy(), batch["target"].numpy()[:, None]], 1)
        np.testing.assert_array_equal((items - 1) % 40, topics.numpy())


def test_samples_follow_true_probabilities(small):
    ds = small.dataset(512, num_batches=60)
    draws = {u: [] for u in range(40)}
    for batch in ds:
        items = np.concatenate([batch["history"].numpy(), batch["target"].numpy()[:, None]], 1)
        for u, row in zip(batch["user_id"].numpy(), items):
            draws[u].extend(row)
    user = max(draws, key=lambda u: len(draws[u]))
    counts = np.bincount(draws[user], minlength=301)[1:]
    assert counts.sum() > 5000
    expected = _reference_probs(small, user) * counts.sum()
    # Pool rare cells so the chi-square approximation holds.
    order = np.argsort(-expected)
    keep = order[expected[order] >= 5]
    rest = order[expected[order] < 5]
    obs = np.append(counts[keep], counts[rest].sum())
    exp = np.append(expected[keep], expected[rest].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-3
    assert min(min(v) for v in draws.values() if v) >= 1  # id 0 is padding, never drawn


def test_deterministic_by_seed_and_disjoint_by_start(small):
    a = next(iter(small.dataset(64, num_batches=1)))
    b = next(iter(small.dataset(64, num_batches=1)))
    c = next(iter(small.dataset(64, num_batches=1, start_batch=7)))
    np.testing.assert_array_equal(a["history"].numpy(), b["history"].numpy())
    assert not np.array_equal(a["history"].numpy(), c["history"].numpy())
    other = SyntheticStream(num_items=300, num_users=40, num_topics=7, seed=4)
    d = next(iter(other.dataset(64, num_batches=1)))
    assert not np.array_equal(a["history"].numpy(), d["history"].numpy())


def test_true_top_k_is_the_argsort_of_true_probabilities(small):
    ids, scores = small.true_top_k([2, 9], 25)
    for row, user in enumerate([2, 9]):
        ref = _reference_probs(small, user)
        order = np.argsort(-ref)[:25] + 1
        np.testing.assert_array_equal(np.sort(ids.numpy()[row]), np.sort(order))
        np.testing.assert_allclose(np.exp(scores.numpy()[row]), ref[order - 1], rtol=1e-10)


def test_true_top_k_in_chunks_of_users_equals_one_chunk(small):
    users = np.arange(0, 40, 3)
    ids, scores = small.true_top_k(users, 25)
    ids_1, scores_1 = small.true_top_k(users, 25, max_chunk_floats=1)  # one user at a time
    np.testing.assert_array_equal(ids_1.numpy(), ids.numpy())
    np.testing.assert_allclose(scores_1.numpy(), scores.numpy(), rtol=1e-12)


def test_item_marginal_is_the_average_over_users(small):
    ref = np.mean([_reference_probs(small, u) for u in range(40)], axis=0)
    got = np.exp(small.item_log_marginal()[1:])
    np.testing.assert_allclose(got, ref, rtol=1e-9)


def test_large_catalog_builds_without_quadratic_memory():
    stream = SyntheticStream(num_items=2_000_000, num_users=1000, num_topics=64)
    batch = next(iter(stream.dataset(256, num_batches=1)))
    assert batch["history"].shape == (256, 10)
    assert batch["target"].numpy().max() <= 2_000_000 and batch["target"].numpy().min() >= 1


def test_config_errors():
    with pytest.raises(ValueError, match="num_items"):
        SyntheticConfig(num_items=0)
    with pytest.raises(ValueError, match="num_topics"):
        SyntheticConfig(num_items=5, num_topics=10)
    with pytest.raises(ValueError, match="zipf_exponent"):
        SyntheticConfig(zipf_exponent=0)
    with pytest.raises(ValueError, match="batch_size"):
        SyntheticStream(num_items=10, num_users=2, num_topics=2).dataset(0)
