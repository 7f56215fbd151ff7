"""The loss's constants: made on the device, in the loss's dtype; the reductions' divisions.

Keras's PyTorch backend turns a Python float operand into a tensor with
``torch.as_tensor(value, device=...)``; on a GPU that is a blocking host-to-device copy
inside the step. The layer's constants are filled on the device instead
(`losses.constant_like`), in the compute dtype (float64 stays float64), and the
negatives are counted from the bool mask (`losses._count_true`). The spy runs on
PyTorch only; the rest on every backend.
"""

import keras
import numpy as np
import pytest
from conftest import BACKEND, to_numpy

from keras_logq import CorrectedRetrieval, losses

B, C = 6, 10


def _inputs(rng):
    ids = rng.integers(1, 5, size=C).astype("int32")  # few ids: many accidental hits
    probability = rng.uniform(0.01, 0.2, size=C).astype("float32")
    scores = rng.normal(size=(B, C)).astype("float32")
    return scores, ids, probability


@pytest.mark.skipif(BACKEND != "torch", reason="the spy is on torch.as_tensor")
@pytest.mark.parametrize("correction", ["none", "logq-tfrs", "logq-official", "corrected"])
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


def _float64_available() -> bool:
    if BACKEND != "jax":
        return True
    import jax

    return bool(jax.config.jax_enable_x64)


@pytest.mark.skipif(not _float64_available(), reason="JAX without x64 has no float64")
def test_float64_corrected_with_q_of_one_matches_the_reference(rng):
    """float64 end to end: the masked value and the clip of ``Q(p)`` near 1 are float64
    constants (TensorFlow rounded them through float32 and overflowed; PyTorch's
    `minimum` of two float64s returned float32)."""
    import reference

    b, c = 4, 10
    scores = rng.normal(size=(b, c))
    ids = np.arange(1, c + 1)
    q = rng.uniform(0.01, 0.1, size=c)
    q[0] = 1.0  # row 0's positive: Q(p) clipped to 1 - 1e-6
    log_q = losses.resolve_log_q(q, dtype="float64")
    got = to_numpy(losses.retrieval_loss(keras.ops.convert_to_tensor(scores),
                                         correction="corrected", log_q=log_q,
                                         candidate_ids=ids))
    assert got.dtype == np.float64
    log_q_prime = np.log(q)[None, :] - np.log1p(-np.minimum(q[:b], 1 - 1e-6))[:, None]
    mask = ~np.eye(b, c, dtype=bool)
    want = reference.loss_corrected(scores[np.arange(b), np.arange(b)], scores,
                                    np.broadcast_to(log_q_prime, (b, c)), mask)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_mean_with_zero_sample_weights_is_zero(rng, dtype):
    """As Keras's own losses: weights summing to 0 give 0, not 0 / 0 (a 1e-12 floor is 0
    in float16)."""
    from keras_logq import CorrectedRetrievalLoss

    scores, ids, probability = _inputs(rng)
    loss_fn = CorrectedRetrievalLoss(reduction="mean_with_sample_weight", dtype=dtype)
    y_true = {"candidate_ids": ids, "candidate_sampling_probability": probability}
    got = float(to_numpy(loss_fn(y_true, scores, sample_weight=np.zeros(B, "float32"))))
    assert got == 0.0
    weights = np.zeros(B, "float32")
    weights[1] = 2.0
    per_row = to_numpy(CorrectedRetrievalLoss(reduction="none", dtype=dtype)(y_true, scores))
    got = float(to_numpy(loss_fn(y_true, scores, sample_weight=weights)))
    np.testing.assert_allclose(got, float(per_row[1]), rtol=2e-3)
