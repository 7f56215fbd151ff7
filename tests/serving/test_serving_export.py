"""serving/export.py with the model the serving tests train: TF Serving's layout and
atomic versions, ScaNN equal to brute force and to the exact ranking, and an export
that loads in a fresh process with only TensorFlow and ScaNN (the rest of the export
tests, brute-force only, are in test_export.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _histories

from tfrs_logq.serving.export import export, load_trained, scann_parameters


def test_export_layout_assets_and_atomic_versions(trained, exports):
    for index, path in exports["paths"].items():
        assert os.path.basename(path) == "1"
        meta = json.load(open(os.path.join(path, "assets", "export.json")))
        assert meta["index"] == index and meta["history_dtype"] == "int64"
        assert meta["max_length"] == 30 and meta["padding"] == 0
        siblings = os.listdir(os.path.dirname(path))
        assert siblings == ["1"]  # no temporary directory left behind
    second = export(trained["model_dir"], str(exports["base"]), "brute_force",
                    index="brute-force", default_k=10)
    assert os.path.basename(second) == "2"
    with pytest.raises(FileExistsError):
        export(trained["model_dir"], str(exports["base"]), "brute_force", version=2,
               index="brute-force")
    assert scann_parameters(1_000_000, 100)["tree"] and not scann_parameters(5000, 100)["tree"]
    for n in (20_000, 25_000, 1_000_000, 10_000_000):  # untuned: 1/20 of sqrt(n) leaves
        p = scann_parameters(n, 100)
        assert p["num_leaves"] == round(n ** 0.5)
        assert p["num_leaves_to_search"] == p["num_leaves"] // 20
    assert scann_parameters(1_000_000, 100, 0.2)["num_leaves_to_search"] == 200
    assert scann_parameters(1_000_000, 100, 1.0)["num_leaves_to_search"] == 1000
    assert scann_parameters(1_000_000, 100, 1e-9)["num_leaves_to_search"] == 1
    # Reordering: 10 n for a search of n, at least 500; k and max_k (at least k, at most
    # the catalog) are the ks tuning is for.
    p = scann_parameters(1_000_000, 100, max_k=1000)
    assert (p["reorder"], p["reorder_factor"], p["k"], p["max_k"]) == (500, 10, 100, 1000)
    assert scann_parameters(300, 10, max_k=1000)["max_k"] == 300
    assert scann_parameters(1_000_000, 2000, max_k=1000)["max_k"] == 2000
    for bad in (0.0, -0.1, 1.01):
        with pytest.raises(ValueError, match="`search_fraction` must be in"):
            scann_parameters(1_000_000, 100, bad)


def test_scann_equals_brute_force_and_both_equal_exact_ranking(trained, exports):
    encoder, config, raw_ids = load_trained(trained["model_dir"])
    loaded = {i: tf.saved_model.load(p) for i, p in exports["paths"].items()}
    h = tf.constant(_histories())
    outs = {i: m.signatures["top_k"](history=h, k=tf.constant(8),
                                     exclude_history=tf.constant(False))
            for i, m in loaded.items()}
    np.testing.assert_array_equal(outs["scann"]["item_ids"], outs["brute-force"]["item_ids"])
    np.testing.assert_allclose(outs["scann"]["scores"], outs["brute-force"]["scores"], rtol=1e-4)
    # Reference: map raw -> internal ids, right-align, encode, exact dot products.
    lookup = {int(r): i + 1 for i, r in enumerate(raw_ids)}
    aligned = np.zeros((3, config["max_length"]), np.int32)
    for row, hist in enumerate(_histories()):
        ids = [lookup[x] for x in hist if x in lookup]
        aligned[row, config["max_length"] - len(ids):] = ids
    q = encoder.last_query(aligned).numpy()
    scores = q @ encoder.item_embeddings().numpy()[1:].T
    top = np.argsort(-scores, axis=1)[:, :8]
    np.testing.assert_array_equal(outs["brute-force"]["item_ids"].numpy(), raw_ids[top])
    emb = loaded["scann"].signatures["query_embedding"](history=h)["query_embedding"]
    np.testing.assert_allclose(emb.numpy(), q, rtol=1e-4, atol=1e-5)


def _tree_params(num_items: int, leaves: int, searched: int, k: int,
                 reorder: int = 0) -> dict:
    return {"tree": True, "num_leaves": leaves, "num_leaves_to_search": searched,
            "training_sample_size": num_items, "dims_per_block": 2,
            "anisotropic_threshold": 0.2, "reorder": reorder or k, "k": k, "max_k": k}


def test_search_scann_never_pads_when_the_searched_leaves_hold_fewer_than_n():
    from tfrs_logq.serving.export import build_scann_searcher, search_scann

    rng = np.random.default_rng(0)
    items = rng.normal(size=(25_000, 16)).astype(np.float32)
    queries = rng.normal(size=(32, 16)).astype(np.float32)
    # 1 of 316 leaves holds about 80 items: fewer than the 1,000 asked for.
    params = _tree_params(25_000, 316, 1, 1000, reorder=10_000)
    searcher = build_scann_searcher(items, params)
    raw, raw_scores = searcher.search_batched(queries, final_num_neighbors=1000,
                                              pre_reorder_num_neighbors=1000)
    assert np.isnan(raw_scores.numpy()).any()
    assert (raw.numpy() == 0).sum(axis=1).max() > 1  # ScaNN's padding: id 0 repeated
    ids, scores = search_scann(searcher, queries, 1000, params)
    ids, scores = ids.numpy(), scores.numpy()
    assert ids.dtype == np.int64 and ids.shape == (32, 1000) and np.isfinite(scores).all()
    assert all(len(set(row)) == 1000 for row in ids)
    exact = queries @ items.T
    np.testing.assert_allclose(scores, np.take_along_axis(exact, ids, 1), rtol=1e-4, atol=1e-4)
    best = np.argsort(-exact, axis=1)[:, :1000]
    overlap = np.mean([len(set(a) & set(b)) / 1000 for a, b in zip(ids, best)])
    assert overlap > 0.99, overlap  # every leaf searched, 10,000 reordered exactly
    # Enough leaves: one search, ScaNN's own answer.
    wide = _tree_params(25_000, 316, 316, 100)
    searcher = build_scann_searcher(items, wide)
    ids, scores = search_scann(searcher, queries, 100, wide)
    direct, _ = searcher.search_batched(queries, final_num_neighbors=100,
                                        pre_reorder_num_neighbors=100)
    np.testing.assert_array_equal(ids.numpy(), direct.numpy())


def test_exported_tree_index_serves_k_distinct_items_when_few_leaves_are_searched(
        trained, tmp_path):
    encoder, config, raw_ids = load_trained(trained["model_dir"])
    n = len(raw_ids)
    path = export(trained["model_dir"], str(tmp_path), "tree", index="scann", default_k=10,
                  scann_params=_tree_params(n, 8, 1, 10))
    brute = export(trained["model_dir"], str(tmp_path), "brute", index="brute-force")
    h, k = tf.constant(_histories()), tf.constant(n - 2)
    outs = [tf.saved_model.load(p).signatures["top_k"](history=h, k=k,
                                                       exclude_history=tf.constant(False))
            for p in (path, brute)]
    ids, scores = outs[0]["item_ids"].numpy(), outs[0]["scores"].numpy()
    assert ids.shape == (3, n - 2) and np.isfinite(scores).all()
    assert all(len(set(row)) == n - 2 for row in ids)  # no padded, repeated first item
    np.testing.assert_array_equal(ids[:, :5], outs[1]["item_ids"].numpy()[:, :5])
    np.testing.assert_allclose(scores[:, :5], outs[1]["scores"].numpy()[:, :5], rtol=1e-4)


FRESH = r"""
import sys, json
import numpy as np
import tensorflow as tf
import scann  # registers the ScaNN ops
m = tf.saved_model.load(sys.argv[1])
out = m.signatures["serving_default"](history=tf.constant([[101, 102, 0]], tf.int64))
assert not any(name.startswith("tfrs_logq") for name in sys.modules), "project code imported"
print(json.dumps(out["item_ids"].numpy().tolist()))
"""


@pytest.mark.parametrize("index", ["brute-force", "scann"])
def test_export_loads_in_fresh_process_with_only_tensorflow_and_scann(exports, index):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = subprocess.run([sys.executable, "-c", FRESH, exports["paths"][index]],
                          capture_output=True, text=True, timeout=300, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout.strip().splitlines()[-1])[0]) == 10


# --- the index measures itself ----------------------------------------------------


def _hard_catalog(n=20_000, d=16, queries=400, seed=0):
    """Clustered items with spread norms: the exact top-k of a query spans many leaves, so
    1/20 of them keeps about half of it (as on the study's trained 1M-item models)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(200, d)).astype(np.float32)

    def draw(m):
        x = centers[rng.integers(0, 200, m)] + rng.normal(size=(m, d)).astype(np.float32)
        return (x * np.exp(0.5 * rng.normal(size=(m, 1)))).astype(np.float32)
    return draw(n), draw(queries)


def _numpy_recall(ids, queries, items, k):
    """recall@k of ``ids`` against a full numpy argsort (the test's own reference)."""
    exact = np.argsort(-(queries @ items.T), axis=1, kind="stable")[:, :k]
    return np.mean([len(set(a[:k]) & set(b)) / k for a, b in zip(ids, exact)])


def test_exact_top_k_and_recall_at_k_match_numpy():
    from tfrs_logq.serving.scann_tuning import exact_top_k, recall_at_k

    items, queries = _hard_catalog(n=3000, queries=130)
    top = exact_top_k(queries, items, 50, batch_size=16)  # several batches, a short last one
    np.testing.assert_array_equal(
        top, np.argsort(-(queries @ items.T), axis=1, kind="stable")[:, :50])
    exact = np.array([[0, 1, 2], [3, 4, 5]])
    assert recall_at_k(np.array([[2, 9, 0, 1], [7, 8, 9, 3]]), exact) == pytest.approx(
        (2 / 3 + 0 / 3) / 2)  # only the first k columns count
    assert recall_at_k(np.array([[0, 0, 0], [3, 4, 5]]), exact) == pytest.approx((1 / 3 + 1) / 2)
    with pytest.raises(ValueError, match="`found` must be"):
        recall_at_k(np.array([[0, 1]]), exact)
    with pytest.raises(ValueError, match="`k` must be in"):
        exact_top_k(queries, items, 3001)


def test_search_scann_takes_the_settings_tuned_for_the_smallest_tuned_k_at_least_n():
    from tfrs_logq.serving.export import search_settings

    params = {"tree": True, "tuned": [[10, 3, 10], [100, 7, 20]], "num_leaves_to_search": 99,
              "reorder_factor": 10}
    found = [tuple(int(x) for x in search_settings(n, params)) for n in (1, 10, 11, 100, 5000)]
    assert found == [(3, 10), (3, 10), (7, 20), (7, 20), (7, 20)]
    assert search_settings(10, {**params, "tuned": None}) == (99, 10)  # untuned: params' own
    leaves, factor = search_settings(50, {**params, "tree": False})
    assert leaves is None and int(factor) == 20


def test_tune_scann_reaches_the_target_and_reports_recall_measured_against_numpy():
    from tfrs_logq.serving.export import build_scann_searcher, scann_parameters, tune_scann

    items, queries = _hard_catalog()
    params = scann_parameters(len(items), 10, max_k=100)  # 141 leaves, 7 searched untuned
    searcher = build_scann_searcher(items, params)
    tuned, report = tune_scann(searcher, items, queries, params, target_recall=0.95)
    held_out = queries[200:]
    assert report["reached"] and report["num_queries"] == {"tuning": 200, "held_out": 200}
    assert tuned["tuned"] == report["tuned"]
    (k1, l1, f1), (k2, l2, f2) = tuned["tuned"]
    assert (k1, k2) == (10, 100) and 7 < l1 <= 141 and 7 < l2 <= 141
    assert tuned["num_leaves_to_search"] == l2 and f1 >= 10 and f2 >= 10
    for k, leaves, factor in tuned["tuned"]:
        # The reported recall is what the settings keep, searched directly, against numpy.
        ids, _ = searcher.search_batched(held_out, final_num_neighbors=k,
                                         pre_reorder_num_neighbors=max(factor * k, 500),
                                         leaves_to_search=leaves)
        assert report["recall"][str(k)] == pytest.approx(
            _numpy_recall(ids.numpy(), held_out, items, k), abs=1e-4)
        assert report["recall"][str(k)] > 0.93  # held out: the target within sampling noise
        assert report["tuning_recall"][str(k)] >= 0.95
        # The fewest leaves measured to reach it at that factor: fewer fell short.
        assert all(r < 0.95 for leaves_tried, f, r in report["curve"][str(k)]
                   if f == factor and leaves_tried < leaves)
    # The untuned 1/20 of the leaves keeps much less: that is what tuning fixes.
    _, fixed = tune_scann(searcher, items, queries, params, target_recall=0.95, tune=False)
    assert fixed["tuned"] == [[10, 7, 10], [100, 7, 10]] and fixed["recall"]["100"] < 0.8
    assert not fixed["reached"]


def test_an_unreachable_target_warns_in_one_line_per_k(caplog, monkeypatch):
    import logging

    from tfrs_logq.serving import export as export_lib

    items, queries = _hard_catalog(n=20_000, queries=200)
    # Little slack in the reordering (k, then at most 2 k): hashing errors cost recall
    # even with every leaf searched.
    monkeypatch.setattr(export_lib, "MAX_REORDER_FACTOR", 2)
    params = {**_tree_params(len(items), 141, 7, 100, reorder=100), "reorder_factor": 1}
    searcher = export_lib.build_scann_searcher(items, params)
    with caplog.at_level(logging.WARNING, logger="tfrs_logq.serving.export"):
        tuned, report = export_lib.tune_scann(searcher, items, queries, params,
                                              target_recall=0.99)
    assert not report["reached"] and tuned["tuned"] == [[100, 141, 2]]
    # Every leaf at factor 1, then 2; below the target both times, so no leaf search.
    assert [row[:2] for row in report["curve"]["100"]] == [[141, 1], [141, 2]]
    assert all(row[2] < 0.99 for row in report["curve"]["100"])
    lines = [r.getMessage() for r in caplog.records if "--target-recall" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "top-100 with every leaf searched and 2 x k reordered" in lines[0]
    assert "--index brute-force" in lines[0]
    with pytest.raises(ValueError, match="`target_recall` must be in"):
        export_lib.tune_scann(searcher, items, queries, params, target_recall=0.0)


def test_a_tuned_export_serves_with_the_tuned_leaves_and_records_them(tmp_path):
    from scann import scann_ops

    from tfrs_logq.sasrec.models import SASRecEncoder
    from tfrs_logq.serving.export import RetrievalModule, export_version, search_scann

    items, _ = _hard_catalog(n=20_000)
    encoder = SASRecEncoder(len(items) + 1, 5, 16, 1, 1, 0.0)
    encoder(tf.zeros([1, 5], tf.int32))
    encoder.item_embeddings().assign(np.vstack([np.zeros((1, 16), np.float32), items]))
    rng = np.random.default_rng(1)
    histories = rng.integers(1, len(items) + 1, (300, 5))
    queries = encoder.last_query(histories.astype(np.int32)).numpy()
    module = RetrievalModule(encoder, np.arange(1, len(items) + 1), "scann", default_k=10,
                             max_k=100, tuning_queries=queries, queries_source="test users")
    path = export_version("", str(tmp_path), index="scann", module=module)
    meta = json.load(open(os.path.join(path, "assets", "export.json")))
    assert meta["scann_tuning"]["queries"] == "test users"
    assert meta["scann"]["tuned"] == meta["scann_tuning"]["tuned"] == \
        module.scann_params["tuned"]
    assert set(meta["scann_tuning"]["recall"]) == {"10", "100"}
    # The served top_k searches as tuned: the same ids as the searcher at the tuned leaves.
    loaded = tf.saved_model.load(path)
    searcher = scann_ops.searcher_from_module(module.scann_index)
    h = histories[:16]
    for k in (10, 100):
        served = loaded.signatures["top_k"](history=tf.constant(h, tf.int64),
                                            k=tf.constant(k), exclude_history=tf.constant(False))
        ids, _ = search_scann(searcher, queries[:16], k, module.scann_params)
        np.testing.assert_array_equal(served["item_ids"].numpy(), ids.numpy() + 1)
