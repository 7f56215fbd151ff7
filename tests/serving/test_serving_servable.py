"""serving/servable.py: `Servable` leaves the request's history out of the top k by
default, as the exported signatures do."""


import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _histories

from tfrs_logq.serving.export import load_trained


@pytest.mark.parametrize("index", ["brute-force", "scann"])
def test_served_top_k_leaves_out_the_history_by_default(trained, exports, index):
    """serving_default and top_k (exclude_history, default True through the server) never
    return an item of the request's history; with False they equal the exact ranking."""
    from tfrs_logq.serving.server import Servable, ServerOptions

    encoder, config, raw_ids = load_trained(trained["model_dir"])
    path = exports["paths"][index]
    model = tf.saved_model.load(path)
    h = _histories()
    out = model.signatures["serving_default"](history=tf.constant(h))["item_ids"].numpy()
    for row, hist in zip(out, h):
        assert not set(row.tolist()) & set(hist.tolist())
    lookup = {int(r): i + 1 for i, r in enumerate(raw_ids)}
    aligned = np.zeros((3, config["max_length"]), np.int32)
    for row, hist in enumerate(h):
        ids = [lookup[x] for x in hist if x in lookup]
        aligned[row, config["max_length"] - len(ids):] = ids
    scores = encoder.last_query(aligned).numpy() @ encoder.item_embeddings().numpy()[1:].T
    for row, hist in enumerate(h):
        seen = [lookup[x] - 1 for x in hist if x in lookup]
        scores[row, seen] = -np.inf
    np.testing.assert_array_equal(out[:, :5], raw_ids[np.argsort(-scores, axis=1)[:, :5]])
    # Through the server the input may be left out (default True) or set to False.
    servable = Servable(path, 1, ServerOptions(model_name="m", model_base_path=str(path)))
    try:
        default = servable.run(servable.validate("top_k", {"history": h, "k": 6}))
        kept = servable.run(servable.validate("top_k", {"history": h, "k": 6,
                                                        "exclude_history": False}))
    finally:
        servable.close()
    assert all(not set(r.tolist()) & set(x.tolist()) for r, x in zip(default["item_ids"], h))
    assert any(set(r.tolist()) & set(x.tolist()) for r, x in zip(kept["item_ids"], h))
