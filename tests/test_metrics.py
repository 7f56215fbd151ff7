"""`tfrs_logq.metrics`: ranks, Recall and NDCG against numpy, and the Beam Evaluator's
histogram form agreeing with them."""

import numpy as np
import pytest

from tfrs_logq.metrics import NOT_RETURNED, recall_ndcg_from_ranks, target_ranks


def test_target_ranks_and_metrics_match_numpy():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(50, 6)).astype(np.float32)
    items = rng.normal(size=(40, 6)).astype(np.float32)
    targets = rng.integers(1, 40, 50)
    exclude = rng.integers(0, 40, size=(50, 5))
    exclude[:10, 0] = targets[:10]  # repeat targets: the served top_k never returns them
    exclude[10:] = np.where(exclude[10:] == targets[10:, None], 0, exclude[10:])
    ranks = target_ranks(q, items, targets, exclude=exclude, chunk_size=16)
    scores = q @ items.T
    expected = []
    for i in range(50):
        if targets[i] in exclude[i]:
            expected.append(NOT_RETURNED)  # a miss at every cut-off
            continue
        valid = np.ones(40, bool)
        valid[0] = False
        valid[exclude[i]] = False
        valid[targets[i]] = False
        expected.append(int((scores[i][valid] >= scores[i, targets[i]]).sum()))
    np.testing.assert_array_equal(ranks, expected)
    assert (ranks[:10] == NOT_RETURNED).all() and (ranks[10:] < 40).all()
    metrics = recall_ndcg_from_ranks(ranks, (1, 10))
    r = np.array(expected)
    assert metrics["recall@10"] == pytest.approx(np.mean(r < 10))
    assert metrics["ndcg@10"] == pytest.approx(np.mean(np.where(r < 10, 1 / np.log2(r + 2), 0)))


def test_recall_ndcg_from_ranks_histograms_and_the_beam_evaluator_agree():
    """One implementation: the Beam Evaluator's figures are `tfrs_logq.metrics`' on the same
    ranks, and both are the formula in numpy."""
    from tfrs_logq.metrics import rank_histogram, recall_ndcg_from_histogram
    from tfrs_logq.pipelines.beam import evaluation

    ranks = np.random.default_rng(2).integers(0, 3000, size=500) // 3
    r = ranks.astype(np.float64)
    histogram = rank_histogram(ranks, 1000)
    assert histogram.sum() == 500 and histogram[-1] == int(np.sum(ranks >= 1000))
    from_ranks = recall_ndcg_from_ranks(ranks, (10, 20, 100, 1000))
    from_histogram = recall_ndcg_from_histogram(histogram, (10, 100, 1000), (20,))
    beam = evaluation.metrics_from_histogram(histogram)
    assert beam == from_histogram
    for k in (10, 100, 1000):
        assert from_histogram[f"recall@{k}"] == pytest.approx(np.mean(r < k), rel=1e-12)
        assert from_ranks[f"recall@{k}"] == pytest.approx(np.mean(r < k), rel=1e-12)
    expected = np.mean(np.where(r < 20, 1 / np.log2(r + 2), 0))
    assert from_histogram["ndcg@20"] == pytest.approx(expected, rel=1e-12)
    assert from_ranks["ndcg@20"] == pytest.approx(expected, rel=1e-12)
    # The docstring's example: ranks [0, 3, miss].
    example = evaluation.metrics_from_histogram(rank_histogram([0, 3, 5000], 1000))
    assert example["recall@10"] == pytest.approx(2 / 3)
    assert round(example["ndcg@20"], 4) == 0.4769


def test_a_diverged_model_scores_no_hit():
    """NaN embeddings (a diverged run) give every target the last rank: Recall 0, not 1."""
    q = np.full((3, 4), np.nan, np.float32)
    items = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    ranks = target_ranks(q, items, [1, 2, 5])
    np.testing.assert_array_equal(ranks, [4, 4, 4])  # 5 items, the target not counted
    assert recall_ndcg_from_ranks(ranks, (1, 4))["recall@4"] == 0.0


def test_a_padding_target_is_never_returned():
    q = np.ones((1, 2), np.float32)
    items = np.ones((4, 2), np.float32)
    assert target_ranks(q, items, [0], exclude=[[0, 0]])[0] == NOT_RETURNED


def test_ties_count_against_the_target():
    ranks = target_ranks(np.zeros((2, 3), np.float32), np.ones((5, 3), np.float32), [1, 4])
    np.testing.assert_array_equal(ranks, [3, 3])  # 4 real items, all tied


def test_ranks_from_scores_counts_other_columns_at_least_the_targets_score():
    import tensorflow as tf

    from tfrs_logq.metrics import ranks_from_scores

    scores = np.array([[0.5, 0.9, 0.5, 0.1], [0.3, 0.2, 0.1, 0.0], [np.nan, 1.0, 2.0, 0.0]],
                      np.float32)
    targets = np.array([0, 3, 0])
    # Row 0: the tie at column 2 counts against the target; row 1: the worst; row 2: a
    # NaN target ranks last (a diverged model is never a hit).
    np.testing.assert_array_equal(ranks_from_scores(tf.constant(scores), targets), [2, 3, 3])
    valid = np.array([True, True, False, True])
    np.testing.assert_array_equal(ranks_from_scores(tf.constant(scores), targets, valid),
                                  [1, 2, 2])
    rng = np.random.default_rng(3)
    big = rng.standard_normal((6, 500)).astype(np.float32)
    t = rng.integers(0, 500, 6)
    expected = (big >= big[np.arange(6), t][:, None]).sum(1) - 1
    np.testing.assert_array_equal(ranks_from_scores(tf.constant(big), t), expected)


def test_popularity_deciles_sort_by_frequency_descending_ties_by_index():
    from tfrs_logq.metrics import popularity_deciles

    rng = np.random.default_rng(0)
    for counts in (rng.integers(0, 4, 37), rng.integers(0, 4, 37).astype(np.uint32),
                   rng.uniform(size=23), np.array([5, 0, 9, 5]), np.array([3])):
        n = len(counts)
        by_popularity = sorted(range(n), key=lambda i: (-float(counts[i]), i))
        expected = np.empty(n, np.int64)
        expected[by_popularity] = [min(position * 10 // n, 9) for position in range(n)]
        got = popularity_deciles(counts)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(popularity_deciles([]), np.zeros([0], np.int64))
    # Each decile holds a tenth of a catalog of 100 items.
    np.testing.assert_array_equal(np.bincount(popularity_deciles(rng.uniform(size=100))),
                                  [10] * 10)
