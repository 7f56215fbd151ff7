"""Test set-up: Keras 2 for TFRS, and two logical CPU devices for tf.distribute tests."""

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
