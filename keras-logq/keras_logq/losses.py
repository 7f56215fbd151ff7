"""Sampled softmax losses with no, standard, or corrected logQ correction, in `keras.ops`.

Pure functions: logits, log proposal probabilities and a validity mask in, one
loss per example out. They run and differentiate on every Keras 3 backend (JAX,
PyTorch, TensorFlow), eagerly and under `jit_compile`. The layer in
`keras_logq.retrieval` is a thin wrapper around them.

Notation (Khrylchenko et al., RecSys 2025): ``s_p`` is the positive's logit,
``s_i`` the logit of negative ``d_i``, ``Q`` the proposal the negatives were
drawn from and ``Q'`` the proposal with the positive excluded,
``log Q'(d) = log Q(d) - log(1 - Q(p))``.

- ``"none"``:      ``-s_p + log(e^{s_p} + sum_i e^{s_i})``
- ``"logq"``:      ``-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})``
- ``"corrected"``: ``-w * (s_p - log sum_i e^{s_i - log Q'(d_i)})`` with
  ``w = sg(1 - P)`` and ``P = e^{s_p} / (e^{s_p} + (1/n) sum_i e^{s_i - log Q'(d_i)})``,
  ``n`` the number of valid negatives of the row and ``sg`` the stop-gradient.

The same semantics as `tfrs_logq.losses.sampled_softmax_loss` (TensorFlow only).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

CORRECTIONS = ("none", "logq", "corrected")
_HALF = ("float16", "bfloat16")


def _dtype_name(x) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def compute_dtype_for(*tensors) -> str:
    """``"float64"`` if any input is float64, else ``"float32"`` (never half precision)."""
    for t in tensors:
        if t is not None and _dtype_name(t) == "float64":
            return "float64"
    return "float32"


def masked_value(dtype: str) -> float:
    """The one "minus infinity" for masked logits: half the dtype's lowest value.

    Finite, so ``0 * masked`` is 0 (no NaN), and ``exp(masked - max)`` is exactly
    0 for any real row maximum, without overflow in ``masked - max``. Only used in
    the float32/float64 compute dtype (half-precision inputs are cast up first).
    """
    return float(np.finfo(np.dtype(dtype)).min / 2)


def _as_float(x, name: str, dtype: str):
    kind = _dtype_name(x)
    if "float" not in kind:
        raise ValueError(f"`{name}` must be a floating tensor, received dtype {kind}.")
    return ops.cast(x, dtype)


def _shape(x) -> tuple:
    """The static shape: ints, None where unknown (TensorFlow graphs give tensors there)."""
    return tuple(d if isinstance(d, int) else None for d in ops.shape(x))


def _check_rank(x, name: str, ranks: tuple) -> None:
    if len(_shape(x)) not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(f"`{name}` must have rank {expected}, received shape {_shape(x)}.")


def _check_dim(x, name: str, axis: int, expected, what: str) -> None:
    got = _shape(x)[axis]
    if got is not None and expected is not None and got != expected:
        raise ValueError(
            f"`{name}` has {got} {what} along axis {axis} (shape {_shape(x)}), "
            f"expected {expected}."
        )


def row_logsumexp(logits):
    """`[batch, n]` -> `[batch]` ``log sum_j e^{logits_j}``, stable.

    Masked entries must hold `masked_value` (they then contribute exactly 0 and
    receive zero gradient). An entirely masked row returns a finite value near
    `masked_value`; callers zero such rows.
    """
    row_max = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))
    total = ops.sum(ops.exp(logits - row_max), axis=-1)
    return ops.squeeze(row_max, axis=-1) + ops.log(total)


def corrected_from_logsumexp(positive_logits, negative_lse, num_valid):
    """``-w (s_p - lse)`` with ``w = sg(1 - P)``; rows with no valid negative give 0.

    ``lse = log sum_i e^{s_i - log Q'(d_i)}`` over the ``num_valid`` negatives and
    ``P = e^{s_p} / (e^{s_p} + e^{lse} / n) = sigmoid(s_p - lse + log n)``, so
    ``1 - P = sigmoid(lse - log n - s_p)``.
    """
    num_valid = ops.cast(num_valid, positive_logits.dtype)
    has_negative = num_valid > 0
    safe_lse = ops.where(has_negative, negative_lse, positive_logits)
    log_n = ops.log(ops.maximum(num_valid, 1.0))
    weight = ops.stop_gradient(ops.sigmoid(safe_lse - log_n - positive_logits))
    loss = weight * (safe_lse - positive_logits)
    return ops.where(has_negative, loss, ops.zeros_like(loss))


def sampled_softmax_loss(
    positive_logits,
    negative_logits,
    *,
    correction: str,
    negative_log_q=None,
    positive_log_q=None,
    is_negative=None,
):
    """Per-example sampled softmax loss with the chosen logQ correction.

    Args:
        positive_logits: float tensor, `[batch]`. ``s_p``, the positive's logit.
        negative_logits: float tensor, `[batch, n]`. ``s_i``, the negatives'
            logits.
        correction: str. One of ``"none"``, ``"logq"`` (standard, Yi et al.
            2019) or ``"corrected"`` (Khrylchenko et al. 2025); see the module
            docstring.
        negative_log_q: float tensor, `[batch, n]` or `[n]`. ``log Q(d_i)`` for
            ``"logq"`` and ``log Q'(d_i)`` (the proposal without the positive)
            for ``"corrected"``. Required for both; ignored for ``"none"``.
            Defaults to `None`.
        positive_log_q: float tensor, `[batch]`. ``log Q(p)``; only for
            ``"logq"``. When `None` the positive's denominator term is left
            uncorrected (the variant of the paper's official code). Defaults
            to `None`.
        is_negative: bool tensor, `[batch, n]`. `False` marks an entry that is
            not a negative (accidental hit, duplicate, padding); such entries
            may hold anything, inf and NaN included, and get zero gradient.
            Defaults to `None` (all `True`).

    Returns:
        `[batch]` loss in float32 (float64 if an input is float64; float16 and
        bfloat16 inputs are computed in float32). A row with no valid negative
        has loss 0: for ``"corrected"`` with zero gradients, for ``"none"`` and
        ``"logq"`` it is the softmax over the positive alone.

    Raises:
        ValueError: on an unknown correction, a missing ``negative_log_q``, a
            non-floating input, or shapes that do not agree.

    Example:

    ```python
    import numpy as np
    from keras_logq.losses import sampled_softmax_loss

    # s_p = 2, negatives s = 0, 1 with Q = 0.1, 0.2 and Q(p) = 0.5:
    # log Q' = log(Q / (1 - Q(p))) = log 0.2, log 0.4; the loss is 0.207.
    loss = sampled_softmax_loss(
        np.array([2.0]),
        np.array([[0.0, 1.0]]),
        correction="corrected",
        negative_log_q=np.log([[0.2, 0.4]]),
    )
    ```
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"`correction` must be one of {CORRECTIONS}, received {correction!r}.")
    positive_logits = ops.convert_to_tensor(positive_logits)
    negative_logits = ops.convert_to_tensor(negative_logits)
    if negative_log_q is not None:
        negative_log_q = ops.convert_to_tensor(negative_log_q)
    if positive_log_q is not None:
        positive_log_q = ops.convert_to_tensor(positive_log_q)
    dtype = compute_dtype_for(positive_logits, negative_logits, negative_log_q, positive_log_q)

    s_p = _as_float(positive_logits, "positive_logits", dtype)
    s_n = _as_float(negative_logits, "negative_logits", dtype)
    _check_rank(s_p, "positive_logits", (1,))
    _check_rank(s_n, "negative_logits", (2,))
    batch, num_neg = _shape(s_p)[0], _shape(s_n)[1]
    _check_dim(s_n, "negative_logits", 0, batch, "rows (must match `positive_logits`)")

    if is_negative is None:
        mask = ops.ones_like(s_n, dtype="bool")
    else:
        mask = ops.convert_to_tensor(is_negative)
        if _dtype_name(mask) != "bool":
            raise ValueError(f"`is_negative` must be bool, received dtype {_dtype_name(mask)}.")
        _check_rank(mask, "is_negative", (2,))
        _check_dim(mask, "is_negative", 0, batch, "rows")
        _check_dim(mask, "is_negative", 1, num_neg, "columns (must match `negative_logits`)")

    masked = ops.cast(masked_value(dtype), dtype)
    if correction == "none":
        logits = ops.concatenate([s_p[:, None], ops.where(mask, s_n, masked)], axis=1)
        return row_logsumexp(logits) - s_p

    if negative_log_q is None:
        raise ValueError(f"`negative_log_q` is required for correction={correction!r}.")
    log_q = _as_float(negative_log_q, "negative_log_q", dtype)
    _check_rank(log_q, "negative_log_q", (1, 2))
    if len(_shape(log_q)) == 1:
        _check_dim(log_q, "negative_log_q", 0, num_neg, "entries (must match negatives)")
        log_q = log_q[None, :]
    else:
        _check_dim(log_q, "negative_log_q", 0, batch, "rows")
        _check_dim(log_q, "negative_log_q", 1, num_neg, "columns (must match negatives)")
    # Masked entries may hold anything (inf, NaN): `where` drops them, value and gradient.
    adjusted = ops.where(mask, s_n - log_q, masked)

    if correction == "logq":
        positive_term = s_p
        if positive_log_q is not None:
            pos_q = _as_float(positive_log_q, "positive_log_q", dtype)
            _check_rank(pos_q, "positive_log_q", (1,))
            _check_dim(pos_q, "positive_log_q", 0, batch, "entries (must match batch)")
            positive_term = s_p - pos_q
        return row_logsumexp(ops.concatenate([positive_term[:, None], adjusted], axis=1)) - s_p

    if positive_log_q is not None:
        raise ValueError(
            "`positive_log_q` is only used by correction='logq'; the corrected loss "
            "removes the positive from the denominator."
        )
    num_valid = ops.sum(ops.cast(mask, "int32"), axis=-1)
    return corrected_from_logsumexp(s_p, row_logsumexp(adjusted), num_valid)
