"""The study's losses, one per correction: dispatch over keras-logq's public loss.

Row ``i`` of a batch has its positive ``p_i`` (logit ``s_p``) and the batch's ``k``
shared negatives ``d_j`` (logits ``s_ij``), of which ``is_negative[i, j]`` count (valid,
not an accidental hit). ``log Q`` is the run's proposal (`runs.proposal_log_q`:
``unigram``, ``mixture`` or ``inclusion``). Each correction is
`keras_logq.losses.sampled_softmax_loss` with the same name (the formulas are in its
module docstring):

- ``none``, ``logq-official``: as given;
- ``logq-tfrs``: with ``positive_log_q`` (its value is ``log Q(p)`` below TFRS's, which
  subtracts it in the numerator too; the gradient is the same);
- ``corrected``: per-draw proposals (``unigram``, ``mixture``) with ``log Q'(d) = log Q(d)
  - log(1 - Q(p))`` (`keras_logq.losses.excluded_log_q`); the ``inclusion`` proposal
  (deduplicated in-batch draws, ``log pi(d)``) with ``proposal="inclusion"``: no
  ``Q(p)`` to exclude, the Horvitz-Thompson weight ``1 - P = sigmoid(lse - s_p)``;
- ``corrected-w1``: the ablation ``-(s_p - log sum_j e^{s_ij - log Q'(d_j)})`` (the
  corrected loss with ``w = 1``, ``log Q'`` as for ``corrected``), 0 on a row with no
  valid negative.

``corrected-w1`` is the one correction keras-logq does not offer, as tfrs_logq does not:
it has no lower bound in ``s_p`` and collapses (`w1_probe`), so it is a diagnostic of
this study, not a loss to train with. It is keras-logq's own pieces (`masked_value`,
`row_logsumexp`, `excluded_log_q`) with the weight left out.

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
    common = dict(is_negative=is_negative, validate=False)  # tables checked on the host
    if correction == "none":
        return klq.sampled_softmax_loss(positive_logits, negative_logits, correction="none",
                                        **common)
    if correction in ("logq-tfrs", "logq-official"):
        return klq.sampled_softmax_loss(
            positive_logits, negative_logits, correction=correction,
            negative_log_q=negative_log_q, **common,
            positive_log_q=positive_log_q if correction == "logq-tfrs" else None)
    log_q = (negative_log_q if inclusion
             else klq.excluded_log_q(negative_log_q, positive_log_q))
    if correction == "corrected":
        return klq.sampled_softmax_loss(
            positive_logits, negative_logits, correction="corrected", negative_log_q=log_q,
            proposal="inclusion" if inclusion else "per_draw", **common)
    # corrected-w1
    lse = klq.row_logsumexp(ops.where(is_negative, negative_logits - log_q,
                                      klq.masked_value("float32")))
    return ops.where(ops.any(is_negative, axis=-1), lse - positive_logits, 0.0)


__all__ = ["CORRECTIONS", "study_loss"]
