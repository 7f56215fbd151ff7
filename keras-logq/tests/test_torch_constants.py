"""PyTorch: the loss makes no tensor from a Python number, and counts negatives from the mask.

Keras's PyTorch backend turns a Python float operand into a tensor with
``torch.as_tensor(value, device=...)``; on a GPU that is a blocking host-to-device copy
inside the step. The layer's constants are filled on the device instead
(`losses.constant_like`). Runs on every backend; the spy only on PyTorch.
"""

import keras
import numpy as np
import pytest
from conftest import BACKEND, to_numpy
from keras_logq import CorrectedRetrieval
from keras_logq import losses

B, C = 6, 10


def _inputs(rng):
    ids = rng.integers(1, 5, size=C).astype("int32")  # few ids: many accidental hits
    probability = rng.uniform(0.01, 0.2, size=C).astype("float32")
    scores = rng.normal(size=(B, C)).astype("float32")
    return scores, ids, probability


@pytest.mark.skipif(BACKEND != "torch", reason="the spy is on torch.as_tensor")
@pytest.mark.parametrize("correction", ["none", "logq", "corrected"])
@pytest.mark.parametrize("reduction", ["sum", "sum_over_batch_size"])
@pytest.mark.parametrize("given", ["probability", "log_probability"])
def test_no_tensor_from_a_python_number(rng, monkeypatch, correction, reduction, given):
    import torch

    scores, ids, probability = _inputs(rng)
    scores = torch.tensor(scores, requires_grad=True)
    ids, probability = torch.tensor(ids), torch.tensor(probability)
    kwargs = ({"candidate_sampling_probability": probability} if given == "probability"
              else {"candidate_log_sampling_probability": torch.log(probability)})
    layer = CorrectedRetrieval(correction=correction, reduction=reduction)
    layer(scores, candidate_ids=ids, **kwargs)  # built before the spy

    made, real = [], torch.as_tensor

    def spy(data, *args, **kw):
        if isinstance(data, (bool, int, float)):
            made.append(data)
        return real(data, *args, **kw)

    monkeypatch.setattr(torch, "as_tensor", spy)
    loss = layer(scores, candidate_ids=ids, **kwargs)
    loss.backward()
    monkeypatch.setattr(torch, "as_tensor", real)
    assert made == [], f"tensors made from Python numbers: {made}"
    assert np.isfinite(to_numpy(loss.detach())).all()


def test_constant_like_dtype_and_value(rng):
    like = keras.ops.convert_to_tensor(rng.normal(size=3).astype("float32"))
    got = losses.constant_like(0.25, like)
    assert keras.backend.standardize_dtype(got.dtype) == "float32"
    assert tuple(keras.ops.shape(got)) == ()
    assert float(to_numpy(got)) == 0.25
    half = losses.constant_like(0.25, like, "float16")
    assert keras.backend.standardize_dtype(half.dtype) == "float16"


def test_count_true_counts_each_row(rng):
    mask = rng.uniform(size=(5, 9)) > 0.4
    mask[0], mask[1] = True, False
    got = to_numpy(losses._count_true(keras.ops.convert_to_tensor(mask)))
    np.testing.assert_array_equal(got, mask.sum(axis=1))
