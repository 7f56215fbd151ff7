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
