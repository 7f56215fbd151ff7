"""The losses' math, without the checks: `tfrs_logq.losses` is the public surface.

As TF-Ranking keeps its loss functions in ``losses_impl.py`` under a public
``losses.py``, this private module holds what the public functions compute once their
inputs are checked and cast: the masked log-sum-exp (`row_logsumexp` and its masked
forms, exact zero for a masked entry, value and gradient), the corrected loss's weight
(`corrected_weight`) and one function per correction of the sampled softmax
(`sampled_none`, `sampled_logq`, `sampled_corrected`; the formulas are in
`tfrs_logq.losses`'s docstring). `tfrs_logq.losses` re-exports the public names.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf


def masked_value(dtype: tf.DType) -> tf.Tensor:
    """The one "minus infinity" used for masked logits: half the dtype's lowest value.

    Finite, so ``0 * masked`` is 0 (no NaN), and ``exp(masked - max)`` is exactly 0
    for any real row maximum, without overflow in ``masked - max``.
    """
    return tf.constant(np.finfo(dtype.as_numpy_dtype).min / 2, dtype)


def _logsumexp_with_gradient(logits: tf.Tensor):
    row_max = tf.stop_gradient(tf.reduce_max(logits, axis=-1, keepdims=True))
    exp = tf.exp(logits - row_max)
    total = tf.reduce_sum(exp, axis=-1, keepdims=True)
    lse = tf.squeeze(row_max + tf.math.log(total), axis=-1)

    def grad(upstream):
        return exp * (upstream[:, None] / total)

    return lse, grad


@tf.custom_gradient
def row_logsumexp(logits: tf.Tensor):
    """`[batch, n]` -> `[batch]` ``log sum_j e^{logits_j}``, stable, one kernel pass each way.

    Masked entries must hold `masked_value` (they then contribute exactly 0 and
    receive zero gradient). A row that is entirely masked returns a finite
    value near `masked_value`; callers zero such rows.
    """
    return _logsumexp_with_gradient(logits)


def masked_row_logsumexp(logits: tf.Tensor, exclude: tf.Tensor) -> tf.Tensor:
    """`row_logsumexp` over the entries where ``exclude`` is False.

    The mask is applied inside the custom gradient, so the backward pass is a
    single multiply (no select over the masked matrix). Excluded entries may hold
    anything, inf and NaN included, and receive zero gradient.
    """

    @tf.custom_gradient
    def _lse(x):
        return _logsumexp_with_gradient(tf.where(exclude, masked_value(x.dtype), x))

    return _lse(logits)


def kept_row_logsumexp(logits: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
    """`masked_row_logsumexp` with the mask in the positive sense (True = counts),
    so that no `[batch, n]` ``logical_not`` is made."""

    @tf.custom_gradient
    def _lse(x):
        return _logsumexp_with_gradient(tf.where(keep, x, masked_value(x.dtype)))

    return _lse(logits)


def logaddexp(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``log(e^a + e^b)`` elementwise, stable."""
    m = tf.stop_gradient(tf.maximum(a, b))
    return m + tf.math.log(tf.exp(a - m) + tf.exp(b - m))


# What a negative's probability is: ``"per_draw"``, ``Q(d)`` of one draw (the paper's
# setting: n draws, the normaliser estimated by their mean); ``"inclusion"``, ``pi(d)``,
# the chance that ``d`` is in the row's set of negatives (deduplicated draws: the
# normaliser estimated by the Horvitz-Thompson sum over the set).
PROPOSALS = ("per_draw", "inclusion")


def check_proposal(proposal: str, name: str = "proposal") -> None:
    if proposal not in PROPOSALS:
        raise ValueError(f"`{name}` must be one of {PROPOSALS}, received {proposal!r}.")


def corrected_weight(
    positive_logits: tf.Tensor, negative_lse: tf.Tensor, num_valid: tf.Tensor,
    proposal: str = "per_draw",
) -> tf.Tensor:
    """The corrected loss's weight ``w = sg(1 - P(p|u))``, `[batch]`; 0 where ``n = 0``.

    ``negative_lse = log sum_i e^{s_i - log Q'(d_i)}`` over the row's ``num_valid``
    (``n``) negatives. Per-draw proposals (the paper): ``P = e^{s_p} / (e^{s_p} +
    (1/n) sum_i e^{s_i - log Q'(d_i)}) = sigmoid(s_p - lse + log n)``, so
    ``1 - P = sigmoid(lse - log n - s_p)``. Inclusion probabilities ``pi`` (``lse``
    over ``s_i - log pi(d_i)``): the sum itself estimates the normaliser without the
    positive (Horvitz-Thompson), ``1 - P = sigmoid(lse - s_p)``. Its gradient is zero
    (stop-gradient). A row with no valid negative has no loss, and weight 0.

    >>> w = corrected_weight(tf.constant([2.0]), tf.math.log([11.7957]), [2])
    >>> round(float(w[0]), 3)
    0.444
    """
    check_proposal(proposal)
    positive_logits = tf.convert_to_tensor(positive_logits)
    num_valid = tf.cast(num_valid, positive_logits.dtype)
    has_negative = num_valid > 0
    safe_lse = tf.where(has_negative, negative_lse, positive_logits)
    if proposal == "per_draw":
        safe_lse = safe_lse - tf.math.log(tf.maximum(num_valid, 1.0))
    weight = tf.stop_gradient(tf.sigmoid(safe_lse - positive_logits))
    return tf.where(has_negative, weight, tf.zeros_like(weight))


def corrected_from_logsumexp(
    positive_logits: tf.Tensor, negative_lse: tf.Tensor, num_valid: tf.Tensor,
    proposal: str = "per_draw",
) -> tf.Tensor:
    """``-w (s_p - lse)`` with ``w = sg(1 - P)`` (`corrected_weight`, with its
    ``proposal``); rows with no valid negative give 0.

    ``lse = log sum_i e^{s_i - log Q'(d_i)}`` over the ``num_valid`` negatives.
    """
    has_negative = tf.cast(num_valid, positive_logits.dtype) > 0
    safe_lse = tf.where(has_negative, negative_lse, positive_logits)
    weight = corrected_weight(positive_logits, safe_lse, num_valid, proposal)
    loss = weight * (safe_lse - positive_logits)
    return tf.where(has_negative, loss, tf.zeros_like(loss))


def sampled_none(s_p: tf.Tensor, s_n: tf.Tensor, is_negative: tf.Tensor) -> tf.Tensor:
    """``-s_p + log(e^{s_p} + sum_i e^{s_i})`` over the negatives where ``is_negative``."""
    logits = tf.concat([s_p[:, None], tf.where(is_negative, s_n, masked_value(s_n.dtype))],
                       axis=1)
    return row_logsumexp(logits) - s_p


def _adjusted(s_n: tf.Tensor, log_q: tf.Tensor, is_negative: tf.Tensor) -> tf.Tensor:
    """``s_i - log Q(d_i)`` where ``is_negative``, `masked_value` elsewhere (masked entries
    may hold anything, inf and NaN included: `where` drops them, value and gradient)."""
    return tf.where(is_negative, s_n - log_q, masked_value(s_n.dtype))


def sampled_logq(s_p: tf.Tensor, s_n: tf.Tensor, log_q: tf.Tensor, is_negative: tf.Tensor,
                 positive_log_q: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})``; the positive's term
    is left uncorrected when ``positive_log_q`` is None (the paper's official code)."""
    adjusted = _adjusted(s_n, log_q, is_negative)
    positive_term = s_p if positive_log_q is None else s_p - positive_log_q
    return row_logsumexp(tf.concat([positive_term[:, None], adjusted], axis=1)) - s_p


def sampled_corrected(s_p: tf.Tensor, s_n: tf.Tensor, log_q: tf.Tensor, is_negative: tf.Tensor,
                      proposal: str = "per_draw") -> tf.Tensor:
    """``-w (s_p - log sum_i e^{s_i - log Q'(d_i)})`` (`corrected_from_logsumexp`)."""
    adjusted = _adjusted(s_n, log_q, is_negative)
    num_valid = tf.reduce_sum(tf.cast(is_negative, tf.int32), axis=-1)
    return corrected_from_logsumexp(s_p, row_logsumexp(adjusted), num_valid, proposal)


__all__ = ["PROPOSALS", "check_proposal", "corrected_from_logsumexp", "corrected_weight",
           "kept_row_logsumexp", "logaddexp", "masked_row_logsumexp", "masked_value",
           "row_logsumexp", "sampled_corrected", "sampled_logq", "sampled_none"]
