"""Test set-up: Keras 2 for TFRS, two logical CPU devices for tf.distribute tests, and
fixtures shared by several test files: the fake data, and the smoke-preset runs trained once
per test run."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # TFRS needs Keras 2; tfrs_logq sets it too
# A scheduler's array index would split every comparison the tests run (compare's run share).
for _name in ("JOB_COMPLETION_INDEX", "TFRS_LOGQ_RUN_COUNT", "SLURM_ARRAY_TASK_ID",
              "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
              "SLURM_ARRAY_TASK_STEP", "TF_CONFIG"):
    os.environ.pop(_name, None)

import tensorflow as tf  # noqa: E402

import tfrs_logq  # noqa: E402,F401

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
except RuntimeError:  # runtime already initialised by an earlier import
    pass

import pytest  # noqa: E402
from pipeline_data import write_ratings  # noqa: E402

from tfrs_logq.sasrec import native  # noqa: E402

# One kernel cache for the whole test run, subprocesses included: many tests point
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
        from tfrs_logq._util.strategy import make_strategy

        # The package's own instance: the trainers' --strategy mirrored gets this one too.
        _STRATEGY = make_strategy("mirrored")
        assert _STRATEGY.num_replicas_in_sync == 2, "conftest should have made two CPUs"
    return _STRATEGY


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A small MovieLens-1M ratings.dat for training runs (test_training, test_run_directory):
    60 users in 4 clusters of taste, 8 to 19 ratings each."""
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "cache"))
    return write_ratings(tmp_path / "data", users=60, items=40, per_user=(8, 20), first_item=1,
                         zipf=1.5, rating=5, clusters=4, jitter=True)


def _train_smoke(root, data, name, **overrides):
    from tfrs_logq.sasrec.training import resolve_config, train

    # One length bucket: the preset's 8 trace 8 copies of the blocks, most of a small run's
    # time; buckets change the speed only (tests/sasrec/test_training.py).
    config = resolve_config("smoke", split="loo", data_dir=data, length_buckets=1, **overrides)
    model_dir = str(root / name)
    train(config, model_dir, verbose=0)
    return model_dir


# The smoke-preset runs that several files read, each trained once per test run however many
# of those files run: the training is most of their cost. Each sets the data cache for the
# rest of the test run (as the module fixtures they replace did).
@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """Two runs that differ only in their seed (inbatch-corrected, one epoch, on a 40-user
    log of raw items 100..129): ``{"root", "data", 0: model_dir, 1: model_dir}``. Read by
    test_export.py (fingerprints, name checks, batching) and test_tf_versions.py."""
    root = tmp_path_factory.mktemp("smoke_runs")
    os.environ["TFRS_LOGQ_CACHE_DIR"] = str(root / "cache")
    data = write_ratings(root / "data")
    out = {"root": root, "data": data}
    for seed in (0, 1):
        out[seed] = _train_smoke(root, data, f"model{seed}", loss="inbatch-corrected",
                                 max_epochs=1, seed=seed)
    return out


# The serving tests' model, its exports and a server on them (tests/serving/), once per
# test run however many of those files run. Imports are in the fixtures: the serving extras
# (grpc, tensorflow-serving-api) are not needed elsewhere.
@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """mns-corrected, two epochs, on a 60-user log of raw items 100..139."""
    root = tmp_path_factory.mktemp("serving")
    os.environ["TFRS_LOGQ_CACHE_DIR"] = str(root / "cache")
    data = write_ratings(root / "data", users=60, items=40, per_user=(8, 16))
    model_dir = _train_smoke(root, data, "model", loss="mns-corrected", max_epochs=2)
    return {"root": root, "model_dir": model_dir, "data": data}


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
