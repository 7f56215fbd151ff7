"""keras_logq under `keras.distribution.DataParallel` on JAX: 4 host CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``, which must be set before JAX is
imported, so `data_parallel_worker.py` runs in a process of its own).

DataParallel shards the arrays over the batch axis but the computation is the global
batch's: every query sees every row's candidate as a negative, the accidental hits in other
devices' rows included. So for every correction the loss, its gradient and the weights that
``model.fit`` trains are the single-device ones on the same global batch, to float rounding,
and the loss is the numpy reference of the paper's formula (test_retrieval's)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import BACKEND

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "data_parallel_worker.py")
DEVICES = 4
TIMEOUT_S = 240  # about 30 s on 2 CPU cores
CORRECTIONS = ("none", "logq-tfrs", "logq-official", "corrected")
FITS = CORRECTIONS + ("compiled_loss",)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    if BACKEND != "jax":
        pytest.skip(f"DataParallel over host devices is tested on the JAX backend only "
                    f"(XLA_FLAGS); this run's backend is {BACKEND}")
    path = str(tmp_path_factory.mktemp("data_parallel") / "results.npz")
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                   os.environ.get("XLA_FLAGS", ""))
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip(),
               PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, WORKER, path], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with open(path + ".json") as f:
        info = json.load(f)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    return info, arrays


def _is_sharded(seen, shape) -> bool:
    return (seen["devices"] == DEVICES and not seen["replicated"]
            and seen["shard_shape"] == [shape[0] // DEVICES] + list(shape[1:]))


def test_four_devices_and_the_batch_sharded_over_them(worker):
    info, arrays = worker
    assert info["backend"] == "jax"
    assert info["platforms"] == ["cpu"] * DEVICES, info["devices"]
    assert len(info["keras_devices"]) == DEVICES and info["mesh"] == f"({DEVICES},)"
    b = arrays["scores"].shape[0]
    for name, value in info["inputs"].items():
        assert _is_sharded(value, arrays[name].shape), (name, value)
    # Inside the jit-compiled loss and fit steps (jax.debug.inspect_array_sharding): the
    # rows on 4 devices under DataParallel, on one without it.
    for c in CORRECTIONS:
        assert info["sharded_seen"][f"loss_scores_{c}"], c
        for seen in info["sharded_seen"][f"loss_scores_{c}"]:
            assert _is_sharded(seen, (b, b)), (c, seen)
        for seen in info["single_seen"][f"loss_scores_{c}"]:
            assert seen["devices"] == 1, (c, seen)
    for kind in FITS:
        assert info["sharded_seen"][f"fit_users_{kind}"], kind
        for seen in info["sharded_seen"][f"fit_users_{kind}"]:
            assert _is_sharded(seen, (b,)), (kind, seen)
        for seen in info["single_seen"][f"fit_users_{kind}"]:
            assert seen["devices"] == 1, (kind, seen)
        # The trained variables (and ItemFrequency's counts): replicated on the 4 devices.
        for name, seen in info["variables"][f"sharded_{kind}"].items():
            assert seen["devices"] == DEVICES and seen["replicated"], (kind, name, seen)


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_sharded_loss_and_gradient_equal_one_device_and_the_reference(worker, correction):
    from test_retrieval import reference_layer

    _, a = worker
    scores, log_q, ids = a["scores"].astype(np.float64), a["log_q"].astype(np.float64), a["ids"]
    for what in ("loss", "mean", "grad"):
        np.testing.assert_allclose(a[f"sharded_{what}_{correction}"],
                                   a[f"single_{what}_{correction}"], rtol=1e-5, atol=1e-6,
                                   err_msg=what)
    ref, ref_grad = reference_layer(scores, ids, log_q, correction)
    np.testing.assert_allclose(a[f"sharded_loss_{correction}"], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[f"sharded_mean_{correction}"], ref.mean(), rtol=1e-5)
    np.testing.assert_allclose(a[f"sharded_grad_{correction}"], ref_grad, rtol=1e-4, atol=1e-6)
    # Not each device's 4 rows with only their own candidates: that loss is another one.
    b = len(ids)
    local = np.concatenate([
        reference_layer(scores[r:r + b // DEVICES, r:r + b // DEVICES],
                        ids[r:r + b // DEVICES], log_q[r:r + b // DEVICES], correction)[0]
        for r in range(0, b, b // DEVICES)])
    assert np.abs(local - ref).max() > 0.1
    # Every row has negatives on the other devices, an accidental hit there in some rows.
    assert (np.abs(ref_grad[:4, 4:]) > 0).any()
    hits = [(r, j) for r in range(b) for j in range(b)
            if j // (b // DEVICES) != r // (b // DEVICES) and ids[j] == ids[r]]
    assert hits and all(a[f"sharded_grad_{correction}"][r, j] == 0.0 for r, j in hits)


@pytest.mark.parametrize("kind", FITS)
def test_model_fit_under_data_parallel_trains_the_one_device_weights(worker, kind):
    _, a = worker
    for name in ("user", "item", "loss") + (("counts",) if kind != "compiled_loss" else ()):
        np.testing.assert_allclose(a[f"sharded_fit_{kind}_{name}"], a[f"single_fit_{kind}_{name}"],
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    # The steps trained (each weight matrix moved far beyond the tolerance) and the loss fell.
    for name, start in (("user", a["user0"]), ("item", a["item0"])):
        assert np.abs(a[f"sharded_fit_{kind}_{name}"] - start).max() > 1e-2, name
    loss = a[f"sharded_fit_{kind}_loss"]
    assert np.isfinite(loss).all() and loss[-1] < loss[0]
    if kind != "compiled_loss":
        # ItemFrequency counted the global batches, once each (not one shard, nor 4 copies).
        expected = np.bincount(a["train_items"], minlength=a[f"sharded_fit_{kind}_counts"].size)
        np.testing.assert_array_equal(a[f"sharded_fit_{kind}_counts"], expected * a["epochs"])
