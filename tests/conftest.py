"""Test set-up: Keras 2 for TFRS, and two logical CPU devices for tf.distribute tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfrs_logq  # noqa: E402,F401  (selects tf-keras before TensorFlow loads)
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
except RuntimeError:  # runtime already initialised by an earlier import
    pass
