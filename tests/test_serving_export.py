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
    for n in (20_000, 25_000, 1_000_000, 10_000_000):  # the default: 1/20 of the leaves
        p = scann_parameters(n, 100)
        assert p["num_leaves"] == round(2 * n ** 0.5)
        assert p["num_leaves_to_search"] == p["num_leaves"] // 20
    assert scann_parameters(1_000_000, 100, 0.2)["num_leaves_to_search"] == 400
    assert scann_parameters(1_000_000, 100, 1.0)["num_leaves_to_search"] == 2000
    assert scann_parameters(1_000_000, 100, 1e-9)["num_leaves_to_search"] == 1
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
            "anisotropic_threshold": 0.2, "reorder": reorder or k, "k": k}


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
