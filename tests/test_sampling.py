"""Specification of the negative samplers in `tfrs_logq.sampling`."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfrs_logq import CorrectedRetrieval
from tfrs_logq.frequency import ExactFrequency
from tfrs_logq.sampling import (
    NEGATIVES_SALT,
    InBatchSampler,
    MixedSampler,
    UniformSampler,
    distinct_in_random_order,
    draw_negative_ids,
    sample_negatives,
)


def test_uniform_sampler_is_uniform_over_catalog_excluding_padding():
    sampler = UniformSampler(num_items=20, num_negatives=500, first_id=1, seed=3)
    draws = np.concatenate([sampler().ids.numpy() for _ in range(40)])
    assert draws.min() >= 1 and draws.max() <= 20
    counts = np.bincount(draws, minlength=21)[1:]
    assert stats.chisquare(counts).pvalue > 0.001
    out = sampler()
    np.testing.assert_allclose(out.log_q.numpy(), np.full(500, -np.log(20.0)), rtol=1e-6)
    assert out.is_valid.numpy().all()


def test_in_batch_dedup_subsamples_distinct_items_uniformly():
    positives = np.array([5] * 50 + [6] * 3 + [7, 8, 9, 0, 0])  # 0 is padding
    sampler = InBatchSampler(num_negatives=2, deduplicate=True, pad_id=0, seed=1)
    draws = []
    for _ in range(1000):
        out = sampler(positives)
        ids = out.ids.numpy()
        assert len(set(ids)) == 2 and 0 not in ids  # distinct, no padding
        draws.extend(ids)
    counts = np.bincount(draws, minlength=10)[[5, 6, 7, 8, 9]]
    # Each distinct item is equally likely to be kept, whatever its batch count.
    assert stats.chisquare(counts).pvalue > 0.001


def test_in_batch_without_dedup_follows_batch_frequencies():
    positives = np.array([1] * 30 + [2] * 10 + [3] * 10)
    sampler = InBatchSampler(num_negatives=5, deduplicate=False, seed=2)
    draws = np.concatenate([sampler(positives).ids.numpy() for _ in range(600)])
    counts = np.bincount(draws, minlength=4)[1:]
    expected = np.array([0.6, 0.2, 0.2]) * len(draws)
    assert stats.chisquare(counts, expected).pvalue > 0.001


def test_in_batch_pads_when_too_few_distinct_items_and_uses_frequency():
    freq = ExactFrequency.from_counts(np.array([0, 10, 30, 60], float))
    sampler = InBatchSampler(num_negatives=5, frequency=freq, pad_id=0)
    out = sampler(np.array([1, 2, 2, 3]))
    valid = out.is_valid.numpy()
    assert valid.sum() == 3 and out.ids.shape == (5,)
    ids = out.ids.numpy()
    assert (ids[~valid] == 0).all()
    np.testing.assert_allclose(out.log_q.numpy()[valid], np.log([10, 30, 60])[ids[valid] - 1] -
                               np.log(100), rtol=1e-6)


def test_in_batch_default_log_q_is_batch_frequency():
    out = InBatchSampler(num_negatives=3)(np.array([4, 4, 4, 7]))
    got = dict(zip(out.ids.numpy()[out.is_valid.numpy()], out.log_q.numpy()))
    assert got[4] == pytest.approx(np.log(0.75)) and got[7] == pytest.approx(np.log(0.25))


@pytest.mark.parametrize("mode", ["unigram", "mixture"])
def test_mixed_sampler_log_q(mode):
    freq = ExactFrequency.from_counts(np.arange(11, dtype=float))  # Q(d) = d / 55
    sampler = MixedSampler(
        UniformSampler(num_items=10, num_negatives=4, seed=0),
        InBatchSampler(num_negatives=4, frequency=freq),
        log_q=mode,
    )
    out = sampler(np.array([1, 2, 3, 4, 5, 6]))
    ids, log_q = out.ids.numpy(), out.log_q.numpy()
    assert ids.shape == (8,) and out.is_valid.numpy().all()
    unigram = np.log(np.maximum(ids, 1) / 55.0)
    expected = unigram if mode == "unigram" else np.log(0.5 / 10 + 0.5 * np.exp(unigram))
    np.testing.assert_allclose(log_q, expected, rtol=1e-5)


def test_samplers_work_in_tf_function_and_feed_the_task():
    freq = ExactFrequency.from_counts(np.ones(51))
    sampler = MixedSampler(
        UniformSampler(num_items=50, num_negatives=6),
        InBatchSampler(num_negatives=6, frequency=freq),
    )
    emb = tf.keras.layers.Embedding(51, 4)
    task = CorrectedRetrieval(reduction="none")

    @tf.function
    def step(positive_ids, queries):
        neg = sampler(positive_ids)
        n = tf.shape(queries)[0]
        ids = tf.concat([positive_ids, neg.ids], 0)
        log_q = tf.concat([freq.log_q(positive_ids), neg.log_q], 0)
        return task(queries, emb(ids), candidate_ids=ids,
                    candidate_log_sampling_probability=log_q, score_mask=neg.score_mask(n))

    first = step(tf.constant([1, 2, 3], tf.int64), tf.random.normal([3, 4]))
    second = step(tf.constant([1, 2, 3], tf.int64), tf.random.normal([3, 4]))
    assert first.shape == (3,) and np.isfinite(first.numpy()).all()
    assert np.isfinite(second.numpy()).all()


def test_sampler_errors():
    with pytest.raises(ValueError, match="num_negatives"):
        InBatchSampler(num_negatives=0)
    with pytest.raises(ValueError, match="num_items"):
        UniformSampler(num_items=0, num_negatives=3)
    with pytest.raises(ValueError, match="log_q"):
        MixedSampler(UniformSampler(5, 2), InBatchSampler(2), log_q="exact")


@pytest.mark.parametrize("deduplicate", [True, False])
def test_samplers_and_task_compile_under_xla(deduplicate):
    """Sampling, masks and the corrected loss in one XLA cluster (no tf.unique/shuffle)."""
    sampler = MixedSampler(UniformSampler(num_items=50, num_negatives=4),
                           InBatchSampler(num_negatives=5, deduplicate=deduplicate))
    task = CorrectedRetrieval(reduction="none")
    table = tf.random.normal([51, 4], seed=1)

    @tf.function(jit_compile=True)
    def step(positive_ids, queries):
        neg = sampler(positive_ids)
        ids = tf.concat([positive_ids, neg.ids], 0)
        log_q = tf.concat([tf.fill(tf.shape(positive_ids), -3.0), neg.log_q], 0)
        loss = task(queries, tf.gather(table, ids), candidate_ids=ids,
                    candidate_log_sampling_probability=log_q,
                    score_mask=neg.score_mask(tf.shape(queries)[0]))
        return loss, neg.ids, neg.is_valid

    positives = tf.constant([1, 2, 2, 3, 0, 7], tf.int64)  # 0 is padding
    loss, ids, valid = step(positives, tf.random.normal([6, 4], seed=2))
    assert np.isfinite(loss.numpy()).all()
    inb = ids.numpy()[4:][valid.numpy()[4:]]
    assert set(inb) <= {1, 2, 3, 7} and 0 not in inb
    if deduplicate:
        assert len(inb) == 4 and len(set(inb)) == 4  # four distinct real items, one pad
    else:
        assert len(inb) == 5  # five real positions drawn without replacement


def test_score_mask_is_the_diagonal_then_the_valid_negatives():
    from tfrs_logq.sampling import SampledNegatives

    valid = np.array([True, False, True])
    neg = SampledNegatives(tf.constant([5, 0, 7], tf.int64), tf.zeros([3]), tf.constant(valid))
    expected = np.concatenate([np.eye(4, dtype=bool), np.broadcast_to(valid, (4, 3))], axis=1)
    np.testing.assert_array_equal(neg.score_mask(4).numpy(), expected)
    traced = tf.function(lambda n: neg.score_mask(n))(tf.constant(4))  # dynamic batch
    np.testing.assert_array_equal(traced.numpy(), expected)


@pytest.mark.parametrize("deduplicate", [True, False])
def test_in_batch_sampler_draws_string_ids_as_their_codes(deduplicate):
    """String ids are drawn through their codes (first occurrence order): the same draw
    as integer ids with those codes, "" (or a given pad string) as padding."""
    codes = np.array([3, 1, 3, 2, 0, 1, 4, 0], np.int64)  # 0 is padding
    names = np.array(["", "a", "b", "c", "d"])[codes]
    # First-occurrence codes of the strings, padding -> -1.
    first = {v: i for i, v in reversed(list(enumerate(dict.fromkeys(names.tolist()))))}
    by_int = InBatchSampler(4, deduplicate=deduplicate, seed=7)(
        tf.constant([first[n] + 1 if n else 0 for n in names], tf.int64))
    by_str = InBatchSampler(4, deduplicate=deduplicate, seed=7)(tf.constant(names))
    lookup = {first[n] + 1: n for n in names if n}
    expected = [lookup[i] if ok else "" for i, ok in zip(by_int.ids.numpy(),
                                                        by_int.is_valid.numpy())]
    assert [s.decode() for s in by_str.ids.numpy()] == expected
    np.testing.assert_array_equal(by_str.is_valid.numpy(), by_int.is_valid.numpy())
    np.testing.assert_allclose(by_str.log_q.numpy(), by_int.log_q.numpy())
    padded = InBatchSampler(4, pad_id="<pad>", seed=1)(tf.constant(["x", "<pad>", "x"]))
    assert padded.ids.numpy().tolist() == [b"x", b"<pad>", b"<pad>", b"<pad>"]


# ------------------------------------------------------------- stateless draws of a step


def _halves(seed, step):
    """The two keys of step ``step`` from the formula: fold ``step`` (int64) into
    ``[seed, salt]`` (salt: "negative" in ASCII), split in two."""
    assert NEGATIVES_SALT == int.from_bytes(b"negative", "big")
    key = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, NEGATIVES_SALT], tf.int64), tf.constant(step, tf.int64))
    return tf.unstack(tf.random.experimental.stateless_split(key, 2))


def test_sample_negatives_is_the_uniform_then_the_in_batch_draw_of_the_step_key():
    positives = tf.constant([4, 9, 9, 2, 7, 4, 0, 11], tf.int64)
    table = tf.constant(np.log(np.arange(1, 22) / 231.0), tf.float32)
    out = sample_negatives(positives, 3, 17, num_uniform=5, num_in_batch=6, num_items=20,
                           log_q=table)
    s_uniform, s_in_batch = _halves(3, 17)
    uniform = tf.random.stateless_uniform([5], seed=s_uniform, minval=1, maxval=21,
                                          dtype=tf.int64).numpy()
    in_batch, valid = distinct_in_random_order(positives, 6, s_in_batch)
    ids = np.concatenate([uniform, in_batch.numpy()])
    is_valid = np.concatenate([np.ones(5, bool), valid.numpy()])
    np.testing.assert_array_equal(out.ids.numpy(), ids)
    np.testing.assert_array_equal(out.is_valid.numpy(), is_valid)
    assert is_valid.sum() == 10 and set(ids[5:][is_valid[5:]]) == {2, 4, 7, 9, 11}
    expected = np.where(is_valid, np.log(np.arange(1, 22) / 231.0)[ids], 0.0)
    np.testing.assert_allclose(out.log_q.numpy(), expected, rtol=1e-6)
    # A function of (seed, step) alone: the same again, another step or seed differs.
    again = sample_negatives(positives, 3, tf.constant(17, tf.int64), num_uniform=5,
                             num_in_batch=6, num_items=20, log_q=table)
    np.testing.assert_array_equal(again.ids.numpy(), ids)
    for seed, step in ((3, 18), (4, 17)):
        other = sample_negatives(positives, seed, step, num_uniform=5, num_items=20)
        assert not np.array_equal(other.ids.numpy(), ids[:5])
    # Each part alone is that part of the mix; a function of the ids gives log Q too.
    alone = sample_negatives(positives, 3, 17, num_in_batch=6,
                             log_q=lambda drawn: -tf.cast(drawn, tf.float32))
    np.testing.assert_array_equal(alone.ids.numpy(), ids[5:])
    np.testing.assert_allclose(alone.log_q.numpy(), np.where(is_valid[5:], -ids[5:], 0.0))


def test_draw_negative_ids_per_row_and_per_replica():
    """Per-row uniform negatives (SASRec's, one row per position) are the step key's
    uniform half drawn at `[rows, k]`; a replica folds its id into the key before the
    split; the in-batch half is the one sample_negatives draws."""
    positives = tf.constant([4, 9, 9, 2, 0], tf.int32)
    drawn = draw_negative_ids(positives, 5, 3, num_uniform=4, num_in_batch=3, num_items=30,
                              num_rows=tf.size(positives), dtype=tf.int32)
    s_uniform, s_in_batch = _halves(5, 3)
    want = tf.random.stateless_uniform([5, 4], seed=s_uniform, minval=1, maxval=31,
                                       dtype=tf.int32)
    np.testing.assert_array_equal(drawn.uniform.numpy(), want.numpy())
    assert drawn.uniform.dtype == tf.int32 and drawn.in_batch.dtype == tf.int32
    shared = sample_negatives(tf.cast(positives, tf.int64), 5, 3, num_in_batch=3)
    np.testing.assert_array_equal(drawn.in_batch.numpy(), shared.ids.numpy())
    np.testing.assert_array_equal(drawn.in_batch_valid.numpy(), shared.is_valid.numpy())
    key = tf.random.experimental.stateless_fold_in(
        tf.constant([5, NEGATIVES_SALT], tf.int64), tf.constant(3, tf.int64))
    for replica in (0, 1):
        folded = tf.random.experimental.stateless_fold_in(key, tf.constant(replica, tf.int64))
        half = tf.unstack(tf.random.experimental.stateless_split(folded, 2))[0]
        got = draw_negative_ids(None, 5, 3, num_uniform=4, num_items=30, num_rows=5,
                                dtype=tf.int32, replica=tf.constant(replica))
        want = tf.random.stateless_uniform([5, 4], seed=half, minval=1, maxval=31,
                                           dtype=tf.int32)
        np.testing.assert_array_equal(got.uniform.numpy(), want.numpy())
        assert not np.array_equal(got.uniform.numpy(), drawn.uniform.numpy())
    compiled = tf.function(lambda p: draw_negative_ids(
        p, 5, tf.constant(3, tf.int64), num_uniform=4, num_in_batch=3, num_items=30,
        num_rows=tf.size(p), dtype=tf.int32, replica=tf.constant(1)), jit_compile=True)
    assert compiled(positives).uniform.shape == (5, 4)


def test_sample_negatives_refuses_no_negatives():
    with pytest.raises(ValueError, match="`num_uniform` and `num_in_batch`"):
        sample_negatives(tf.constant([1, 2]), 0, 0)
    with pytest.raises(ValueError, match="`num_items` must be a positive int"):
        sample_negatives(None, 0, 0, num_uniform=2)


def test_samplers_draw_at_their_counter_or_the_given_step():
    positives = np.array([3, 5, 5, 8, 13, 2])
    freq = ExactFrequency.from_counts(np.arange(20, dtype=float))
    pairs = [
        (lambda: InBatchSampler(4, frequency=freq, seed=7),
         dict(num_in_batch=4, log_q=lambda ids: freq.log_q(ids))),
        (lambda: UniformSampler(19, 4, seed=7),
         dict(num_uniform=4, num_items=19, log_q=lambda ids: tf.fill([4], -np.log(19.0)))),
        (lambda: MixedSampler(UniformSampler(19, 3, seed=1),
                              InBatchSampler(4, frequency=freq, seed=7)),
         dict(num_uniform=3, num_in_batch=4, num_items=19,
              log_q=lambda ids: freq.log_q(ids))),
    ]
    ids = tf.constant(positives, tf.int64)
    for make, kwargs in pairs:
        counted, stepped = make(), make()
        for call in (1, 2, 3):
            drawn = counted(positives)
            at_step = stepped(positives, step=tf.constant(call, tf.int64))
            reference = sample_negatives(ids, 7, call, **kwargs)
            for out in (drawn, at_step):
                np.testing.assert_array_equal(out.ids.numpy(), reference.ids.numpy())
                np.testing.assert_array_equal(out.is_valid.numpy(),
                                              reference.is_valid.numpy())
                np.testing.assert_allclose(out.log_q.numpy(), reference.log_q.numpy(),
                                           rtol=1e-6)
