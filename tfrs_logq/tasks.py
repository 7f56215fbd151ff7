"""`CorrectedRetrieval`: a drop-in `tfrs.tasks.Retrieval` with the corrected logQ loss."""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq.losses import (
    CORRECTIONS,
    compute_dtype_for,
    corrected_from_logsumexp,
    in_batch_softmax_loss,
    masked_value,
    row_logsumexp,
)

REDUCTIONS = ("sum", "sum_over_batch_size", "none")


def first_occurrence_mask(ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`[n]` bool, True at the first position of each distinct id; and the number of ids."""
    unique, idx = tf.unique(ids)
    num_unique = tf.size(unique)
    positions = tf.range(tf.shape(ids)[0])
    first = tf.math.unsorted_segment_min(positions, idx, num_unique)
    return tf.equal(positions, tf.gather(first, idx)), num_unique


class CorrectedRetrieval(tfrs.tasks.Retrieval):
    """Retrieval task with no, standard, or corrected logQ correction.

    Same call signature and in-batch semantics as `tfrs.tasks.Retrieval`: row
    ``i`` of ``query_embeddings`` has candidate ``i`` as its positive; every
    other candidate is a negative for that row, and candidates beyond the number
    of queries are extra negatives shared by all rows (e.g. uniform negatives for
    mixed negative sampling).

    With ``correction="corrected"`` (Khrylchenko et al., RecSys 2025) the loss of
    row ``i`` with positive ``p`` is

        -w * (s_p - log sum_j e^{s_j - log Q'(d_j)}),
        log Q'(d) = log Q(d) - log(1 - Q(p)),
        w = stop_gradient(1 - P),  P = e^{s_p} / (e^{s_p} + (1/n) sum_j e^{s_j - log Q'(d_j)}),

    where the sum runs over the row's ``n`` valid negatives: the positive is not
    in the denominator, accidental hits (candidates with the positive's id) are
    always masked, so ``candidate_ids`` is required.

    ``correction="none"`` and ``"logq"`` reproduce stock TFRS (``Retrieval``
    without / with ``candidate_sampling_probability``) to the last bit of the
    formula, including the constant ``log Q(p)`` TFRS subtracts in the numerator.

    Args:
      correction: str. ``"none"``, ``"logq"`` or ``"corrected"``. Defaults to
        ``"corrected"``.
      deduplicate_candidates: bool. When True a candidate id that occurs more
        than once counts once as a negative (needs ``candidate_ids``).
        Defaults to False.
      reduction: str. ``"sum"`` (TFRS's behaviour), ``"sum_over_batch_size"``
        or ``"none"`` (per-example `[batch]` losses). Defaults to ``"sum"``.
      metrics: factorized top-k metrics, as in TFRS.
      batch_metrics: in-batch metrics, as in TFRS.
      loss_metrics: metrics fed the loss, as in TFRS.
      temperature: float. Logits are divided by it. Defaults to None.
      num_hard_negatives: int. Keep only the ``num_hard_negatives`` negatives
        with the largest corrected logits in each row. Defaults to None.
      remove_accidental_hits: bool. Mask accidental hits for ``"none"`` and
        ``"logq"`` (always on for ``"corrected"``). Defaults to False.
      min_sampling_probability: float. ``candidate_sampling_probability`` is
        clipped to ``[min_sampling_probability, 1]`` before the log, as TFRS
        does with 1e-6. Lower it for catalogs with rarer items, or pass
        ``candidate_log_sampling_probability``. Defaults to 1e-6.
      name: str. Task name.
    """

    def __init__(
        self,
        correction: str = "corrected",
        deduplicate_candidates: bool = False,
        reduction: str = "sum",
        metrics: Optional[Sequence[tfrs.metrics.Factorized] | tfrs.metrics.Factorized] = None,
        batch_metrics: Optional[list[tf.keras.metrics.Metric]] = None,
        loss_metrics: Optional[list[tf.keras.metrics.Metric]] = None,
        temperature: Optional[float] = None,
        num_hard_negatives: Optional[int] = None,
        remove_accidental_hits: bool = False,
        min_sampling_probability: float = 1e-6,
        name: Optional[str] = None,
    ) -> None:
        if correction not in CORRECTIONS:
            raise ValueError(
                f"`correction` must be one of {CORRECTIONS}, received {correction!r}."
            )
        if reduction not in REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {REDUCTIONS}, received {reduction!r}.")
        if temperature is not None and not temperature > 0:
            raise ValueError(f"`temperature` must be positive, received {temperature!r}.")
        if num_hard_negatives is not None and int(num_hard_negatives) < 1:
            raise ValueError(
                f"`num_hard_negatives` must be a positive int, received {num_hard_negatives!r}."
            )
        if not 0 < min_sampling_probability <= 1:
            raise ValueError(
                "`min_sampling_probability` must be in (0, 1], "
                f"received {min_sampling_probability!r}."
            )
        super().__init__(
            metrics=metrics,
            batch_metrics=batch_metrics,
            loss_metrics=loss_metrics,
            temperature=temperature,
            num_hard_negatives=num_hard_negatives,
            remove_accidental_hits=remove_accidental_hits,
            name=name,
        )
        # Keep the embeddings' dtype: scores are computed in it (fast half-precision
        # matmuls under mixed precision) and the loss in float32.
        self._autocast = False
        self._correction = correction
        self._deduplicate_candidates = bool(deduplicate_candidates)
        self._reduction = reduction
        self._min_sampling_probability = float(min_sampling_probability)

    @property
    def correction(self) -> str:
        return self._correction

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            correction=self._correction,
            deduplicate_candidates=self._deduplicate_candidates,
            reduction=self._reduction,
            temperature=self._temperature,
            num_hard_negatives=self._num_hard_negatives,
            remove_accidental_hits=self._remove_accidental_hits,
            min_sampling_probability=self._min_sampling_probability,
        )
        config.pop("trainable", None)
        config.pop("dtype", None)
        return config

    def _candidate_log_q(self, probability, log_probability, num_candidates, dtype):
        if log_probability is not None:
            log_q = tf.cast(tf.convert_to_tensor(log_probability), dtype)
            name = "candidate_log_sampling_probability"
        elif probability is not None:
            q = tf.cast(tf.convert_to_tensor(probability), dtype)
            log_q = tf.math.log(tf.clip_by_value(q, self._min_sampling_probability, 1.0))
            name = "candidate_sampling_probability"
        else:
            raise ValueError(
                f"correction={self._correction!r} needs `candidate_sampling_probability` "
                "(or `candidate_log_sampling_probability`); received neither."
            )
        log_q = tf.reshape(log_q, [-1]) if log_q.shape.rank == 2 and log_q.shape[1] == 1 else log_q
        if log_q.shape.rank != 1:
            raise ValueError(f"`{name}` must be `[num_candidates]`, received {log_q.shape}.")
        if num_candidates is not None and log_q.shape[0] not in (None, num_candidates):
            raise ValueError(
                f"`{name}` has {log_q.shape[0]} entries, expected one per candidate "
                f"({num_candidates})."
            )
        return log_q

    def call(
        self,
        query_embeddings: tf.Tensor,
        candidate_embeddings: tf.Tensor,
        sample_weight: Optional[tf.Tensor] = None,
        candidate_sampling_probability: Optional[tf.Tensor] = None,
        candidate_ids: Optional[tf.Tensor] = None,
        compute_metrics: bool = True,
        compute_batch_metrics: bool = True,
        score_mask: Optional[tf.Tensor] = None,
        candidate_log_sampling_probability: Optional[tf.Tensor] = None,
    ) -> tf.Tensor:
        """Computes the loss and updates the metrics.

        Args:
          query_embeddings: `[num_queries, dim]` (or `[num_queries, heads, dim]`
            for max-sim scoring, as in TFRS).
          candidate_embeddings: `[num_candidates, dim]`, ``num_candidates >=
            num_queries``; the first ``num_queries`` are the positives.
          sample_weight: `[num_queries]` per-example weights.
          candidate_sampling_probability: `[num_candidates]` ``Q(d)`` of each
            candidate under the proposal the negatives came from.
          candidate_ids: `[num_candidates]` ids, for accidental hits,
            deduplication and id-based factorized metrics.
          compute_metrics: update factorized metrics.
          compute_batch_metrics: update batch metrics.
          score_mask: `[num_queries, num_candidates]` bool, False excludes that
            candidate as a negative of that row (the positive is unaffected).
          candidate_log_sampling_probability: `[num_candidates]` ``log Q(d)``,
            an alternative to ``candidate_sampling_probability`` that is not
            clipped.

        Returns:
          The reduced loss (scalar), or `[num_queries]` with ``reduction="none"``.
        """
        query_embeddings = tf.convert_to_tensor(query_embeddings)
        candidate_embeddings = tf.convert_to_tensor(candidate_embeddings)
        if query_embeddings.dtype != candidate_embeddings.dtype:
            query_embeddings = tf.cast(query_embeddings, tf.float32)
            candidate_embeddings = tf.cast(candidate_embeddings, tf.float32)
        if query_embeddings.shape.rank == 3:
            scores = tf.reduce_max(
                tf.einsum("qne,ce->qnc", query_embeddings, candidate_embeddings), axis=1
            )
        elif query_embeddings.shape.rank == 2:
            scores = tf.linalg.matmul(query_embeddings, candidate_embeddings, transpose_b=True)
        else:
            raise ValueError(
                "`query_embeddings` must be `[num_queries, dim]` or `[num_queries, heads, dim]`, "
                f"received shape {query_embeddings.shape.as_list()}."
            )
        num_queries_static = query_embeddings.shape[0]
        num_candidates_static = candidate_embeddings.shape[0]
        if (
            num_queries_static is not None
            and num_candidates_static is not None
            and num_candidates_static < num_queries_static
        ):
            raise ValueError(
                f"`candidate_embeddings` has {num_candidates_static} rows but there are "
                f"{num_queries_static} queries: the first num_queries candidates are the "
                "positives, so num_candidates >= num_queries is required."
            )
        dtype = compute_dtype_for(scores)
        scores = tf.cast(scores, dtype)
        num_queries = tf.shape(scores)[0]
        num_candidates = tf.shape(scores)[1]
        if self._temperature is not None:
            scores = scores / tf.cast(self._temperature, dtype)

        needs_ids = (
            self._correction == "corrected"
            or self._remove_accidental_hits
            or self._deduplicate_candidates
        )
        if candidate_ids is not None:
            candidate_ids = tf.convert_to_tensor(candidate_ids)
            if candidate_ids.shape.rank == 2 and candidate_ids.shape[1] == 1:
                candidate_ids = tf.reshape(candidate_ids, [-1])
            if candidate_ids.shape.rank != 1:
                raise ValueError(
                    f"`candidate_ids` must be `[num_candidates]`, received {candidate_ids.shape}."
                )
            if num_candidates_static is not None and candidate_ids.shape[0] not in (
                None,
                num_candidates_static,
            ):
                raise ValueError(
                    f"`candidate_ids` has {candidate_ids.shape[0]} entries, expected one per "
                    f"candidate ({num_candidates_static})."
                )
        elif needs_ids:
            reason = (
                "correction='corrected' always masks accidental hits"
                if self._correction == "corrected"
                else "accidental hit removal / deduplication is enabled"
            )
            raise ValueError(f"`candidate_ids` is required: {reason}.")

        # `exclude`: True where a column is not a negative of the row. Only the
        # masks that are asked for are built; each is one [batch, candidates] pass.
        exclude = None
        exclude_includes_positive = False
        num_valid = None
        if candidate_ids is not None and (
            self._correction == "corrected" or self._remove_accidental_hits
        ):
            positive_ids = candidate_ids[:num_queries]
            exclude = tf.equal(positive_ids[:, None], candidate_ids[None, :])
            exclude_includes_positive = True  # a positive always hits itself
            # Valid negatives per row = candidates minus those sharing the positive's
            # id, counted by binary search in the sorted ids (XLA-compatible)
            # instead of another pass over the [batch, candidates] mask.
            sorted_ids = tf.sort(candidate_ids)[None, :]
            bounds = [tf.searchsorted(sorted_ids, positive_ids[None, :], side=side)[0]
                      for side in ("left", "right")]
            num_valid = num_candidates - tf.cast(bounds[1] - bounds[0], tf.int32)
        if self._deduplicate_candidates:
            is_first, num_unique = first_occurrence_mask(candidate_ids)
            duplicate = tf.logical_not(is_first)[None, :]
            exclude = duplicate if exclude is None else tf.logical_or(exclude, duplicate)
            # With hits masked, the valid negatives are the distinct ids but the positive's.
            num_valid = (
                tf.fill([num_queries], num_unique - 1) if exclude_includes_positive else None
            )
        if score_mask is not None:
            score_mask = tf.convert_to_tensor(score_mask)
            if score_mask.dtype != tf.bool:
                raise ValueError(f"`score_mask` must be bool, received {score_mask.dtype.name}.")
            dropped = tf.logical_not(score_mask)
            if exclude_includes_positive:
                exclude = tf.logical_or(exclude, dropped)
            else:
                # The positive is unaffected by score_mask.
                on_diagonal = tf.cast(tf.eye(num_queries, num_candidates), tf.bool)
                dropped = tf.logical_and(dropped, tf.logical_not(on_diagonal))
                exclude = dropped if exclude is None else tf.logical_or(exclude, dropped)
            num_valid = None

        log_q = None
        if self._correction != "none":
            log_q = self._candidate_log_q(
                candidate_sampling_probability,
                candidate_log_sampling_probability,
                num_candidates_static,
                dtype,
            )

        if self._num_hard_negatives is None:
            per_example = in_batch_softmax_loss(
                scores,
                correction=self._correction,
                log_q=log_q,
                exclude=exclude,
                exclude_includes_positive=exclude_includes_positive,
                num_valid=num_valid,
            )
        else:
            per_example = self._hard_negative_loss(scores, log_q, exclude, num_candidates)

        if sample_weight is not None:
            sample_weight = tf.reshape(tf.cast(sample_weight, dtype), [-1])
            per_example = per_example * sample_weight
        if self._reduction == "none":
            loss = per_example
        elif self._reduction == "sum":
            loss = tf.reduce_sum(per_example)
        else:
            loss = tf.reduce_sum(per_example) / tf.cast(num_queries, dtype)

        update_ops = []
        for metric in self._loss_metrics:
            update_ops.append(metric.update_state(loss))
        if compute_metrics and query_embeddings.shape.rank == 2:
            true_ids = None if candidate_ids is None else candidate_ids[:num_queries]
            for metric in self._factorized_metrics:
                update_ops.append(
                    metric.update_state(
                        query_embeddings,
                        candidate_embeddings[:num_queries],
                        true_candidate_ids=true_ids,
                        sample_weight=sample_weight,
                    )
                )
        if compute_batch_metrics and self._batch_metrics:
            labels = tf.eye(num_queries, num_candidates, dtype=dtype)
            metric_scores = scores if log_q is None else scores - log_q[None, :]
            if exclude is not None:
                diagonal = tf.linalg.diag_part(metric_scores[:, :num_queries])
                metric_scores = tf.where(exclude, masked_value(dtype), metric_scores)
                metric_scores = tf.linalg.set_diag(metric_scores, diagonal)
            for metric in self._batch_metrics:
                update_ops.append(
                    metric.update_state(labels, metric_scores, sample_weight=sample_weight)
                )
        with tf.control_dependencies([op for op in update_ops if op is not None]):
            return tf.identity(loss)

    def _hard_negative_loss(self, scores, log_q, exclude, num_candidates):
        """Keeps each row's ``num_hard_negatives`` largest corrected negative logits."""
        dtype = scores.dtype
        num_queries = tf.shape(scores)[0]
        adjusted = scores if log_q is None else scores - log_q[None, :]
        on_diagonal = tf.cast(tf.eye(num_queries, num_candidates), tf.bool)
        not_negative = on_diagonal if exclude is None else tf.logical_or(exclude, on_diagonal)
        masked = masked_value(dtype)
        negatives = tf.where(not_negative, masked, adjusted)
        k = tf.minimum(int(self._num_hard_negatives), num_candidates)
        top, _ = tf.math.top_k(negatives, k=k, sorted=False)
        is_valid = top > masked / 2
        top = tf.where(is_valid, top, masked)
        positive_logits = tf.linalg.diag_part(scores[:, :num_queries])
        if self._correction == "corrected":
            q_positive = tf.minimum(tf.exp(log_q[:num_queries]), 1.0 - 1e-6)
            lse = row_logsumexp(top) + tf.math.log1p(-q_positive)
            num_valid = tf.reduce_sum(tf.cast(is_valid, tf.int32), axis=-1)
            return corrected_from_logsumexp(positive_logits, lse, num_valid)
        diagonal = tf.linalg.diag_part(adjusted[:, :num_queries])
        lse = row_logsumexp(tf.concat([diagonal[:, None], top], axis=1))
        return lse - (diagonal if self._correction == "logq" else positive_logits)
