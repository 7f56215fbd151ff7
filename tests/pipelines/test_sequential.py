"""pipelines/sequential.py: the training windows and masks, and full-catalog evaluation
against numpy."""

import numpy as np
import pytest
import tensorflow as tf
from pipeline_data import _toy_interactions, isolated_cache  # noqa: F401

from tfrs_logq.pipelines.sequential import evaluate, evaluation_arrays, training_dataset
from tfrs_logq.pipelines.splits import leave_one_out


def test_training_dataset_windows_and_masks():
    inter, _ = _toy_interactions()
    split = leave_one_out(inter)
    batches = list(training_dataset(split, batch_size=4, max_length=5, seed=1))
    seen = set()
    train = split.train_sequences()
    for b in batches:
        for row in range(len(b["user"])):
            u = int(b["user"][row])
            seen.add(u)
            window = np.concatenate([[0] * 6, train[u]])[-6:]
            np.testing.assert_array_equal(b["input_ids"][row], window[:-1])
            np.testing.assert_array_equal(b["target_ids"][row], window[1:])
            # A target needs a real input before it: the first item is never one.
            np.testing.assert_array_equal(b["is_target"][row],
                                          (window[:-1] != 0) & (window[1:] != 0))
            assert int(np.sum(b["is_target"][row])) == min(len(train[u]), 6) - 1
    assert seen == {u for u, s in enumerate(train) if len(s) >= 2}
    again = [b["user"].numpy().tolist() for b in training_dataset(split, 4, 5, seed=1)]
    assert again == [b["user"].numpy().tolist() for b in batches]  # deterministic by seed


def test_evaluate_matches_numpy_full_catalog_with_seen_items_excluded():
    inter, _ = _toy_interactions()
    split = leave_one_out(inter)
    rng = np.random.default_rng(0)
    items = rng.normal(size=(inter.num_items + 1, 4)).astype(np.float32)
    proj = rng.normal(size=(4, 4)).astype(np.float32)

    def query_fn(history):
        return tf.reduce_sum(tf.gather(items, history), axis=1) @ proj

    arrays = evaluation_arrays(split, split.test, max_length=3)
    ranks = []
    metrics = evaluate(query_fn, items, arrays, ks=(1, 3), per_target=ranks)
    seqs = inter.sequences()
    expected = []
    for u, k, target in zip(split.test.users, split.test.history_lengths, split.test.targets):
        hist = seqs[u][:k]
        q = items[np.concatenate([[0] * 3, hist])[-3:]].sum(0) @ proj
        s = items @ q
        valid = np.ones(len(items), bool)
        valid[0] = False
        valid[hist] = False
        valid[target] = False
        expected.append(int((s[valid] >= s[target]).sum()))
    np.testing.assert_array_equal(ranks, expected)
    r = np.array(expected)
    assert metrics["recall@3"] == pytest.approx(np.mean(r < 3))
    assert metrics["ndcg@3"] == pytest.approx(np.mean(np.where(r < 3, 1 / np.log2(r + 2), 0)))
