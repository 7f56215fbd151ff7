"""The study's losses, one per correction, through keras-logq's public loss.

Row ``i`` of a batch has its positive ``p_i`` (logit ``s_p``) and the batch's ``k``
shared negatives ``d_j`` (logits ``s_ij``), of which ``is_negative[i, j]`` count (valid,
not an accidental hit). ``log Q`` is the run's proposal (`lab.study`'s
``unigram``, ``mixture`` or ``inclusion`` table):

- ``none``: ``-s_p + log(e^{s_p} + sum_j e^{s_ij})``, keras-logq ``"none"``;
- ``logq-tfrs``: ``-s_p + log(e^{s_p - log Q(p)} + sum_j e^{s_ij - log Q(d_j)})`` (TFRS's
  form: the positive corrected too), keras-logq ``"logq-tfrs"`` with ``positive_log_q``;
- ``logq-official``: the same with the positive uncorrected (the paper's code's form),
  keras-logq ``"logq-official"``;
- ``corrected``: ``-w (s_p - log sum_j e^{s_ij - log Q'(d_j)})``, ``w = sg(1 - P)``,
  keras-logq ``"corrected"``;
- ``corrected-w1``: ``-(s_p - log sum_j e^{s_ij - log Q'(d_j)})`` (``w = 1``), on
  keras-logq's `losses.row_logsumexp`.

``log Q'(d) = log Q(d) - log(1 - Q(p))``. ``logq-tfrs``'s value is ``log Q(p)`` below
TFRS's (which subtracts it in the numerator too); the gradient is the same. With the
``inclusion`` proposal (deduplicated in-batch draws, ``log pi(d)``) the corrected loss
has no ``Q(p)`` to exclude and its weight is the Horvitz-Thompson one, ``1 - P =
sigmoid(lse - s_p)`` (`tfrs_logq.losses.corrected_weight`), which keras-logq's loss
does not offer (it has the per-draw ``sigmoid(lse - log n - s_p)`` only): that case is
written here in `keras.ops` on keras-logq's `row_logsumexp`.

All of it is `keras.ops`: it runs on JAX arrays inside a jitted JAX step.
"""

from __future__ import annotations

import os
import sys

if "keras" not in sys.modules:  # the study runs Keras 3 on JAX unless told otherwise
    os.environ.setdefault("KERAS_BACKEND", "jax")

from keras import ops  # noqa: E402

from keras_logq import losses as klq  # noqa: E402

CORRECTIONS = (*klq.CORRECTIONS, "corrected-w1")
# A probability q in log(1 - q) is capped at 1 - 1e-6 (tfrs_logq.proposal.COMPLEMENT_EPSILON).
COMPLEMENT_EPSILON = 1e-6


def excluded_log_q(negative_log_q, positive_log_q):
    """`[B, k]` ``log Q'(d_j) = log Q(d_j) - log(1 - Q(p_i))`` from `[k]` and `[B]`."""
    q_p = ops.minimum(ops.exp(positive_log_q), 1.0 - COMPLEMENT_EPSILON)
    return negative_log_q[None, :] - ops.log1p(-q_p)[:, None]


def _masked_lse(adjusted, is_negative):
    masked = klq.masked_value("float32")
    lse = klq.row_logsumexp(ops.where(is_negative, adjusted, masked))
    has_negative = ops.any(is_negative, axis=-1)
    return lse, has_negative


def study_loss(correction: str, positive_logits, negative_logits, *, positive_log_q,
               negative_log_q, is_negative, inclusion: bool = False):
    """`[B]` per-example loss of one of `CORRECTIONS` (see the module docstring).

    Args:
      correction: str. One of `CORRECTIONS`.
      positive_logits: `[B]` float32 ``s_p``.
      negative_logits: `[B, k]` float32 ``s_ij``.
      positive_log_q: `[B]` ``log Q(p_i)`` under the run's proposal.
      negative_log_q: `[k]` ``log Q(d_j)`` (0 on padding).
      is_negative: `[B, k]` bool.
      inclusion: bool. ``log Q`` holds inclusion probabilities ``log pi``.
    """
    klq.check_correction(correction, allowed=CORRECTIONS)
    if correction == "none":
        return klq.sampled_softmax_loss(positive_logits, negative_logits, correction="none",
                                        is_negative=is_negative, validate=False)
    if correction in ("logq-tfrs", "logq-official"):
        return klq.sampled_softmax_loss(
            positive_logits, negative_logits, correction=correction,
            negative_log_q=negative_log_q, is_negative=is_negative, validate=False,
            positive_log_q=positive_log_q if correction == "logq-tfrs" else None)
    log_q = (ops.broadcast_to(negative_log_q[None, :], ops.shape(negative_logits)) if inclusion
             else excluded_log_q(negative_log_q, positive_log_q))
    if correction == "corrected" and not inclusion:
        return klq.sampled_softmax_loss(positive_logits, negative_logits,
                                        correction="corrected", negative_log_q=log_q,
                                        is_negative=is_negative, validate=False)
    lse, has_negative = _masked_lse(negative_logits - log_q, is_negative)
    safe_lse = ops.where(has_negative, lse, positive_logits)
    if correction == "corrected":  # inclusion: the Horvitz-Thompson weight
        weight = ops.stop_gradient(ops.sigmoid(safe_lse - positive_logits))
    else:  # corrected-w1
        weight = ops.ones_like(positive_logits)
    loss = weight * (safe_lse - positive_logits)
    return ops.where(has_negative, loss, ops.zeros_like(loss))


__all__ = ["CORRECTIONS", "excluded_log_q", "study_loss"]
