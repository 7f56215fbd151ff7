"""serving/served_recall.py: the index ``export --index auto`` builds, measured against exact
top-k on given embeddings. The recall it records is recomputed here: the index's answers
(rebuilt from the recorded parameters) against numpy brute force by argsort, on the
queries it set apart for measuring."""

import numpy as np
import pytest

from tfrs_logq.serving.export import DEFAULT_TARGET_RECALL, resolve_index
from tfrs_logq.serving.served_recall import DEFAULT_K, served_recall, split_queries

KS = (10, 100)


def _embeddings(num_items=900, num_queries=80, dim=8, seed=0):
    """Items in clusters (as trained embeddings are), and queries near them."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(30, dim))
    items = centres[rng.integers(0, 30, num_items)] + 0.3 * rng.normal(size=(num_items, dim))
    queries = centres[rng.integers(0, 30, num_queries)] + rng.normal(size=(num_queries, dim))
    return items.astype(np.float32), queries.astype(np.float32)


def _numpy_recall(found: np.ndarray, items, queries, k: int) -> float:
    """Mean over queries of |found top-k ∩ exact top-k| / k, exact by a full argsort."""
    exact = np.argsort(-(queries @ items.T), axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(f[:k].tolist()) & set(e.tolist())) / k
                          for f, e in zip(found, exact)]))


def test_the_faiss_index_export_builds_and_its_recall_against_numpy_brute_force():
    pytest.importorskip("faiss")
    from tfrs_logq.serving.faiss_index import FaissIndex

    items, queries = _embeddings()
    record = served_recall(items, queries, KS, index="faiss")
    assert record["kind"] == "faiss" and record["history_excluded"] is False
    p = record["parameters"]
    # export's settings: sqrt(n) lists, tuned for --k 100 and --max-k (the catalog here).
    assert p["nlist"] == 30 and [k for k, _ in p["tuned"]] == [DEFAULT_K, len(items)]
    assert record["target_recall"] == DEFAULT_TARGET_RECALL and record["reached"]
    tuning, measured = split_queries(queries)
    assert record["num_queries"] == {"tuning": len(tuning), "measured": len(measured)} == {
        "tuning": 40, "measured": 40}
    rebuilt = FaissIndex.build(items, p)
    for k in KS:
        nprobe = record["settings"][str(k)]["nprobe"]
        assert nprobe == next(n for kk, n in p["tuned"] if kk >= k) and nprobe < p["nlist"]
        found = rebuilt.search(measured, k, nprobe)[0]
        assert record["recall"][str(k)] == pytest.approx(
            _numpy_recall(found, items, measured, k), abs=1e-4)
    assert record["recall"]["100"] < 1.0  # an approximate search: something is missed
    assert "faiss IVF-Flat" in record["description"]


def test_the_scann_index_export_builds_and_its_recall_against_numpy_brute_force():
    pytest.importorskip("scann")  # loads with TensorFlow 2.20 only
    from tfrs_logq.serving.export import build_scann_searcher, search_scann

    items, queries = _embeddings()
    record = served_recall(items, queries, KS, index="scann")
    p = record["parameters"]
    assert record["kind"] == "scann" and p["tree"] is False  # below 20,000 items
    assert [row[0] for row in p["tuned"]] == [DEFAULT_K, len(items)]
    _, measured = split_queries(queries)
    searcher = build_scann_searcher(items, p)
    for k in KS:
        found = search_scann(searcher, measured, k, p)[0].numpy()
        assert record["recall"][str(k)] == pytest.approx(
            _numpy_recall(found, items, measured, k), abs=1e-4)
        assert record["settings"][str(k)]["reorder_factor"] == p["tuned"][0][2]


def test_auto_is_the_index_export_resolves_and_brute_force_is_exact():
    items, queries = _embeddings(num_items=200, num_queries=10)
    assert served_recall(items, queries, KS)["kind"] == resolve_index("auto")
    record = served_recall(items, queries, (10, 100, 1000), index="brute-force")
    # 1000 is beyond the catalog: not measured.
    assert record["kind"] == "brute-force" and record["parameters"] is None
    assert record["recall"] == {"10": 1.0, "100": 1.0}


@pytest.mark.parametrize("items, queries, ks, match", [
    (np.zeros((50, 4)), np.zeros((3, 4)), KS, "at least 4 queries"),
    (np.zeros((50, 4)), np.zeros((8, 5)), KS, "must be"),
    (np.zeros((50, 4)), np.zeros((8, 4)), (100,), r"a k in \[1, 50\]"),
])
def test_bad_input_is_one_line(items, queries, ks, match):
    with pytest.raises(ValueError, match=match) as error:
        served_recall(items, queries, ks, index="brute-force")
    assert "\n" not in str(error.value)


def test_the_split_is_seeded_disjoint_and_at_most_half_tunes():
    queries = np.arange(30, dtype=np.float32)[:, None]
    tuning, measured = split_queries(queries, tuning_queries=1000, seed=3)
    assert len(tuning) == 15 and len(measured) == 15
    assert sorted(np.concatenate([tuning, measured])[:, 0].tolist()) == list(range(30))
    again, _ = split_queries(queries, tuning_queries=1000, seed=3)
    assert np.array_equal(tuning, again)
    assert len(split_queries(queries, tuning_queries=4)[0]) == 4
