"""tfrs-logq: the corrected logQ correction of sampled softmax for TFRS retrieval.

Importing this package selects Keras 2 (``tf-keras``) for TensorFlow, which
TensorFlow Recommenders requires. That only works if TensorFlow has not been
imported yet with Keras 3; in that case an ImportError says what to do.
"""

from __future__ import annotations

import os
import sys

from tfrs_logq._version import __version__


def _select_legacy_keras() -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    if "tensorflow" in sys.modules:
        # TensorFlow resolves `tf.keras` lazily, on first access: if nothing has
        # touched it yet, the variable set above still selects tf-keras.
        import tensorflow as _tf

        version = str(getattr(_tf.keras, "__version__", "2"))
        if not version.startswith("2"):
            raise ImportError(
                "tfrs_logq needs Keras 2 (tf-keras) but TensorFlow was already imported "
                f"with Keras {version}. Import tfrs_logq before tensorflow, or set the "
                "environment variable TF_USE_LEGACY_KERAS=1 before Python starts "
                "(export TF_USE_LEGACY_KERAS=1)."
            )


_select_legacy_keras()

# The public names are imported on first use (PEP 562), so that `import tfrs_logq`
# and the command line's --help do not pay for importing TensorFlow.
_LAZY = {
    "CountMinSketch": "tfrs_logq.frequency",
    "ExactFrequency": "tfrs_logq.frequency",
    "StreamingFrequency": "tfrs_logq.frequency",
    "CORRECTIONS": "tfrs_logq.losses",
    "sampled_softmax_loss": "tfrs_logq.losses",
    "InBatchSampler": "tfrs_logq.sampling",
    "MixedSampler": "tfrs_logq.sampling",
    "SampledNegatives": "tfrs_logq.sampling",
    "UniformSampler": "tfrs_logq.sampling",
    "CorrectedRetrieval": "tfrs_logq.tasks",
}
_SUBMODULES = ("frequency", "losses", "sampling", "tasks")


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"tfrs_logq.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfrs_logq' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


__all__ = [
    "CORRECTIONS",
    "CorrectedRetrieval",
    "CountMinSketch",
    "ExactFrequency",
    "InBatchSampler",
    "MixedSampler",
    "SampledNegatives",
    "StreamingFrequency",
    "UniformSampler",
    "__version__",
    "frequency",
    "losses",
    "sampled_softmax_loss",
    "sampling",
    "tasks",
]
