"""`benchmarks/bench_keras3.py`'s Recall@k: the library's ranks and formula, against a
brute-force count in numpy, for every backend's embeddings."""

import numpy as np

from benchmarks import bench_keras3


def test_recall_at_k_counts_targets_among_the_k_best_scores_of_the_whole_catalog():
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(300, 8)).astype(np.float32)
    items = rng.normal(size=(120, 8)).astype(np.float32)  # row i is item i + 1
    targets = rng.integers(1, 121, size=300)
    scores = queries.astype(np.float64) @ items.T.astype(np.float64)
    target_scores = scores[np.arange(300), targets - 1]
    above = (scores > target_scores[:, None]).sum(axis=1)  # no ties in random floats
    for k in (1, 10, 60):
        assert bench_keras3.recall_at_k(queries, items, targets, k) == np.mean(above < k)
