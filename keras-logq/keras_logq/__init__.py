"""keras-logq: the corrected logQ sampled softmax (Khrylchenko et al., RecSys 2025) for Keras 3.

Runs on JAX, PyTorch and TensorFlow (``KERAS_BACKEND``); needs only ``keras`` and
``numpy``.
"""

from keras_logq import losses
from keras_logq._version import __version__
from keras_logq.frequency import ItemFrequency
from keras_logq.losses import CORRECTIONS, check_log_q, sampled_softmax_loss
from keras_logq.masks import accidental_hit_mask, first_occurrence_mask
from keras_logq.retrieval import CorrectedRetrieval, CorrectedRetrievalLoss, reduce_loss
from keras_logq.sampling import (
    InBatchNegatives,
    MixedNegatives,
    SampledNegatives,
    UniformNegatives,
    batch_log_frequency,
    distinct_in_random_order,
)

__all__ = [
    "CORRECTIONS",
    "CorrectedRetrieval",
    "CorrectedRetrievalLoss",
    "InBatchNegatives",
    "ItemFrequency",
    "MixedNegatives",
    "SampledNegatives",
    "UniformNegatives",
    "__version__",
    "accidental_hit_mask",
    "batch_log_frequency",
    "check_log_q",
    "distinct_in_random_order",
    "first_occurrence_mask",
    "losses",
    "reduce_loss",
    "sampled_softmax_loss",
]
