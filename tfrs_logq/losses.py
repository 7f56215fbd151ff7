"""Sampled softmax losses with no, standard (two forms), or corrected logQ correction.

Pure functions: logits, log proposal probabilities and a validity mask in, one
loss per example out. The Keras task in :mod:`tfrs_logq.tasks` is a thin wrapper.
The masked log-sum-exp (`row_logsumexp` and its masked forms, exact zero for a masked
entry, value and gradient), the corrected loss's weight (`corrected_weight`) and one
function per correction (`sampled_none`, `sampled_logq`, `sampled_corrected`) come
first; the checked public losses are built on them.

Notation (Khrylchenko et al., RecSys 2025): ``s_p`` is the positive's logit,
``s_i`` the logit of negative ``d_i``, ``Q`` the proposal the negatives were
drawn from and ``Q'`` the proposal with the positive excluded.

- ``"none"``:          ``-s_p + log(e^{s_p} + sum_i e^{s_i})``
- ``"logq-tfrs"``:     ``-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})``,
  standard logQ as TFRS's ``Retrieval`` computes it: the positive's logit corrected too
  (`CorrectedRetrieval` and `in_batch_softmax_loss` also subtract the constant
  ``log Q(p)`` in the numerator, as TFRS does: the same gradient)
- ``"logq-official"``: ``-s_p + log(e^{s_p} + sum_i e^{s_i - log Q(d_i)})``, standard
  logQ as the paper's official code computes it: the positive uncorrected
- ``"corrected"``:     ``-w * (s_p - log sum_i e^{s_i - log Q'(d_i)})`` with
  ``w = sg(1 - P)`` and ``P = e^{s_p} / (e^{s_p} + (1/n) sum_i e^{s_i - log Q'(d_i)})``,
  ``n`` the number of valid negatives of the row and ``sg`` the stop-gradient.

A bare ``"logq"`` names neither standard form and is refused (`check_correction`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.corrections import CORRECTIONS, STANDARD_FORMS, check_correction
from tfrs_logq.proposal import check_log_q, log_complement


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


def loss_from_parts(correction: str, positive_logits: tf.Tensor, lse: tf.Tensor, *,
                    num_valid: Optional[tf.Tensor] = None,
                    numerator: Optional[tf.Tensor] = None,
                    proposal: str = "per_draw") -> tf.Tensor:
    """The four losses of a row from its parts, `[batch]`: every path of this module (sampled,
    in-batch, hard negatives) computes its log-sum-exp and hands it here.

    ``"none"``, ``"logq-tfrs"``, ``"logq-official"``: ``lse`` is the softmax's whole
    denominator, ``log(e^{t_p} + sum_i e^{s_i - c_i})`` (``t_p``: ``s_p``, or
    ``s_p - log Q(p)`` for ``"logq-tfrs"``; ``c_i``: 0 for ``"none"``, else ``log Q(d_i)``),
    and the loss is ``lse - numerator`` (``numerator``: ``s_p`` by default; TFRS subtracts
    ``log Q(p)`` there too, a constant of zero gradient). ``"corrected"``: ``lse`` is the
    negatives' alone, ``log sum_i e^{s_i - log Q'(d_i)}`` over the row's ``num_valid``
    negatives, and the loss is ``-w (s_p - lse)``, ``w = sg(1 - P)``
    (`corrected_from_logsumexp`, with its ``proposal``).

    >>> s_p = tf.constant([2.0])
    >>> round(float(loss_from_parts("none", s_p, tf.math.log([1 + tf.exp(2.0)]))[0]), 4)
    0.1269
    """
    if correction == "corrected":
        return corrected_from_logsumexp(positive_logits, lse, num_valid, proposal)
    return lse - (positive_logits if numerator is None else numerator)


def off_diagonal(num_queries, num_candidates) -> tf.Tensor:
    """`[num_queries, num_candidates]` bool, False at ``(i, i)``: the in-batch positives."""
    return tf.logical_not(tf.cast(tf.eye(num_queries, num_candidates), tf.bool))


def sampled_none(s_p: tf.Tensor, s_n: tf.Tensor, is_negative: tf.Tensor) -> tf.Tensor:
    """``-s_p + log(e^{s_p} + sum_i e^{s_i})`` over the negatives where ``is_negative``."""
    logits = tf.concat([s_p[:, None], tf.where(is_negative, s_n, masked_value(s_n.dtype))],
                       axis=1)
    return loss_from_parts("none", s_p, row_logsumexp(logits))


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
    lse = row_logsumexp(tf.concat([positive_term[:, None], adjusted], axis=1))
    return loss_from_parts("logq-official" if positive_log_q is None else "logq-tfrs", s_p, lse)


def sampled_corrected(s_p: tf.Tensor, s_n: tf.Tensor, log_q: tf.Tensor, is_negative: tf.Tensor,
                      proposal: str = "per_draw") -> tf.Tensor:
    """``-w (s_p - log sum_i e^{s_i - log Q'(d_i)})`` (`corrected_from_logsumexp`)."""
    adjusted = _adjusted(s_n, log_q, is_negative)
    num_valid = tf.reduce_sum(tf.cast(is_negative, tf.int32), axis=-1)
    return loss_from_parts("corrected", s_p, row_logsumexp(adjusted), num_valid=num_valid,
                           proposal=proposal)

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


def sampled_softmax_loss(
    positive_logits,
    negative_logits,
    *,
    correction: str,
    negative_log_q=None,
    positive_log_q=None,
    is_negative=None,
    proposal: str = "per_draw",
    validate: bool = True,
) -> tf.Tensor:
    """Per-example sampled softmax loss with the chosen logQ correction.

    Args:
      positive_logits: `[batch]` floating. ``s_p``, the positive's logit.
      negative_logits: `[batch, n]` floating. ``s_i``, the negatives' logits.
      correction: str. One of ``"none"``, ``"logq-tfrs"`` or ``"logq-official"``
        (standard, Yi et al. 2019, as TFRS and as the paper's official code compute it)
        or ``"corrected"`` (Khrylchenko et al. 2025); see the module docstring.
      negative_log_q: `[batch, n]` or `[n]` floating. ``log Q(d_i)`` for the
        standard forms and ``log Q'(d_i)`` (proposal without the positive) for
        ``"corrected"``. Required for all three; ignored for ``"none"``.
      positive_log_q: `[batch]` floating. ``log Q(p)``: required for ``"logq-tfrs"``
        (the positive's denominator term is corrected), refused by the others.
        Defaults to None.
      is_negative: `[batch, n]` bool. False marks an entry that is not a
        negative (accidental hit, duplicate, padding). Defaults to all True.
      proposal: str. What ``negative_log_q`` is the log of, for ``"corrected"``'s
        weight: ``"per_draw"`` (default; ``Q'(d)`` of one of ``n`` draws, the paper)
        or ``"inclusion"`` (``pi(d)``, the chance that ``d`` is in the row's set of
        negatives, as for deduplicated draws: no positive to exclude, the weight's
        normaliser is the Horvitz-Thompson sum, `corrected_weight`).
      validate: bool. Refuse a ``log Q`` (``log Q'``) above 0, a probability above
        1, in ``negative_log_q`` where ``is_negative`` is True and in
        ``positive_log_q`` (`tfrs_logq.proposal.check_log_q`). False skips it, for
        callers that derive ``Q'`` from a ``Q`` they checked, as `CorrectedRetrieval`
        does. Defaults to True.

    Returns:
      `[batch]` loss in float32 (float64 if an input is float64). A row with
      no valid negative has loss 0 for ``"corrected"`` (finite gradients);
      for ``"none"``/``"logq-official"`` such a row has loss 0 as well (the softmax
      over the positive alone).

    Raises:
      ValueError: on an unknown correction (a bare ``"logq"`` among them), a missing
        ``negative_log_q``, ``positive_log_q`` missing for ``"logq-tfrs"`` or given to
        another correction, a non-floating input, shapes that do not agree, or a ``log Q`` above 0
        (``Q > 1``) where ``is_negative`` is True or in ``positive_log_q``. In a
        `tf.function`, where the values are not known, the ``log Q`` check is a
        ``tf.debugging`` assertion (``InvalidArgumentError`` with the same message).

    Example: a positive scored ``s_p = 2`` and two negatives scored ``1`` and ``0``, drawn
    with ``Q(d_i)`` (``Q'(d_i)`` for ``"corrected"``) ``0.5`` and ``0.25``, the positive
    with ``Q(p) = 0.25``:

    >>> s_p, s_n = tf.constant([2.0]), tf.constant([[1.0, 0.0]])
    >>> log_q, log_q_p = tf.math.log([[0.5, 0.25]]), tf.math.log([0.25])
    >>> def loss(c, **kw):
    ...     return round(float(sampled_softmax_loss(s_p, s_n, correction=c,
    ...                                             negative_log_q=log_q, **kw)[0]), 4)
    >>> [loss("none"), loss("logq-tfrs", positive_log_q=log_q_p), loss("logq-official"),
    ...  loss("corrected")]
    [0.4076, 1.6634, 0.8229, 0.0953]
    """
    check_correction(correction)
    check_proposal(proposal)
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

    if is_negative is None:
        mask = tf.ones_like(s_n, dtype=tf.bool)
    else:
        mask = tf.convert_to_tensor(is_negative)
        if mask.dtype != tf.bool:
            raise ValueError(f"`is_negative` must be bool, received dtype {mask.dtype.name}.")
        _check_rank(mask, "is_negative", (2,))
        _check_dim(mask, "is_negative", 0, batch, "rows")
        _check_dim(mask, "is_negative", 1, num_neg, "columns (must match `negative_logits`)")

    if positive_log_q is None and correction == "logq-tfrs":
        raise ValueError("`positive_log_q` is required for correction='logq-tfrs' (the "
                         "positive's logit is corrected too); correction='logq-official' "
                         "leaves it uncorrected.")
    if positive_log_q is not None and correction != "logq-tfrs":
        raise ValueError(f"`positive_log_q` is only used by correction='logq-tfrs'; "
                         f"correction={correction!r} leaves the positive uncorrected or, "
                         "'corrected', out of the denominator: drop it.")
    if correction == "none":
        return sampled_none(s_p, s_n, mask)

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
    # Masked entries may hold anything (inf, NaN, log Q > 0): the loss drops them, value
    # and gradient. A negative's log Q above 0 (Q > 1) is refused, as CorrectedRetrieval does.
    if validate:
        log_q = check_log_q(log_q, "negative_log_q", is_valid=mask)

    if correction == "logq-official":
        return sampled_logq(s_p, s_n, log_q, mask, None)
    if correction == "logq-tfrs":
        pos_q = _as_float(positive_log_q, "positive_log_q", dtype)
        _check_rank(pos_q, "positive_log_q", (1,))
        _check_dim(pos_q, "positive_log_q", 0, batch, "entries (must match batch)")
        if validate:
            pos_q = check_log_q(pos_q, "positive_log_q")
        return sampled_logq(s_p, s_n, log_q, mask, pos_q)
    return sampled_corrected(s_p, s_n, log_q, mask, proposal)


def in_batch_softmax_loss(
    scores: tf.Tensor,
    *,
    correction: str,
    log_q: Optional[tf.Tensor] = None,
    is_negative: Optional[tf.Tensor] = None,
    num_negatives: Optional[tf.Tensor] = None,
    numerator_log_q: bool = True,
    positive_logits: Optional[tf.Tensor] = None,
    positives_masked: bool = False,
    proposal: str = "per_draw",
) -> tf.Tensor:
    """The same losses on a TFRS-style score matrix, without copying the positive out.

    Row ``i`` of ``scores`` has its positive in column ``i``; the other columns
    are its negatives where ``is_negative`` is True. This is the form
    `CorrectedRetrieval` uses: one masked `[batch, num_candidates]` matrix and
    one log-sum-exp per row.

    Args:
      scores: `[batch, num_candidates]` float logits, ``num_candidates >= batch``.
      correction: ``"none"``, ``"logq-tfrs"``, ``"logq-official"`` or ``"corrected"``.
      log_q: `[num_candidates]` ``log Q(d)`` of each candidate (all but ``"none"``;
        ``"logq-official"`` reads only the negatives'). For ``"corrected"``
        ``log Q'(d) = log Q(d) - log(1 - Q(p))`` is applied per row here
        (`tfrs_logq.proposal.log_complement`: ``Q(p)`` capped at ``1 - 1e-6``).
      is_negative: `[batch, num_candidates]` bool, True where the column counts
        as a negative of the row (False: accidental hit, duplicate, masked).
        The diagonal (the positive) never counts, whatever it holds. Defaults
        to None: every other column is a negative.
      num_negatives: `[batch]` number of negatives per row, if known more
        cheaply than by counting ``is_negative`` (only used by ``"corrected"``).
      numerator_log_q: bool. For ``"logq-tfrs"``, subtract ``log Q(p)`` in the
        numerator as well (TFRS does; a constant with zero gradient). Defaults to True.
      positive_logits: `[batch]` the diagonal ``scores[i, i]``, if the caller has it
        more cheaply (`tfrs_logq.tasks.positive_scores` computes it from the
        embeddings, so no `[batch, num_candidates]` gradient is built for it).
        Defaults to None: read off ``scores``.
      positives_masked: bool. ``is_negative`` is already False on the diagonal
        (true when accidental hits are removed: the positive has its own id), so
        the diagonal need not be masked again. Defaults to False.
      proposal: str. ``"per_draw"`` (default) or ``"inclusion"``: ``log_q`` holds
        inclusion probabilities ``log pi(d)``; ``"corrected"`` then excludes no
        ``Q(p)`` and weights with the Horvitz-Thompson normaliser (`corrected_weight`).

    Returns:
      `[batch]` per-example losses in the scores' dtype.

    Cost: the corrected loss makes one pass over ``scores`` to subtract ``log Q``,
    one ``where`` with ``is_negative`` and the log-sum-exp's passes (max, exp, sum;
    one multiply backward); its weight ``w`` and ``log(1 - Q(p))`` are `[batch]`.
    """
    check_correction(correction)
    check_proposal(proposal)
    dtype = scores.dtype
    batch = tf.shape(scores)[0]
    if positive_logits is not None:
        positive_logits = tf.cast(positive_logits, dtype)
    else:
        # diag_part of the rectangular matrix: entries (i, i), i < batch, without
        # slicing out (and, backward, padding back) a [batch, batch] block.
        positive_logits = tf.linalg.diag_part(scores)
    logits, diagonal = scores, positive_logits  # diagonal: s_p - log Q(p), or s_p
    if correction != "none":
        if log_q is None:
            raise ValueError(f"`log_q` is required for correction={correction!r}.")
        logits = scores - tf.cast(log_q, dtype)[None, :]
        if correction == "logq-tfrs":
            diagonal = positive_logits - tf.cast(log_q, dtype)[:batch]

    numerator = diagonal if correction == "logq-tfrs" and numerator_log_q else None
    if is_negative is None and correction in ("none", "logq-tfrs"):
        # No mask: the diagonal already holds the positive's denominator term.
        return loss_from_parts(correction, positive_logits, row_logsumexp(logits),
                               numerator=numerator)
    if is_negative is None:
        is_negative = off_diagonal(batch, tf.shape(scores)[1])
    elif not positives_masked:
        is_negative = tf.logical_and(is_negative, off_diagonal(batch, tf.shape(scores)[1]))
    negative_lse = kept_row_logsumexp(logits, is_negative)  # positive excluded
    if correction != "corrected":
        return loss_from_parts(correction, positive_logits, logaddexp(negative_lse, diagonal),
                               numerator=numerator)
    if num_negatives is None:
        num_negatives = tf.reduce_sum(tf.cast(is_negative, tf.int32), -1)
    if proposal == "per_draw":
        # log sum e^{s - log Q'} = log sum e^{s - log Q} + log(1 - Q(p)).
        negative_lse = negative_lse + log_complement(tf.cast(log_q, dtype)[:batch])
    return loss_from_parts(correction, positive_logits, negative_lse, num_valid=num_negatives,
                           proposal=proposal)


def hard_negative_softmax_loss(
    scores: tf.Tensor, log_q: Optional[tf.Tensor], is_negative: Optional[tf.Tensor],
    num_hard_negatives: int, correction: str, proposal: str = "per_draw",
) -> tf.Tensor:
    """`in_batch_softmax_loss` over each row's ``num_hard_negatives`` largest
    ``s_i - log Q(d_i)`` among its negatives (column ``i`` of row ``i`` is the positive
    and never one); ``"logq-tfrs"`` corrects the positive too, ``"logq-official"`` not."""
    check_correction(correction)
    dtype = scores.dtype
    num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
    adjusted = scores if log_q is None else scores - log_q[None, :]
    positives_out = off_diagonal(num_queries, num_candidates)
    counts = positives_out if is_negative is None else tf.logical_and(is_negative,
                                                                      positives_out)
    masked = masked_value(dtype)
    negatives = tf.where(counts, adjusted, masked)
    k = tf.minimum(int(num_hard_negatives), num_candidates)
    top, _ = tf.math.top_k(negatives, k=k, sorted=False)
    is_valid = top > masked / 2
    top = tf.where(is_valid, top, masked)
    positive_logits = tf.linalg.diag_part(scores)
    if correction == "corrected":
        lse = row_logsumexp(top)
        if proposal == "per_draw":
            lse = lse + log_complement(log_q[:num_queries])
        num_valid = tf.reduce_sum(tf.cast(is_valid, tf.int32), axis=-1)
        return loss_from_parts(correction, positive_logits, lse, num_valid=num_valid,
                               proposal=proposal)
    diagonal = tf.linalg.diag_part(adjusted) if correction == "logq-tfrs" else positive_logits
    lse = row_logsumexp(tf.concat([diagonal[:, None], top], axis=1))
    return loss_from_parts(correction, positive_logits, lse, numerator=diagonal)


def gbce_loss(
    positive_logits,
    negative_logits,
    *,
    sampling_rate: float,
    t: float,
    is_negative=None,
) -> tf.Tensor:
    """gSASRec's generalised binary cross-entropy (Petrov & Macdonald, RecSys 2023).

    ``-log(sigmoid(s_p)^beta) - sum_i log(1 - sigmoid(s_i))`` with
    ``beta = alpha (t (1 - 1/alpha) + 1/alpha)``, ``alpha`` the negative sampling
    rate ``k / (|I| - 1)``. ``t = 0`` gives ``beta = 1``: plain BCE (SASRec).

    Args:
      positive_logits: `[batch]`.
      negative_logits: `[batch, k]`.
      sampling_rate: float. ``alpha`` in (0, 1].
      t: float. Calibration parameter in [0, 1].
      is_negative: `[batch, k]` bool, False drops a negative (accidental hit).

    Returns:
      `[batch]` float32 losses.
    """
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"`sampling_rate` must be in (0, 1], received {sampling_rate!r}.")
    if not 0 <= t <= 1:
        raise ValueError(f"`t` must be in [0, 1], received {t!r}.")
    s_p = tf.cast(positive_logits, tf.float32)
    s_n = tf.cast(negative_logits, tf.float32)
    alpha = float(sampling_rate)
    beta = alpha * (t * (1.0 - 1.0 / alpha) + 1.0 / alpha)
    positive = beta * tf.nn.softplus(-s_p)  # -beta log sigmoid(s_p)
    negative = tf.nn.softplus(s_n)  # -log(1 - sigmoid(s_i))
    if is_negative is not None:
        negative = tf.where(is_negative, negative, tf.zeros_like(negative))
    return positive + tf.reduce_sum(negative, axis=-1)


def full_softmax_loss(logits, targets, *, exclude=None) -> tf.Tensor:
    """``-log softmax(logits)[target]`` over the whole catalog.

    Args:
      logits: `[batch, num_ids]` scores of every id.
      targets: `[batch]` int target ids.
      exclude: optional `[batch, num_ids]` or `[num_ids]` bool, True for ids that
        are not classes (padding). The target must not be excluded.
    """
    logits = tf.cast(logits, tf.float32)
    targets = tf.cast(targets, tf.int32)
    target_logits = tf.gather(logits, targets, batch_dims=1)
    if exclude is None:
        lse = row_logsumexp(logits)
    else:
        exclude = tf.broadcast_to(tf.convert_to_tensor(exclude), tf.shape(logits))
        lse = masked_row_logsumexp(logits, exclude)
    return lse - target_logits

__all__ = ["CORRECTIONS", "PROPOSALS", "STANDARD_FORMS", "check_correction",
           "check_proposal", "compute_dtype_for",
           "corrected_from_logsumexp", "corrected_weight", "full_softmax_loss", "gbce_loss",
           "hard_negative_softmax_loss", "in_batch_softmax_loss", "logaddexp",
           "loss_from_parts", "masked_row_logsumexp", "masked_value", "off_diagonal",
           "row_logsumexp", "sampled_softmax_loss"]
