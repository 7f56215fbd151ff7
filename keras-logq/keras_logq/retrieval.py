"""Retrieval losses on a score matrix, as Keras 3 objects.

- `CorrectedRetrieval`: a layer, called from ``compute_loss`` (or anywhere) with
  the scores, the candidates' ids and their sampling probability.
- `CorrectedRetrievalLoss`: a `keras.losses.Loss` for ``model.compile(loss=...)``
  and for ``self.loss_fn(y_true, scores, sample_weight)`` in ``compute_loss``, the
  way Keras-RS's retrieval examples call their loss.

Both compute `retrieval_loss` (one loss per query). The sampling probability has
the names of TFRS and Keras-RS: ``candidate_sampling_probability`` (``Q``, clipped
to ``[min_sampling_probability, 1]`` before the log, as they do) or
``candidate_log_sampling_probability`` (``log Q``, tfrs_logq's name). One of
them, never both; ``Q > 1`` (``log Q > 0``) is refused (`losses.check_log_q`).
What that probability is, is ``sampling_probability`` (`SAMPLING_PROBABILITIES`,
tfrs_logq's `CorrectedRetrieval` argument): per draw (the default), an inclusion
probability, or per draw turned into the inclusion probability of the batch's draws.
"""
from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_logq import losses

REDUCTIONS = ("sum_over_batch_size", "sum", "none")
# What the candidates' sampling probabilities are, as in tfrs_logq.tasks.
SAMPLING_PROBABILITIES = ("per_draw", "inclusion", "per_draw_to_inclusion")


def _check_options(correction, temperature, min_sampling_probability, sampling_probability,
                   deduplicate) -> None:
    losses.check_correction(correction)
    if sampling_probability not in SAMPLING_PROBABILITIES:
        raise ValueError(f"`sampling_probability` must be one of {SAMPLING_PROBABILITIES}, "
                         f"received {str(sampling_probability)[:60]!r}.")
    if sampling_probability == "per_draw_to_inclusion" and not deduplicate:
        raise ValueError("sampling_probability='per_draw_to_inclusion' is the chance a "
                         "deduplicated batch holds the candidate: pass deduplicate=True.")
    if temperature is not None and not temperature > 0:
        raise ValueError(f"`temperature` must be positive, received {temperature!r}.")
    if not 0 < min_sampling_probability <= 1:
        raise ValueError(
            "`min_sampling_probability` must be in (0, 1], "
            f"received {min_sampling_probability!r}."
        )


def _scores(scores, temperature):
    scores = ops.convert_to_tensor(scores)
    if len(ops.shape(scores)) != 2:
        raise ValueError(
            "`scores` must be `[batch_size, num_candidates]`, received shape "
            f"{tuple(ops.shape(scores))}."
        )
    scores = ops.cast(scores, losses.compute_dtype_for(scores))
    return scores if temperature is None else scores / temperature


def _proposal(sampling_probability: str) -> str:
    """What ``log Q`` holds when the loss reads it (`losses.PROPOSALS`)."""
    return "per_draw" if sampling_probability == "per_draw" else "inclusion"


def _as_proposal(log_q, sampling_probability: str, num_queries):
    """``log Q`` as the loss reads it: ``per_draw_to_inclusion`` turns the per-draw ``Q``
    into ``pi = 1 - (1 - Q)^B``, ``B`` the number of queries (the batch's draws)."""
    if log_q is None or sampling_probability != "per_draw_to_inclusion":
        return log_q
    return losses.inclusion_log_q(log_q, num_queries)


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

    the sum over the row's ``n`` negatives. ``"logq-tfrs"`` is the standard
    correction as TFRS computes it, ``-log softmax(s - log Q)[p]`` (the positive's
    logit corrected too), ``"logq-official"`` the standard correction as the paper's
    official code computes it (the positive's logit uncorrected), and ``"none"`` the
    plain sampled softmax.

    Accidental hits (candidates with the row's positive id) are removed from
    the row's negatives, value and gradient (always for ``"corrected"``); with
    ``deduplicate=True`` only the first occurrence of an id counts as a
    negative.

    Args:
        correction: str. ``"none"``, ``"logq-tfrs"``, ``"logq-official"`` or
            ``"corrected"`` (a bare ``"logq"`` is refused). Defaults to
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
        min_sampling_probability: float. ``candidate_sampling_probability`` is
            clipped to ``[min_sampling_probability, 1]`` before the log (TFRS,
            Keras-RS). Defaults to 1e-6.
        sampling_probability: str. What the candidates' probabilities are
            (`SAMPLING_PROBABILITIES`, tfrs_logq's argument): ``"per_draw"``
            (``Q(d)`` of one draw); ``"inclusion"`` (``pi(d)``, the chance ``d``
            is among the row's candidates, e.g. your own deduplicated draws);
            ``"per_draw_to_inclusion"`` (per-draw ``Q`` that the loss turns into
            ``pi = 1 - (1 - Q)^B``, ``B = batch_size``; only with
            ``deduplicate=True``). With inclusion probabilities ``"corrected"``
            excludes no ``Q(p)`` and weights with the Horvitz-Thompson
            ``P(p|u)`` (`losses.corrected_weight`). Defaults to ``"per_draw"``.
        **kwargs: other `keras.layers.Layer` arguments (``name``, ``dtype``).

    Call arguments:
        scores: float tensor, `[batch_size, num_candidates]`. Any float dtype;
            the loss is computed in float32 (float64 for float64).
        candidate_ids: int tensor, `[num_candidates]` or
            `[batch_size, num_candidates]`. Required to remove hits or duplicates.
        candidate_log_sampling_probability: float tensor, `[num_candidates]` or
            `[batch_size, num_candidates]`. ``log Q(d)``, the log per-draw
            probability that the sampler returns the candidate (so at most 0;
            larger values are refused, `losses.check_log_q`); column ``i``
            gives ``Q(p)`` of row ``i``. tfrs_logq's name. This or
            ``candidate_sampling_probability`` is required for all corrections
            but ``"none"``.
        is_negative: bool tensor, `[batch_size, num_candidates]`. `False` drops
            that candidate from the row's negatives (e.g. the other rows'
            positives when only sampled negatives should count). The diagonal
            is never a negative. Defaults to `None`.
        sample_weight: float tensor, `[batch_size]`. Defaults to `None`.
        candidate_sampling_probability: float tensor, the shape of
            ``candidate_log_sampling_probability``. ``Q(d)`` itself, in
            ``[0, 1]`` (TFRS's and Keras-RS's name). Keyword only.

    Returns:
        The reduced loss, or `[batch_size]` losses for ``reduction="none"``.

    Example:

    ```python
    queries = query_tower(batch["user"])            # [batch_size, dim]
    items = item_tower(batch["item"])               # [batch_size, dim]
    scores = keras.ops.matmul(queries, keras.ops.transpose(items))
    loss = keras_logq.CorrectedRetrieval()(
        scores,
        candidate_ids=batch["item"],
        candidate_log_sampling_probability=frequency(batch["item"]),
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
        min_sampling_probability: float = losses.MIN_PROBABILITY,
        sampling_probability: str = "per_draw",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        _check_options(correction, temperature, min_sampling_probability, sampling_probability,
                       deduplicate)
        if reduction not in REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {REDUCTIONS}, received {reduction!r}.")
        self.correction = correction
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.deduplicate = bool(deduplicate)
        self.temperature = None if temperature is None else float(temperature)
        self.reduction = reduction
        self.min_sampling_probability = float(min_sampling_probability)
        self.sampling_probability = sampling_probability

    @property
    def proposal(self) -> str:
        """What ``log Q`` holds when the loss reads it (`losses.PROPOSALS`)."""
        return _proposal(self.sampling_probability)

    def call(
        self,
        scores,
        candidate_ids=None,
        candidate_log_sampling_probability=None,
        is_negative=None,
        sample_weight=None,
        *,
        candidate_sampling_probability=None,
    ):
        scores = _scores(scores, self.temperature)
        log_q = None
        if self.correction != "none":
            log_q = losses.resolve_log_q(
                candidate_sampling_probability, candidate_log_sampling_probability,
                min_sampling_probability=self.min_sampling_probability,
                dtype=losses.compute_dtype_for(scores),
            )
            log_q = _as_proposal(log_q, self.sampling_probability, ops.shape(scores)[0])
        per_example = losses.retrieval_loss(
            scores, correction=self.correction, log_q=log_q, candidate_ids=candidate_ids,
            is_negative=is_negative, remove_accidental_hits=self.remove_accidental_hits,
            deduplicate=self.deduplicate, proposal=self.proposal,
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
            min_sampling_probability=self.min_sampling_probability,
            sampling_probability=self.sampling_probability,
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
    size = ops.shape(per_example)[0]
    if isinstance(size, int):  # static: divided by a Python number, no tensor made from it
        return ops.divide(total, max(size, 1))
    return total / ops.maximum(ops.cast(size, per_example.dtype), 1.0)


_Y_TRUE_KEYS = ("labels", "mask", "candidate_ids", "candidate_sampling_probability",
                "candidate_log_sampling_probability")
_KERAS_REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none",
                     None)


@keras.saving.register_keras_serializable(package="keras_logq")
class CorrectedRetrievalLoss(keras.losses.Loss):
    """The retrieval loss of `CorrectedRetrieval` as a `keras.losses.Loss` (``y_true``, ``y_pred``).

    For ``model.compile(loss=...)``, and for ``self.loss_fn(y_true, scores,
    sample_weight)`` in ``compute_loss`` where Keras-RS's retrieval examples call
    ``keras.losses.CategoricalCrossentropy(from_logits=True)`` with
    ``labels = keras.ops.eye(batch_size, num_candidates)``. ``y_pred`` is the
    score matrix `[batch_size, num_candidates]`; the loss of a row with positive
    ``p`` and negatives ``d_j`` is, for ``correction="corrected"``,

    ```
    L = -w * (s_p - log sum_j exp(s_j - log Q'(d_j))),
    log Q'(d) = log Q(d) - log(1 - Q(p)),
    w = stop_gradient(1 - P),  P = e^{s_p} / (e^{s_p} + (1/n) sum_j exp(s_j - log Q'(d_j)))
    ```

    with accidental hits (candidates with the positive's id) out of the sum.

    ``y_true`` is one of:

    - a dict (Keras-RS's ranking losses take ``{"labels", "mask"}``; from
      ``compute_loss``): ``"labels"`` `[batch_size, num_candidates]`, the
      positive at each row's largest label (default: the diagonal, as
      ``eye``); ``"mask"`` `[batch_size, num_candidates]` bool, False drops a
      candidate from the row's negatives (`CorrectedRetrieval`'s
      ``is_negative``); ``"candidate_ids"`` `[num_candidates]` or
      `[batch_size, num_candidates]` int; ``"candidate_sampling_probability"``
      (``Q``) or ``"candidate_log_sampling_probability"`` (``log Q``), the
      shape of the ids. Integer ids keep their dtype (Keras's `Loss` would cast
      them to float, rounding ids above 2**24).
    - integer `[batch_size]`: the ids of the batch's positives, which are the
      candidates (in-batch negatives, ``num_candidates == batch_size``): the
      ``y`` of Keras-RS's retrieval examples. What ``model.compile(loss=...)``
      can pass: Keras gives a loss one ``y_true`` tensor per output.
    - float `[batch_size, num_candidates]`: ``labels`` alone.

    Without a sampling probability in ``y_true``, ``log Q`` of each candidate is
    looked up by id in ``item_log_sampling_probability`` (a fixed table, e.g. the
    training counts' ``log(count / total)``); every correction but ``"none"`` needs
    one of the two. ``Q > 1`` (``log Q > 0``) is refused (`losses.check_log_q`).

    Args:
        correction: str. ``"none"``, ``"logq-tfrs"``, ``"logq-official"`` or
            ``"corrected"`` (a bare ``"logq"`` is refused). Defaults to
            ``"corrected"``.
        remove_accidental_hits: bool. Always on for ``"corrected"``. Defaults to
            `True`.
        deduplicate: bool. Count each id once as a negative (1-D ids). Defaults
            to `False`.
        temperature: float. Scores are divided by it. Defaults to `None`.
        min_sampling_probability: float. ``Q`` is clipped to
            ``[min_sampling_probability, 1]`` before the log. Defaults to 1e-6.
        item_log_sampling_probability: float array, `[num_items]`. ``log Q`` of
            each item id, for ``y_true`` without a sampling probability. Saved
            in the config (a list). Defaults to `None`.
        sampling_probability: str. What the candidates' probabilities are
            (`SAMPLING_PROBABILITIES`, tfrs_logq's argument): ``"per_draw"``
            (``Q(d)`` of one draw); ``"inclusion"`` (``pi(d)``, the chance ``d``
            is among the row's candidates, e.g. your own deduplicated draws);
            ``"per_draw_to_inclusion"`` (per-draw ``Q`` that the loss turns into
            ``pi = 1 - (1 - Q)^B``, ``B = batch_size``; only with
            ``deduplicate=True``). With inclusion probabilities ``"corrected"``
            excludes no ``Q(p)`` and weights with the Horvitz-Thompson
            ``P(p|u)`` (`losses.corrected_weight`). Defaults to ``"per_draw"``.
        reduction: str. Keras's: ``"sum_over_batch_size"``, ``"sum"``,
            ``"mean"``, ``"mean_with_sample_weight"`` or ``"none"``. Defaults to
            ``"sum_over_batch_size"``.
        name: str. Defaults to `None`.
        dtype: the loss's output dtype. Defaults to `None` (``floatx``).

    Example:

    ```python
    log_q = np.log(counts / counts.sum())             # [num_items], per-draw log Q
    model.compile(optimizer="adam", loss=keras_logq.CorrectedRetrievalLoss(
        item_log_sampling_probability=log_q))
    model.fit(users, items)   # model(users) -> [batch, batch] scores of the batch's items

    # or in compute_loss, with log Q that the model computes:
    loss = self.loss_fn({"candidate_ids": items, "candidate_log_sampling_probability": lq},
                        scores, sample_weight)
    ```
    """

    def __init__(
        self,
        correction: str = "corrected",
        remove_accidental_hits: bool = True,
        deduplicate: bool = False,
        temperature: float | None = None,
        min_sampling_probability: float = losses.MIN_PROBABILITY,
        item_log_sampling_probability=None,
        sampling_probability: str = "per_draw",
        reduction: str | None = "sum_over_batch_size",
        name: str | None = None,
        dtype=None,
    ) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        _check_options(correction, temperature, min_sampling_probability, sampling_probability,
                       deduplicate)
        if reduction not in _KERAS_REDUCTIONS:
            raise ValueError(
                f"`reduction` must be one of {_KERAS_REDUCTIONS}, received {reduction!r}."
            )
        self.correction = correction
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.deduplicate = bool(deduplicate)
        self.temperature = None if temperature is None else float(temperature)
        self.min_sampling_probability = float(min_sampling_probability)
        self.sampling_probability = sampling_probability
        self.item_log_sampling_probability = None
        if item_log_sampling_probability is not None:
            table = np.asarray(item_log_sampling_probability, np.float32)
            if table.ndim != 1:
                raise ValueError("`item_log_sampling_probability` must be `[num_items]`, "
                                 f"received shape {table.shape}.")
            losses.check_log_q(table, "item_log_sampling_probability")
            self.item_log_sampling_probability = table

    @property
    def proposal(self) -> str:
        """What ``log Q`` holds when the loss reads it (`losses.PROPOSALS`)."""
        return _proposal(self.sampling_probability)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras's Loss.__call__ casts every y_true entry to the loss's float dtype,
        # which would round integer ids above 2**24: here each keeps its own.
        with keras.name_scope(self.name):
            per_example = self.call(y_true, y_pred)
            return _keras_reduce(per_example, self.reduction, sample_weight, self.dtype)

    def call(self, y_true, y_pred):
        scores = _scores(y_pred, self.temperature)
        fields = self._y_true_fields(y_true, scores)
        is_positive = None
        if fields.get("labels") is not None:
            is_positive = losses.positives_from_labels(fields["labels"], ops.shape(scores)[1])
        ids = fields.get("candidate_ids")
        log_q = None
        if self.correction != "none":
            log_q = losses.resolve_log_q(
                fields.get("candidate_sampling_probability"),
                fields.get("candidate_log_sampling_probability"),
                min_sampling_probability=self.min_sampling_probability,
                dtype=losses.compute_dtype_for(scores),
            )
            if log_q is None and self.item_log_sampling_probability is not None:
                if ids is None:
                    raise ValueError("`item_log_sampling_probability` needs the candidate ids "
                                     "in `y_true`.")
                log_q = ops.take(ops.convert_to_tensor(self.item_log_sampling_probability),
                                 ops.convert_to_tensor(ids), axis=0)
            log_q = _as_proposal(log_q, self.sampling_probability, ops.shape(scores)[0])
        return losses.retrieval_loss(
            scores, correction=self.correction, log_q=log_q, candidate_ids=ids,
            is_negative=fields.get("mask"), is_positive=is_positive,
            remove_accidental_hits=self.remove_accidental_hits, deduplicate=self.deduplicate,
            proposal=self.proposal,
        )

    @staticmethod
    def _y_true_fields(y_true, scores) -> dict:
        if isinstance(y_true, dict):
            unknown = sorted(set(y_true) - set(_Y_TRUE_KEYS))
            if unknown:
                raise ValueError(f"`y_true` has unknown keys {unknown}; expected some of "
                                 f"{list(_Y_TRUE_KEYS)}.")
            fields = dict(y_true)
            if fields.get("mask") is not None:
                fields["mask"] = ops.cast(fields["mask"], "bool")
            return fields
        y_true = ops.convert_to_tensor(y_true)
        kind = keras.backend.standardize_dtype(y_true.dtype)
        shape = tuple(ops.shape(y_true))
        if "int" in kind and len(shape) in (1, 2) and (len(shape) == 1 or shape[1] == 1):
            ids = ops.reshape(y_true, (-1,))
            num_queries, num_candidates = ops.shape(scores)
            if isinstance(num_candidates, int) and isinstance(num_queries, int) and (
                    num_candidates != num_queries):
                raise ValueError(
                    f"`y_true` holds {num_queries} positive ids but `y_pred` scores "
                    f"{num_candidates} candidates: with extra negatives pass a dict with "
                    "their `candidate_ids`."
                )
            return {"candidate_ids": ids}
        if len(shape) == 2:
            return {"labels": y_true}
        raise ValueError(
            "`y_true` must be a dict, integer ids `[batch_size]` or labels "
            f"`[batch_size, num_candidates]`, received dtype {kind} and shape {shape}."
        )

    def get_config(self) -> dict:
        config = super().get_config()
        table = self.item_log_sampling_probability
        config.update(
            correction=self.correction,
            remove_accidental_hits=self.remove_accidental_hits,
            deduplicate=self.deduplicate,
            temperature=self.temperature,
            min_sampling_probability=self.min_sampling_probability,
            item_log_sampling_probability=None if table is None else table.tolist(),
            sampling_probability=self.sampling_probability,
        )
        return config


def _keras_reduce(per_example, reduction, sample_weight, dtype):
    """Keras's reductions of `[batch_size]` losses, weighted by ``sample_weight``."""
    values = ops.cast(per_example, dtype)
    weights = None
    if sample_weight is not None:
        weights = ops.cast(ops.convert_to_tensor(sample_weight), dtype)
        if len(ops.shape(weights)) > 0:
            weights = ops.reshape(weights, (-1,))
        values = values * weights
    if reduction in (None, "none"):
        return values
    total = ops.sum(values)
    if reduction == "sum":
        return total
    if reduction == "mean_with_sample_weight" and weights is not None:
        denominator = ops.sum(ops.broadcast_to(weights, ops.shape(values)))
    else:
        denominator = ops.shape(values)[0]
        if isinstance(denominator, int):  # static: no tensor made from a Python number
            return ops.divide(total, max(denominator, 1))
        denominator = ops.cast(denominator, dtype)
    # As Keras's losses: 0 when the weights sum to 0 (a float16 1e-12 floor would be 0 too).
    return ops.divide_no_nan(total, denominator)
