"""Test set-up: Keras 2 for TFRS, two logical CPU devices for tf.distribute tests, and
fixtures shared by several test files."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # TFRS needs Keras 2; tfrs_logq sets it too

import tensorflow as tf  # noqa: E402

import tfrs_logq  # noqa: E402,F401

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
except RuntimeError:  # runtime already initialised by an earlier import
    pass

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfrs_logq import native  # noqa: E402

# One kernel cache for the whole session, subprocesses included: many tests point
# TFRS_LOGQ_CACHE_DIR at a temporary directory (the data cache), and the kernels would
# otherwise follow it and be compiled again (about 50 s) in each of them.
os.environ.setdefault(native.CACHE_ENV, str(native.cache_dir()))

_STRATEGY = None


@pytest.fixture
def mirrored_strategy():
    """One MirroredStrategy over the two logical CPUs, shared by every test.

    Several MirroredStrategy instances in one process share the collective
    runtime and can collide on collective instance keys; one instance avoids it.
    """
    global _STRATEGY
    if _STRATEGY is None:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
        assert len(devices) == 2, "conftest should have created two logical CPUs"
        _STRATEGY = tf.distribute.MirroredStrategy(devices)
    return _STRATEGY


# A small MovieLens-1M ratings.dat for training runs (test_training, test_run_directory).
def _write_ratings(directory, users=60, items=40, seed=0):
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        favourite = rng.integers(0, 4)
        for k in range(rng.integers(8, 20)):
            item = int((favourite * 10 + rng.zipf(1.5)) % items) + 1
            lines.append(f"{u}::{item}::5::{1_000_000 + k * 1000 + int(rng.integers(0, 999))}\n")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "ratings.dat"), "w") as f:
        f.writelines(lines)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "cache"))
    directory = str(tmp_path / "data")
    _write_ratings(directory)
    return directory


# The serving tests' model, its exports and a server on them (tests/test_serving_*.py),
# once per session however many of those files run: the export, the ScaNN index and the
# server were module fixtures of the one tests/test_serving.py. Imports are in the
# fixtures: the serving extras (grpc, tensorflow-serving-api) are not needed elsewhere.
@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    from tfrs_logq.sasrec.training import resolve_config, train

    root = tmp_path_factory.mktemp("serving")
    os.environ["TFRS_LOGQ_CACHE_DIR"] = str(root / "cache")
    rng = np.random.default_rng(0)
    lines = []
    for u in range(1, 61):
        for k in range(int(rng.integers(8, 16))):
            item = 100 + int(rng.zipf(1.4) % 40)  # raw ids 100..139
            lines.append(f"{u}::{item}::4::{1_000_000 + 1000 * k + u}\n")
    data = root / "data"
    data.mkdir()
    (data / "ratings.dat").write_text("".join(lines))
    config = resolve_config("smoke", loss="mns-corrected", split="loo", data_dir=str(data),
                            max_epochs=2)
    model_dir = str(root / "model")
    train(config, model_dir, verbose=0)
    return {"root": root, "model_dir": model_dir, "data": str(data)}


@pytest.fixture(scope="session")
def exports(trained):
    from tfrs_logq.serving.export import export

    base = trained["root"] / "exports"
    paths = {index: export(trained["model_dir"], str(base), index.replace("-", "_"),
                           index=index, default_k=10)
             for index in ("brute-force", "scann")}
    return {"base": base, "paths": paths}


@pytest.fixture(scope="session")
def server(exports):
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    options = ServerOptions(model_name="ml", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "scann"),
                            file_system_poll_wait_seconds=0.2, max_request_bytes=200_000)
    srv = ModelServer(options).start()
    yield srv
    srv.stop()
