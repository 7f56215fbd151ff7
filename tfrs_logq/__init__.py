"""tfrs-logq: the corrected logQ correction of sampled softmax for TFRS retrieval.

Importing this package selects Keras 2 (``tf-keras``) for TensorFlow, which
TensorFlow Recommenders requires. That only works if TensorFlow has not been
imported yet with Keras 3; in that case an ImportError says what to do.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

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

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.corrections import CORRECTIONS as CORRECTIONS
    from tfrs_logq.frequency import CountMinSketch as CountMinSketch
    from tfrs_logq.frequency import ExactFrequency as ExactFrequency
    from tfrs_logq.frequency import StreamingFrequency as StreamingFrequency
    from tfrs_logq.lazy_adam import LazyAdam as LazyAdam
    from tfrs_logq.losses import corrected_weight as corrected_weight
    from tfrs_logq.losses import full_softmax_loss as full_softmax_loss
    from tfrs_logq.losses import gbce_loss as gbce_loss
    from tfrs_logq.losses import hard_negative_softmax_loss as hard_negative_softmax_loss
    from tfrs_logq.losses import in_batch_softmax_loss as in_batch_softmax_loss
    from tfrs_logq.losses import sampled_softmax_loss as sampled_softmax_loss
    from tfrs_logq.metrics import popularity_bands as popularity_bands
    from tfrs_logq.metrics import ranks_from_scores as ranks_from_scores
    from tfrs_logq.metrics import recall_ndcg_from_ranks as recall_ndcg_from_ranks
    from tfrs_logq.proposal import excluded_log_q as excluded_log_q
    from tfrs_logq.proposal import inclusion_log_q as inclusion_log_q
    from tfrs_logq.proposal import log_q_from_probability as log_q_from_probability
    from tfrs_logq.proposal import mixture_probability as mixture_probability
    from tfrs_logq.sampling import InBatchSampler as InBatchSampler
    from tfrs_logq.sampling import MixedSampler as MixedSampler
    from tfrs_logq.sampling import SampledNegatives as SampledNegatives
    from tfrs_logq.sampling import UniformSampler as UniformSampler
    from tfrs_logq.studies.compare.model_fn import compare_model as compare_model
    from tfrs_logq.studies.compare.stats import classify as classify
    from tfrs_logq.studies.compare.stats import paired_difference as paired_difference
    from tfrs_logq.tasks import CorrectedRetrieval as CorrectedRetrieval
    from tfrs_logq.two_tower import HistoryQueryTower as HistoryQueryTower
    from tfrs_logq.two_tower import TwoTowerModel as TwoTowerModel
