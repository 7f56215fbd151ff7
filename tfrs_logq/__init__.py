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

from tfrs_logq import frequency, losses, sampling, tasks  # noqa: E402
from tfrs_logq.frequency import (  # noqa: E402
    CountMinSketch,
    ExactFrequency,
    StreamingFrequency,
)
from tfrs_logq.losses import CORRECTIONS, sampled_softmax_loss  # noqa: E402
from tfrs_logq.sampling import (  # noqa: E402
    InBatchSampler,
    MixedSampler,
    SampledNegatives,
    UniformSampler,
)
from tfrs_logq.tasks import CorrectedRetrieval  # noqa: E402

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
