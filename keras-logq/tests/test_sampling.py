"""Samplers: static shapes, the draws' distribution, and their log Q against numpy."""

import json
import math

import keras
import numpy as np
import pytest
from conftest import jit, to_numpy
from keras_logq import (
    InBatchNegatives,
    ItemFrequency,
    MixedNegatives,
    UniformNegatives,
    batch_log_frequency,
    distinct_in_random_order,
)


def np_batch_log_frequency(ids, batch, pad_id=0):
    real = batch[batch != pad_id]
    return np.log(np.maximum([np.sum(batch == i) for i in ids], 1) / max(real.size, 1))


def test_distinct_in_random_order_shapes_padding_and_distinctness():
    batch = np.array([5, 5, 0, 7, 9, 7, 0], "int32")
    ids, valid = distinct_in_random_order(batch, 5, seed=3)
    ids, valid = to_numpy(ids), to_numpy(valid)
    assert ids.shape == (5,) and valid.shape == (5,)
    assert valid.sum() == 3 and sorted(ids[valid]) == [5, 7, 9]
    assert (ids[~valid] == 0).all()
    ids, valid = distinct_in_random_order(batch, 5, seed=3, distinct=False)
    assert to_numpy(valid).sum() == 5 and sorted(to_numpy(ids)) == [5, 5, 7, 7, 9]


def test_distinct_draws_are_uniform_over_distinct_items():
    """Item 1 fills 4 of the 7 real positions; deduplicated draws still pick it 1/4 of the
    time (positions give 4/7)."""
    batch = np.array([1, 1, 1, 1, 2, 3, 4, 0], "int32")
    sampler = InBatchNegatives(num_negatives=1, seed=0)
    draws = np.array([int(to_numpy(sampler(batch).ids)[0]) for _ in range(120)])
    counts = np.array([np.sum(draws == i) for i in (1, 2, 3, 4)])
    # 30 each (s.d. 4.7); positional draws would give item 1 about 69.
    assert counts.sum() == 120 and (counts > 12).all() and (counts < 48).all(), counts
    positional = InBatchNegatives(num_negatives=1, deduplicate=False, seed=0)
    draws = np.array([int(to_numpy(positional(batch).ids)[0]) for _ in range(120)])
    assert 47 < np.sum(draws == 1) < 90  # 120 * 4/7 = 69 (s.d. 5.4)


def test_in_batch_log_q_is_the_batch_frequency_or_the_estimators():
    batch = np.array([4, 4, 4, 2, 7, 0], "int32")
    out = InBatchNegatives(num_negatives=5, seed=1)(batch)
    ids, log_q, valid = (to_numpy(x) for x in out)
    np.testing.assert_allclose(log_q[valid], np_batch_log_frequency(ids[valid], batch), rtol=1e-6)
    assert (log_q[~valid] == 0).all() and valid.sum() == 3
    frequency = ItemFrequency(10)
    frequency.set_counts(np.arange(10))
    out = InBatchNegatives(num_negatives=3, seed=1)(batch, frequency=frequency)
    ids, log_q = to_numpy(out.ids), to_numpy(out.log_q)
    np.testing.assert_allclose(log_q, np.log(np.maximum(ids, 1) / 45.0), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(batch_log_frequency(np.array([4, 3]), batch,
                                                            batch != 0)),
                               np.log([3 / 5, 1 / 5]), rtol=1e-6)


def test_uniform_negatives():
    out = UniformNegatives(num_items=50, num_negatives=200, first_id=1, seed=2)(None)
    ids = to_numpy(out.ids)
    assert ids.shape == (200,) and ids.min() >= 1 and ids.max() <= 50
    assert len(np.unique(ids)) > 30
    np.testing.assert_allclose(to_numpy(out.log_q), -math.log(50), rtol=1e-6)
    assert to_numpy(out.is_valid).all()


@pytest.mark.parametrize("mode", ["unigram", "mixture"])
def test_mixed_negatives_log_q(mode):
    batch = np.array([3, 3, 5, 8, 0, 3], "int32")
    sampler = MixedNegatives(UniformNegatives(num_items=20, num_negatives=4, seed=1),
                             InBatchNegatives(num_negatives=4, seed=2), log_q=mode)
    ids, log_q, valid = (to_numpy(x) for x in sampler(batch))
    assert ids.shape == (8,) and valid[:4].all() and valid[4:].sum() == 3
    unigram = np_batch_log_frequency(ids, batch)
    if mode == "mixture":
        a = 0.5
        expected = np.log(a / 20 + (1 - a) * np.exp(unigram))
    else:
        expected = unigram
    np.testing.assert_allclose(log_q[valid], expected[valid], rtol=1e-5)
    assert (log_q[~valid] == 0).all()


def test_sampler_configs_round_trip_through_json():
    mixed = MixedNegatives(UniformNegatives(num_items=20, num_negatives=4, seed=1),
                           InBatchNegatives(num_negatives=3, deduplicate=False, seed=2),
                           log_q="mixture")
    clone = MixedNegatives.from_config(json.loads(json.dumps(mixed.get_config())))
    assert clone.num_negatives == 7 and clone.log_q_mode == "mixture"
    assert clone.in_batch.deduplicate is False and clone.uniform.num_items == 20


def test_distinct_in_random_order_compiles():
    batch = keras.ops.convert_to_tensor(np.array([5, 5, 0, 7, 9, 7, 0], "int32"))
    ids, valid = jit(lambda b: distinct_in_random_order(b, 4, seed=3))(batch)
    ids, valid = to_numpy(ids), to_numpy(valid)
    assert ids.shape == (4,) and sorted(ids[valid]) == [5, 7, 9]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_negatives"):
        InBatchNegatives(num_negatives=0)
    with pytest.raises(ValueError, match="log_q"):
        MixedNegatives(UniformNegatives(5, 2), InBatchNegatives(2), log_q="uniform")
    with pytest.raises(ValueError, match="ids"):
        distinct_in_random_order(np.array([1.0, 2.0]), 2, seed=0)
