"""tfrs-logq: the corrected logQ correction of sampled softmax for TFRS retrieval.

Importing this package selects Keras 2 (``tf-keras``) for TensorFlow, which
TensorFlow Recommenders requires. That only works if TensorFlow has not been
imported yet with Keras 3; in that case an ImportError says what to do.
"""

from __future__ import annotations

import os
import sys

from tfrs_logq._version import __version__  # noqa: F401 (in __all__, through _api.exports)


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

# The public names (tfrs_logq._api.PUBLIC, docs/api.md) are imported on first use (PEP 562),
# so that `import tfrs_logq` and the command line's --help do not pay for TensorFlow.
from tfrs_logq import _api  # noqa: E402

__all__, __getattr__, __dir__ = _api.exports(__name__, extra=("__version__",))
