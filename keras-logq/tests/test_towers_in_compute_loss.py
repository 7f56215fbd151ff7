"""Where a Keras 3 model may embed its candidates: Keras-RS's retrieval examples build the
towers in ``build()`` and embed the candidates in ``compute_loss`` (the candidate ids come
in ``y``). On every backend such a tower trains through ``fit`` with keras_logq's loss
there; a variable *created* inside ``compute_loss`` (a layer first built there) fails on JAX
(a traced value turned into an array) and PyTorch (an optimizer built without it), which
is what docs/keras3.md says."""

import keras
import numpy as np
import pytest
from conftest import BACKEND

import keras_logq

NUM_USERS, NUM_ITEMS, DIM = 40, 30, 8


class RetrievalModel(keras.Model):
    """Keras-RS's example shape: towers built in ``build``, candidates embedded in
    ``compute_loss`` from ``y``'s ids, ``log Q`` from a fixed table."""

    def __init__(self, build_towers: bool):
        super().__init__()
        self.build_towers = build_towers
        self.user_embedding = keras.layers.Embedding(NUM_USERS, DIM)
        self.candidate_embedding = keras.layers.Embedding(NUM_ITEMS, DIM)
        counts = np.arange(1, NUM_ITEMS + 1, dtype="float32")
        self.loss_fn = keras_logq.CorrectedRetrievalLoss(
            item_log_sampling_probability=np.log(counts / counts.sum()))

    def build(self, input_shape):
        if self.build_towers:
            self.user_embedding.build(input_shape)
            self.candidate_embedding.build(input_shape)
        super().build(input_shape)

    def call(self, inputs, training=False):
        return self.user_embedding(inputs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        candidates = self.candidate_embedding(y)
        scores = keras.ops.matmul(y_pred, keras.ops.transpose(candidates))
        return self.loss_fn(y, scores, sample_weight)


def _data():
    rng = np.random.default_rng(0)
    users = rng.integers(0, NUM_USERS, 256).astype("int32")
    return users, ((users * 7) % NUM_ITEMS).astype("int32")


def test_towers_built_before_fit_train_from_compute_loss():
    keras.utils.set_random_seed(0)
    users, items = _data()
    model = RetrievalModel(build_towers=True)
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    model.build((None,))
    before = np.array(keras.ops.convert_to_numpy(model.candidate_embedding.embeddings))
    history = model.fit(users, items, batch_size=32, epochs=3, shuffle=False, verbose=0)
    after = np.array(keras.ops.convert_to_numpy(model.candidate_embedding.embeddings))
    assert len(model.trainable_variables) == 2
    assert not np.allclose(before, after)  # the candidate tower trained
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow's tf.function tracks them")
def test_a_variable_created_inside_compute_loss_does_not_train_on_jax_and_torch():
    """PyTorch refuses the step (the optimizer was built without the variable); JAX creates
    it inside the traced step, so `fit` runs but the variable holds a leaked tracer:
    reading it fails."""
    users, items = _data()
    model = RetrievalModel(build_towers=False)
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    try:
        model.fit(users, items, batch_size=32, epochs=1, verbose=0)
        np.asarray(keras.ops.convert_to_numpy(model.candidate_embedding.embeddings))
    except Exception as error:  # noqa: BLE001 (the backends say it differently)
        assert type(error).__name__ in ("TracerArrayConversionError", "ValueError",
                                        "KeyError"), repr(error)
        return
    pytest.fail(f"a candidate table created in compute_loss trained on {BACKEND}")
