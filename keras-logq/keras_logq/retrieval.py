"""`CorrectedRetrieval`: the retrieval loss on a score matrix, as a Keras 3 layer."""

from __future__ import annotations

import keras
from keras import ops

from keras_logq import losses
from keras_logq.masks import accidental_hit_mask, first_occurrence_mask

REDUCTIONS = ("sum_over_batch_size", "sum", "none")
# Q(p) is clipped below 1 before log(1 - Q(p)), as in tfrs_logq.
_MAX_POSITIVE_Q = 1.0 - 1e-6


def _on_diagonal(num_queries, num_candidates):
    rows = ops.arange(num_queries)[:, None]
    cols = ops.arange(num_candidates)[None, :]
    return ops.equal(rows, cols)


def _row_diagonal(values, on_diagonal):
    """`values[i, i]` for `[1 or batch, num_candidates]` values: `[batch]`."""
    zero = ops.zeros((), values.dtype)
    return ops.sum(ops.where(on_diagonal, values, zero), axis=1)


@keras.saving.register_keras_serializable(package="keras_logq")
class CorrectedRetrieval(keras.layers.Layer):
    """Sampled softmax retrieval loss with no, standard, or corrected logQ correction.

    Takes the score matrix of a batch: row ``i`` is query ``i``, column ``i`` its
    positive, the other columns its candidate negatives (the other rows'
    positives, then any extra sampled negatives shared by every row, so
    ``num_candidates >= batch_size``). With ``correction="corrected"``
    (Khrylchenko et al., RecSys 2025) the loss of row ``i`` with positive ``p``
    and negatives ``d_j`` is

    ```
    L = -w * (s_p - log sum_j exp(s_j - log Q'(d_j))),
    log Q'(d) = log Q(d) - log(1 - Q(p)),
    w = stop_gradient(1 - P),  P = e^{s_p} / (e^{s_p} + (1/n) sum_j exp(s_j - log Q'(d_j)))
    ```

    the sum over the row's ``n`` negatives. ``"logq"`` is the standard
    correction, ``-log softmax(s - log Q)[p]`` (TFRS's), and ``"none"`` the plain
    sampled softmax.

    Accidental hits (candidates with the row's positive id) are removed from
    the row's negatives, value and gradient (always for ``"corrected"``); with
    ``deduplicate=True`` only the first occurrence of an id counts as a
    negative.

    Args:
        correction: str. ``"none"``, ``"logq"`` or ``"corrected"``. Defaults to
            ``"corrected"``.
        remove_accidental_hits: bool. Drop the negatives whose id equals the
            row's positive id (needs ``candidate_ids``). Always on for
            ``"corrected"``. Defaults to `True`.
        deduplicate: bool. Count each id once as a negative (needs 1-D
            ``candidate_ids``). Defaults to `False`.
        temperature: float. Scores are divided by it. Defaults to `None`.
        reduction: str. ``"sum_over_batch_size"`` (the mean over the rows),
            ``"sum"`` or ``"none"`` (the `[batch_size]` losses). Defaults to
            ``"sum_over_batch_size"``.
        **kwargs: other `keras.layers.Layer` arguments (``name``, ``dtype``).

    Call arguments:
        scores: float tensor, `[batch_size, num_candidates]`. Any float dtype;
            the loss is computed in float32 (float64 for float64).
        candidate_ids: int tensor, `[num_candidates]` or
            `[batch_size, num_candidates]`. Required to remove hits or duplicates.
        candidate_log_q: float tensor, `[num_candidates]` or
            `[batch_size, num_candidates]`. ``log Q(d)``, the log per-draw
            probability that the sampler returns the candidate; column ``i``
            gives ``Q(p)`` of row ``i``. Required for ``"logq"`` and
            ``"corrected"``.
        is_negative: bool tensor, `[batch_size, num_candidates]`. `False` drops
            that candidate from the row's negatives (e.g. the other rows'
            positives when only sampled negatives should count). The diagonal
            is never a negative. Defaults to `None`.
        sample_weight: float tensor, `[batch_size]`. Defaults to `None`.

    Returns:
        The reduced loss, or `[batch_size]` losses for ``reduction="none"``.

    Example:

    ```python
    queries = query_tower(batch["user"])            # [batch_size, dim]
    items = item_tower(batch["item"])               # [batch_size, dim]
    scores = keras.ops.matmul(queries, keras.ops.transpose(items))
    loss = keras_logq.CorrectedRetrieval()(
        scores, candidate_ids=batch["item"], candidate_log_q=frequency(batch["item"])
    )
    ```
    """

    def __init__(
        self,
        correction: str = "corrected",
        remove_accidental_hits: bool = True,
        deduplicate: bool = False,
        temperature: float | None = None,
        reduction: str = "sum_over_batch_size",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if correction not in losses.CORRECTIONS:
            raise ValueError(
                f"`correction` must be one of {losses.CORRECTIONS}, received {correction!r}."
            )
        if reduction not in REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {REDUCTIONS}, received {reduction!r}.")
        if temperature is not None and not temperature > 0:
            raise ValueError(f"`temperature` must be positive, received {temperature!r}.")
        self.correction = correction
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.deduplicate = bool(deduplicate)
        self.temperature = None if temperature is None else float(temperature)
        self.reduction = reduction

    def call(
        self,
        scores,
        candidate_ids=None,
        candidate_log_q=None,
        is_negative=None,
        sample_weight=None,
    ):
        scores = ops.convert_to_tensor(scores)
        if len(ops.shape(scores)) != 2:
            raise ValueError(
                "`scores` must be `[batch_size, num_candidates]`, received shape "
                f"{tuple(ops.shape(scores))}."
            )
        dtype = losses.compute_dtype_for(scores)
        scores = ops.cast(scores, dtype)
        if self.temperature is not None:
            scores = scores / self.temperature
        num_queries, num_candidates = ops.shape(scores)
        on_diagonal = _on_diagonal(num_queries, num_candidates)
        positive_logits = _row_diagonal(scores, on_diagonal)

        negatives = ops.logical_not(on_diagonal)
        remove_hits = self.correction == "corrected" or self.remove_accidental_hits
        if (remove_hits or self.deduplicate) and candidate_ids is None:
            reason = (
                "correction='corrected' always removes accidental hits"
                if self.correction == "corrected"
                else "accidental hit removal or deduplication is on"
            )
            raise ValueError(f"`candidate_ids` is required: {reason}.")
        if remove_hits:
            ids = ops.convert_to_tensor(candidate_ids)
            ids_2d = ids[None, :] if len(ops.shape(ids)) == 1 else ids
            positive_ids = _row_diagonal(ids_2d, on_diagonal)
            negatives = ops.logical_and(negatives, accidental_hit_mask(positive_ids, ids))
        if self.deduplicate:
            ids = ops.convert_to_tensor(candidate_ids)
            if len(ops.shape(ids)) != 1:
                raise ValueError(
                    "`deduplicate=True` needs `candidate_ids` of shape `[num_candidates]`, "
                    f"received shape {tuple(ops.shape(ids))}."
                )
            negatives = ops.logical_and(negatives, first_occurrence_mask(ids)[None, :])
        if is_negative is not None:
            is_negative = ops.convert_to_tensor(is_negative)
            if keras.backend.standardize_dtype(is_negative.dtype) != "bool":
                raise ValueError(
                    f"`is_negative` must be bool, received dtype {is_negative.dtype}."
                )
            negatives = ops.logical_and(negatives, is_negative)

        if self.correction == "none":
            per_example = losses.sampled_softmax_loss(
                positive_logits, scores, correction="none", is_negative=negatives
            )
        else:
            if candidate_log_q is None:
                raise ValueError(
                    f"`candidate_log_q` is required for correction={self.correction!r}."
                )
            log_q = ops.cast(ops.convert_to_tensor(candidate_log_q), dtype)
            log_q_2d = log_q[None, :] if len(ops.shape(log_q)) == 1 else log_q
            positive_log_q = _row_diagonal(log_q_2d, on_diagonal)
            if self.correction == "logq":
                # TFRS's form: -log softmax(s - log Q)[p], i.e. log Q(p) in the numerator
                # too (a constant: the gradient is that of sampled_softmax_loss).
                per_example = losses.sampled_softmax_loss(
                    positive_logits, scores, correction="logq", negative_log_q=log_q,
                    positive_log_q=positive_log_q, is_negative=negatives,
                ) + positive_log_q
            else:
                q_positive = ops.minimum(ops.exp(positive_log_q), _MAX_POSITIVE_Q)
                log_q_prime = log_q_2d - ops.log1p(-q_positive)[:, None]
                per_example = losses.sampled_softmax_loss(
                    positive_logits, scores, correction="corrected",
                    negative_log_q=log_q_prime, is_negative=negatives,
                )
        return reduce_loss(per_example, self.reduction, sample_weight)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            correction=self.correction,
            remove_accidental_hits=self.remove_accidental_hits,
            deduplicate=self.deduplicate,
            temperature=self.temperature,
            reduction=self.reduction,
        )
        return config


def reduce_loss(per_example, reduction: str, sample_weight=None):
    """Weights and reduces `[batch_size]` losses (``"sum_over_batch_size"``: the mean)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}, received {reduction!r}.")
    if sample_weight is not None:
        per_example = per_example * ops.reshape(ops.cast(sample_weight, per_example.dtype), (-1,))
    if reduction == "none":
        return per_example
    total = ops.sum(per_example)
    if reduction == "sum":
        return total
    size = ops.cast(ops.shape(per_example)[0], per_example.dtype)
    return total / ops.maximum(size, 1.0)
