"""Sampled softmax losses with no, standard, or corrected logQ correction.

Pure functions: logits, log proposal probabilities and a validity mask in, one
loss per example out. The Keras task in :mod:`tfrs_logq.tasks` is a thin wrapper.

Notation (Khrylchenko et al., RecSys 2025): ``s_p`` is the positive's logit,
``s_i`` the logit of negative ``d_i``, ``Q`` the proposal the negatives were
drawn from and ``Q'`` the proposal with the positive excluded.

- ``"none"``:      ``-s_p + log(e^{s_p} + sum_i e^{s_i})``
- ``"logq"``:      ``-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})``
- ``"corrected"``: ``-w * (s_p - log sum_i e^{s_i - log Q'(d_i)})`` with
  ``w = sg(1 - P)`` and ``P = e^{s_p} / (e^{s_p} + (1/n) sum_i e^{s_i - log Q'(d_i)})``,
  ``n`` the number of valid negatives of the row and ``sg`` the stop-gradient.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

CORRECTIONS = ("none", "logq", "corrected")


def compute_dtype_for(*tensors: Optional[tf.Tensor]) -> tf.DType:
    """float64 if any input is float64, else float32 (never half precision)."""
    for t in tensors:
        if t is not None and t.dtype == tf.float64:
            return tf.float64
    return tf.float32


def _as_float(x, name: str, dtype: tf.DType) -> tf.Tensor:
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise ValueError(f"`{name}` must be a floating tensor, received dtype {x.dtype.name}.")
    return tf.cast(x, dtype)


def _check_rank(x: tf.Tensor, name: str, ranks: tuple[int, ...]) -> None:
    rank = x.shape.rank
    if rank is not None and rank not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"`{name}` must have rank {expected}, received shape {x.shape.as_list()}."
        )


def _check_dim(x: tf.Tensor, name: str, axis: int, expected: Optional[int], what: str) -> None:
    got = x.shape[axis] if x.shape.rank is not None else None
    if got is not None and expected is not None and got != expected:
        raise ValueError(
            f"`{name}` has {got} {what} along axis {axis} (shape {x.shape.as_list()}), "
            f"expected {expected}."
        )


def masked_logsumexp(
    logits: tf.Tensor, mask: tf.Tensor, extra: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``log(sum_{i: mask} e^{logits_i} [+ e^{extra}])`` per row, stable and NaN-free.

    Masked entries may hold any value (including inf or NaN): they are replaced
    before any arithmetic, so they receive exactly zero gradient. A row with no
    valid entry and no ``extra`` returns ``-inf``.

    Args:
      logits: `[batch, n]` floating tensor.
      mask: `[batch, n]` bool, True where the entry counts.
      extra: optional `[batch]` term included in every row.
    """
    neg_inf = tf.constant(float("-inf"), logits.dtype)
    row_max = tf.reduce_max(tf.where(mask, logits, neg_inf), axis=-1)
    if extra is not None:
        row_max = tf.maximum(row_max, extra)
    has_any = tf.math.is_finite(row_max)
    shift = tf.stop_gradient(tf.where(has_any, row_max, tf.zeros_like(row_max)))
    safe = tf.where(mask, logits, shift[:, None])
    total = tf.reduce_sum(
        tf.where(mask, tf.exp(safe - shift[:, None]), tf.zeros_like(safe)), axis=-1
    )
    if extra is not None:
        safe_extra = tf.where(tf.math.is_finite(extra), extra, shift)
        total += tf.where(
            tf.math.is_finite(extra), tf.exp(safe_extra - shift), tf.zeros_like(extra)
        )
    positive_total = total > 0
    safe_total = tf.where(positive_total, total, tf.ones_like(total))
    return tf.where(positive_total, shift + tf.math.log(safe_total), tf.fill(tf.shape(total), neg_inf))


def sampled_softmax_loss(
    positive_logits,
    negative_logits,
    *,
    correction: str,
    negative_log_q=None,
    positive_log_q=None,
    negative_mask=None,
) -> tf.Tensor:
    """Per-example sampled softmax loss with the chosen logQ correction.

    Args:
      positive_logits: `[batch]` floating. ``s_p``, the positive's logit.
      negative_logits: `[batch, n]` floating. ``s_i``, the negatives' logits.
      correction: str. One of ``"none"``, ``"logq"`` (standard, Yi et al. 2019)
        or ``"corrected"`` (Khrylchenko et al. 2025); see the module docstring.
      negative_log_q: `[batch, n]` or `[n]` floating. ``log Q(d_i)`` for
        ``"logq"`` and ``log Q'(d_i)`` (proposal without the positive) for
        ``"corrected"``. Required for both; ignored for ``"none"``.
      positive_log_q: `[batch]` floating. ``log Q(p)``; only for ``"logq"``.
        When None the positive's denominator term is left uncorrected (the
        variant of the paper's official code). Defaults to None.
      negative_mask: `[batch, n]` bool. False marks an entry that is not a
        negative (accidental hit, duplicate, padding). Defaults to all True.

    Returns:
      `[batch]` loss in float32 (float64 if an input is float64). A row with
      no valid negative has loss 0 for ``"corrected"`` (finite gradients);
      for ``"none"``/``"logq"`` such a row has loss 0 as well (the softmax over
      the positive alone).

    Raises:
      ValueError: on an unknown correction, a missing ``negative_log_q``, a
        non-floating input, or shapes that do not agree.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"`correction` must be one of {CORRECTIONS}, received {correction!r}.")
    positive_logits = tf.convert_to_tensor(positive_logits)
    negative_logits = tf.convert_to_tensor(negative_logits)
    if negative_log_q is not None:
        negative_log_q = tf.convert_to_tensor(negative_log_q)
    if positive_log_q is not None:
        positive_log_q = tf.convert_to_tensor(positive_log_q)
    dtype = compute_dtype_for(positive_logits, negative_logits, negative_log_q, positive_log_q)

    s_p = _as_float(positive_logits, "positive_logits", dtype)
    s_n = _as_float(negative_logits, "negative_logits", dtype)
    _check_rank(s_p, "positive_logits", (1,))
    _check_rank(s_n, "negative_logits", (2,))
    batch = s_p.shape[0]
    _check_dim(s_n, "negative_logits", 0, batch, "rows (must match `positive_logits`)")
    num_neg = s_n.shape[1] if s_n.shape.rank == 2 else None

    if negative_mask is None:
        mask = tf.ones_like(s_n, dtype=tf.bool)
    else:
        mask = tf.convert_to_tensor(negative_mask)
        if mask.dtype != tf.bool:
            raise ValueError(f"`negative_mask` must be bool, received dtype {mask.dtype.name}.")
        _check_rank(mask, "negative_mask", (2,))
        _check_dim(mask, "negative_mask", 0, batch, "rows")
        _check_dim(mask, "negative_mask", 1, num_neg, "columns (must match `negative_logits`)")

    if correction == "none":
        lse = masked_logsumexp(s_n, mask, extra=s_p)
        return lse - s_p

    if negative_log_q is None:
        raise ValueError(f"`negative_log_q` is required for correction={correction!r}.")
    log_q = _as_float(negative_log_q, "negative_log_q", dtype)
    _check_rank(log_q, "negative_log_q", (1, 2))
    if log_q.shape.rank == 1:
        _check_dim(log_q, "negative_log_q", 0, num_neg, "entries (must match negatives)")
        log_q = log_q[None, :]
    else:
        _check_dim(log_q, "negative_log_q", 0, batch, "rows")
        _check_dim(log_q, "negative_log_q", 1, num_neg, "columns (must match negatives)")
    adjusted = s_n - log_q

    if correction == "logq":
        positive_term = s_p
        if positive_log_q is not None:
            pos_q = _as_float(positive_log_q, "positive_log_q", dtype)
            _check_rank(pos_q, "positive_log_q", (1,))
            _check_dim(pos_q, "positive_log_q", 0, batch, "entries (must match batch)")
            positive_term = s_p - pos_q
        lse = masked_logsumexp(adjusted, mask, extra=positive_term)
        return lse - s_p

    if positive_log_q is not None:
        raise ValueError(
            "`positive_log_q` is only used by correction='logq'; the corrected loss "
            "removes the positive from the denominator."
        )
    # correction == "corrected"
    lse = masked_logsumexp(adjusted, mask)  # log sum_i e^{s_i - log Q'(d_i)}
    num_valid = tf.reduce_sum(tf.cast(mask, dtype), axis=-1)
    has_negative = num_valid > 0
    safe_lse = tf.where(has_negative, lse, s_p)
    # P = sigmoid(s_p - (lse - log n)), so 1 - P = sigmoid(lse - log n - s_p).
    log_n = tf.math.log(tf.maximum(num_valid, 1.0))
    weight = tf.stop_gradient(tf.sigmoid(safe_lse - log_n - s_p))
    loss = weight * (safe_lse - s_p)
    return tf.where(has_negative, loss, tf.zeros_like(loss))
