"""`ItemFrequency`: counts against numpy, updates under `model.fit`, saved with the model."""

import json

import keras
import numpy as np
import pytest
from conftest import to_numpy
from keras_logq import ItemFrequency


def test_update_and_log_q_match_numpy():
    frequency = ItemFrequency(8, min_count=0.5)
    seen = np.array([1, 1, 3, 7, 1, 3], "int32")
    out = to_numpy(frequency(seen, training=True))
    counts = np.bincount(seen, minlength=8).astype(float)
    np.testing.assert_array_equal(to_numpy(frequency.counts), counts)
    assert float(to_numpy(frequency.total)) == 6.0
    np.testing.assert_allclose(out, np.log(counts[seen] / 6.0), rtol=1e-6)
    unseen = to_numpy(frequency(np.array([0, 2]), training=False))
    np.testing.assert_allclose(unseen, np.log([0.5 / 6.0] * 2), rtol=1e-6)
    assert float(to_numpy(frequency.total)) == 6.0  # no update without training=True


class CountingModel(keras.Model):
    def __init__(self, num_items, **kwargs):
        super().__init__(**kwargs)
        self.frequency = ItemFrequency(num_items)
        self.embedding = keras.layers.Embedding(num_items, 2)

    def call(self, ids, training=None):
        log_q = self.frequency(ids, training=training)
        return keras.ops.sum(self.embedding(ids), axis=-1) + 0.0 * log_q

    def get_config(self):
        return {"num_items": self.frequency.num_items, **super().get_config()}


def test_counts_update_under_fit_and_are_saved(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 12, size=64).astype("int32")
    model = CountingModel(12)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ids, np.zeros(64, "float32"), batch_size=16, epochs=2, verbose=0)
    expected = 2 * np.bincount(ids, minlength=12)
    np.testing.assert_array_equal(to_numpy(model.frequency.counts), expected)
    assert float(to_numpy(model.frequency.total)) == 128.0
    model.predict(ids, batch_size=16, verbose=0)  # inference does not count
    np.testing.assert_array_equal(to_numpy(model.frequency.counts), expected)
    path = str(tmp_path / "counting.weights.h5")
    model.save_weights(path)
    fresh = CountingModel(12)
    fresh(ids[:4])
    fresh.load_weights(path)
    np.testing.assert_array_equal(to_numpy(fresh.frequency.counts), expected)


def test_config_round_trip_and_errors():
    frequency = ItemFrequency(5, min_count=2.0, name="freq")
    clone = ItemFrequency.from_config(json.loads(json.dumps(frequency.get_config())))
    assert clone.num_items == 5 and clone.min_count == 2.0
    with pytest.raises(ValueError, match="num_items"):
        ItemFrequency(0)
    with pytest.raises(ValueError, match="min_count"):
        ItemFrequency(3, min_count=0)
    with pytest.raises(ValueError, match="counts"):
        frequency.set_counts(np.ones(4))
