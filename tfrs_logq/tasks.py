"""`CorrectedRetrieval`: a drop-in `tfrs.tasks.Retrieval` with the corrected logQ loss.

`CorrectedRetrieval.call` is a short pipeline of the named steps below, each
tested on its own:

    scores = candidate_scores(queries, candidates, temperature)
    positives = positive_scores(queries, candidates, temperature)  # its diagonal, cheaply
    ids = coded_candidate_ids(candidate_ids)                 # strings -> int codes
    is_negative, num_negatives = negative_mask(ids, ...)     # True = counts as a negative
    log_q = proposal_log_q(probability, log_probability)     # checked: Q <= 1
    per_example = losses.in_batch_softmax_loss(scores, positive_logits=positives, ...)
    loss = reduce_loss(per_example, reduction, sample_weight)

One mask convention throughout: ``is_negative[i, j]`` is True when candidate
``j`` counts as a negative of query ``i``. The positive (column ``i`` of row
``i``) never does, whatever the mask says.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq.losses import (
    PROPOSALS,
    check_correction,
    check_proposal,
    compute_dtype_for,
    hard_negative_softmax_loss,
    in_batch_softmax_loss,
    masked_value,
)
from tfrs_logq.proposal import (  # noqa: F401  (inclusion_log_q re-exported)
    MIN_PROBABILITY,
    inclusion_log_q,
    log_q_from_probability,
)

REDUCTIONS = ("sum", "sum_over_batch_size", "none")
DEDUPLICATED_PROPOSALS = PROPOSALS  # the name this module exported first
# Tolerance on Q <= 1 (float32 rounding of probabilities computed as counts / total).
_Q_TOLERANCE = 1e-5


def first_occurrence_mask(ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`[n]` bool, True at the first position of each distinct id; and the number of ids.

    >>> first_occurrence_mask(tf.constant([7, 3, 7, 5]))[0].numpy()
    array([ True,  True, False,  True])
    """
    unique, idx = tf.unique(ids)
    num_unique = tf.size(unique)
    positions = tf.range(tf.shape(ids)[0])
    first = tf.math.unsorted_segment_min(positions, idx, num_unique)
    return tf.equal(positions, tf.gather(first, idx)), num_unique


def candidate_scores(query_embeddings, candidate_embeddings, temperature=None) -> tf.Tensor:
    """`[num_queries, num_candidates]` scores in float32 (float64 for float64 inputs).

    The matmul runs in the embeddings' dtype (fast under mixed precision), the
    result is cast up. Rank-3 queries `[num_queries, heads, dim]` are scored by
    their best head (max-sim, as TFRS does). ``temperature`` divides the scores.
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
    num_queries, num_candidates = query_embeddings.shape[0], candidate_embeddings.shape[0]
    if num_queries is not None and num_candidates is not None and num_candidates < num_queries:
        raise ValueError(
            f"`candidate_embeddings` has {num_candidates} rows but there are {num_queries} "
            "queries: the first num_queries candidates are the positives, so "
            "num_candidates >= num_queries is required."
        )
    dtype = compute_dtype_for(scores)
    scores = tf.cast(scores, dtype)
    if temperature is not None:
        scores = scores / tf.cast(temperature, dtype)
    return scores


def positive_scores(query_embeddings, candidate_embeddings, temperature=None) -> tf.Tensor:
    """`[num_queries]` scores of each query's positive: the diagonal of `candidate_scores`.

    Computed from the embeddings (``<q_i, c_i>``, the best head for rank-3
    queries) in the scores' dtype, so that the loss needs no `[num_queries,
    num_candidates]` gradient to read the diagonal off the score matrix.
    """
    queries = tf.convert_to_tensor(query_embeddings)
    candidates = tf.convert_to_tensor(candidate_embeddings)
    dtype = compute_dtype_for(queries, candidates)
    queries, candidates = tf.cast(queries, dtype), tf.cast(candidates, dtype)
    positives = candidates[:tf.shape(queries)[0]]
    if queries.shape.rank == 3:
        scores = tf.reduce_max(tf.einsum("qne,qe->qn", queries, positives), axis=1)
    else:
        scores = tf.reduce_sum(queries * positives, axis=-1)
    if temperature is not None:
        scores = scores / tf.cast(temperature, dtype)
    return scores


def coded_candidate_ids(candidate_ids, num_candidates: Optional[int] = None) -> tf.Tensor:
    """Validates `[num_candidates]` ids and returns them as integers.

    Integer ids come back unchanged; any other dtype (TFRS users usually pass
    string ids) is replaced by int32 codes, equal exactly where the ids are equal,
    so that masks and counts can sort and binary-search them.
    """
    ids = tf.convert_to_tensor(candidate_ids)
    if ids.shape.rank == 2 and ids.shape[1] == 1:
        ids = tf.reshape(ids, [-1])
    if ids.shape.rank != 1:
        raise ValueError(f"`candidate_ids` must be `[num_candidates]`, received {ids.shape}.")
    if num_candidates is not None and ids.shape[0] not in (None, num_candidates):
        raise ValueError(
            f"`candidate_ids` has {ids.shape[0]} entries, expected one per candidate "
            f"({num_candidates})."
        )
    if not ids.dtype.is_integer:
        ids = tf.unique(ids).idx
    return ids


def negative_mask(
    candidate_ids: Optional[tf.Tensor],
    num_queries,
    num_candidates,
    *,
    remove_accidental_hits: bool,
    deduplicate: bool,
    score_mask: Optional[tf.Tensor] = None,
) -> tuple[Optional[tf.Tensor], Optional[tf.Tensor]]:
    """Which candidates count as negatives of each query, and how many.

    Args:
      candidate_ids: `[num_candidates]` integer ids (see `coded_candidate_ids`);
        required when ``remove_accidental_hits`` or ``deduplicate``.
      num_queries: number of queries (rows); candidate ``i`` is query ``i``'s positive.
      num_candidates: number of candidates (columns).
      remove_accidental_hits: a candidate with the row's positive id is not a negative.
      deduplicate: only the first occurrence of an id counts.
      score_mask: `[num_queries, num_candidates]` bool, False drops that negative.

    Returns:
      ``(is_negative, num_negatives)``: `[num_queries, num_candidates]` bool, or
      None when every candidate but the positive is a negative; and `[num_queries]`
      int32 counts when they are known without reducing the mask (else None).
      The diagonal of ``is_negative`` is only guaranteed False when accidental
      hits are removed; the loss ignores it in any case.

    Example: ids ``[4, 4, 9]``, two queries, hits removed:
      ``is_negative = [[F, F, T], [F, F, T]]``, ``num_negatives = [1, 1]``.
    """
    is_negative, num_negatives = None, None
    if remove_accidental_hits:
        positive_ids = candidate_ids[:num_queries]
        is_negative = tf.not_equal(positive_ids[:, None], candidate_ids[None, :])
        # Negatives per row = candidates minus those with the positive's id, counted by
        # binary search in the sorted ids instead of another pass over the mask.
        sorted_ids = tf.sort(candidate_ids)[None, :]
        bounds = [tf.searchsorted(sorted_ids, positive_ids[None, :], side=side)[0]
                  for side in ("left", "right")]
        num_negatives = num_candidates - tf.cast(bounds[1] - bounds[0], tf.int32)
    if deduplicate:
        is_first, num_unique = first_occurrence_mask(candidate_ids)
        is_first = tf.broadcast_to(is_first[None, :], [num_queries, num_candidates])
        is_negative = is_first if is_negative is None else tf.logical_and(is_negative, is_first)
        # With hits removed the negatives are the distinct ids but the positive's.
        num_negatives = (
            tf.fill([num_queries], num_unique - 1) if remove_accidental_hits else None
        )
    if score_mask is not None:
        score_mask = tf.convert_to_tensor(score_mask)
        if score_mask.dtype != tf.bool:
            raise ValueError(f"`score_mask` must be bool, received {score_mask.dtype.name}.")
        is_negative = score_mask if is_negative is None else tf.logical_and(is_negative, score_mask)
        num_negatives = None
    return is_negative, num_negatives


def _raise_if_concretely(condition, message: str) -> None:
    value = tf.get_static_value(condition)
    if value is not None and bool(np.any(value)):
        raise ValueError(message)


def proposal_log_q(
    probability=None,
    log_probability=None,
    *,
    num_candidates: Optional[int] = None,
    min_probability: float = MIN_PROBABILITY,
    dtype: tf.DType = tf.float32,
    correction: str = "logq-tfrs",
) -> tf.Tensor:
    """`[num_candidates]` ``log Q(d)``: the log per-draw proposal probability of each candidate.

    ``Q(d)`` is the probability that *one draw* of the sampler returns ``d``
    (for in-batch negatives, the item's share of all interactions: count / total),
    so ``Q <= 1`` and it sums to 1 over the catalog. Batch-level probabilities
    (``B * Q``, the chance to appear in a batch of ``B``) are not per-draw: they
    exceed 1 for popular items, which is rejected here, and they silently drive
    the corrected loss's weight ``w = 1 - P(p|u)`` to 0 otherwise.

    ``probability`` is clipped to ``[min_probability, 1]`` before the log (TFRS
    clips at 1e-6; `tfrs_logq.proposal.log_q_from_probability`); ``log_probability``
    is used as given.

    Raises:
      ValueError: neither given, a wrong shape, or (for concrete values)
        a probability outside [0, 1]. In a graph the same checks run as
        ``tf.debugging`` assertions (InvalidArgumentError with this message).
    """
    if log_probability is not None:
        name = "candidate_log_sampling_probability"
        log_q = tf.cast(tf.convert_to_tensor(log_probability), dtype)
        too_large = log_q > _Q_TOLERANCE
        limit = "log Q <= 0"
    elif probability is not None:
        name = "candidate_sampling_probability"
        q = tf.cast(tf.convert_to_tensor(probability), dtype)
        too_large = tf.logical_or(q > 1.0 + _Q_TOLERANCE, q < 0.0)
        limit = "0 <= Q <= 1"
        log_q = log_q_from_probability(q, min_probability)
    else:
        raise ValueError(
            f"correction={correction!r} needs `candidate_sampling_probability` "
            "(or `candidate_log_sampling_probability`); received neither."
        )
    if log_q.shape.rank == 2 and log_q.shape[1] == 1:
        log_q = tf.reshape(log_q, [-1])
    if log_q.shape.rank != 1:
        raise ValueError(f"`{name}` must be `[num_candidates]`, received {log_q.shape}.")
    if num_candidates is not None and log_q.shape[0] not in (None, num_candidates):
        raise ValueError(
            f"`{name}` has {log_q.shape[0]} entries, expected one per candidate "
            f"({num_candidates})."
        )
    message = (
        f"`{name}` must be a per-draw proposal probability ({limit}): the probability "
        "that one draw of the sampler returns the candidate (count / total interactions), "
        "not its chance to appear in a batch."
    )
    _raise_if_concretely(too_large, message)
    if not tf.executing_eagerly():
        with tf.control_dependencies(
            [tf.debugging.Assert(tf.logical_not(tf.reduce_any(too_large)), [message])]
        ):
            log_q = tf.identity(log_q)
    return log_q


def reduce_loss(per_example: tf.Tensor, reduction: str, sample_weight=None) -> tf.Tensor:
    """Weights and reduces `[num_queries]` losses.

    ``"sum"`` sums the replica's examples (TFRS; the replicas' gradients are then
    summed). ``"sum_over_batch_size"`` divides by the *global* batch size, i.e.
    the replica's queries times the replicas in sync (as Keras losses do), so
    the update does not grow with the number of replicas. ``"none"`` returns the
    weighted per-example losses.
    """
    if sample_weight is not None:
        sample_weight = tf.reshape(tf.cast(sample_weight, per_example.dtype), [-1])
        per_example = per_example * sample_weight
    if reduction == "none":
        return per_example
    total = tf.reduce_sum(per_example)
    if reduction == "sum":
        return total
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync if context is not None else 1
    global_batch = tf.cast(tf.size(per_example) * replicas, per_example.dtype)
    return total / tf.maximum(global_batch, 1.0)


class CorrectedRetrieval(tfrs.tasks.Retrieval):
    """Retrieval task with no, standard (two forms), or corrected logQ correction.

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

    where the sum runs over the row's ``n`` negatives: the positive is not in the
    denominator, and accidental hits (candidates with the positive's id) are
    always masked, so ``candidate_ids`` is required (integers or strings).
    Example: ``s_p = 2``, two negatives with ``s = 0, 1`` and ``Q(d) = 0.1, 0.2``,
    ``Q(p) = 0.5``: ``log Q' = log 0.2, log 0.4``, the sum is
    ``e^0/0.2 + e^1/0.4 = 11.80``, ``P = e^2 / (e^2 + 11.80/2) = 0.556``,
    loss ``= 0.444 * (log 11.80 - 2) = 0.208``. One query whose positive is
    candidate 0 and two extra candidates as its negatives:

    >>> task = CorrectedRetrieval()
    >>> loss = task(
    ...     query_embeddings=tf.constant([[1.0]]),
    ...     candidate_embeddings=tf.constant([[2.0], [0.0], [1.0]]),  # s = 2, 0, 1
    ...     candidate_sampling_probability=tf.constant([0.5, 0.1, 0.2]),
    ...     candidate_ids=tf.constant([7, 3, 5]))
    >>> round(float(loss), 3)
    0.208

    ``Q`` is a per-draw probability (see `proposal_log_q`); values above 1 are
    rejected. With ``deduplicate_candidates=True`` the paper's convention is kept
    by default (``deduplicated_proposal="per_draw"``: the per-draw ``Q`` as
    given); ``"inclusion"`` replaces it by the exact probability that the
    ``num_queries`` in-batch draws include the candidate, ``1 - (1 - Q)^B``
    (meant for pure in-batch negatives; for extra candidates from another sampler
    pass their log probability yourself).

    ``correction="none"`` and ``"logq-tfrs"`` reproduce stock TFRS (``Retrieval``
    without / with ``candidate_sampling_probability``) to the last bit of the
    formula, including the constant ``log Q(p)`` TFRS subtracts in the numerator.
    ``"logq-official"`` is standard logQ as the paper's official code computes it: the
    negatives corrected, the positive's logit not (numerator and denominator).

    Args:
      correction: str. ``"none"``, ``"logq-tfrs"`` (TFRS's standard logQ: the positive's
        logit corrected too), ``"logq-official"`` (the paper's code: the positive
        uncorrected) or ``"corrected"`` (`tfrs_logq.corrections`; a bare ``"logq"`` is
        refused). Defaults to ``"corrected"``.
      deduplicate_candidates: bool. When True a candidate id that occurs more
        than once counts once as a negative (needs ``candidate_ids``).
        Defaults to False.
      reduction: str. ``"sum"`` (TFRS's behaviour), ``"sum_over_batch_size"``
        (divided by the global batch size) or ``"none"`` (per-example
        `[batch]` losses). Defaults to ``"sum"``.
      metrics: factorized top-k metrics, as in TFRS.
      batch_metrics: in-batch metrics, as in TFRS.
      loss_metrics: metrics fed the loss, as in TFRS.
      temperature: float. Logits are divided by it. Defaults to None.
      num_hard_negatives: int. Keep only the ``num_hard_negatives`` negatives
        with the largest corrected logits in each row. Defaults to None.
      remove_accidental_hits: bool. Mask accidental hits for ``"none"`` and the
        standard forms (always on for ``"corrected"``). Defaults to False.
      min_sampling_probability: float. ``candidate_sampling_probability`` is
        clipped to ``[min_sampling_probability, 1]`` before the log, as TFRS
        does with 1e-6. Lower it for catalogs with rarer items, or pass
        ``candidate_log_sampling_probability``. Defaults to 1e-6.
      deduplicated_proposal: str. ``"per_draw"`` or ``"inclusion"``; only with
        ``deduplicate_candidates``. Defaults to ``"per_draw"``.
      sampling_probability: str. ``"per_draw"`` (default: ``Q(d)`` of one draw) or
        ``"inclusion"``: ``pi(d)``, the chance ``d`` is among the row's candidates
        (your own deduplicated draws; ``deduplicated_proposal="inclusion"`` implies
        it). ``"corrected"`` then weights with the Horvitz-Thompson ``P(p|u)``
        (`tfrs_logq.losses.corrected_weight`); for extra per-draw negatives pass ``k Q``.
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
        deduplicated_proposal: str = "per_draw",
        sampling_probability: str = "per_draw",
        name: Optional[str] = None,
    ) -> None:
        check_correction(correction)
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
        check_proposal(deduplicated_proposal, "deduplicated_proposal")
        check_proposal(sampling_probability, "sampling_probability")
        if sampling_probability == "inclusion" and deduplicated_proposal == "inclusion":
            raise ValueError("`deduplicated_proposal='inclusion'` computes inclusion "
                             "probabilities from per-draw ones: pass per-draw probabilities "
                             "with sampling_probability='per_draw'.")
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
        self._deduplicated_proposal = deduplicated_proposal
        self._sampling_probability = sampling_probability

    @property
    def correction(self) -> str:
        return self._correction

    @property
    def proposal(self) -> str:
        """What ``log Q`` holds when the loss reads it (`tfrs_logq.losses.PROPOSALS`)."""
        if self._sampling_probability == "inclusion" or (
                self._deduplicate_candidates and self._deduplicated_proposal == "inclusion"):
            return "inclusion"
        return "per_draw"

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
            deduplicated_proposal=self._deduplicated_proposal,
            sampling_probability=self._sampling_probability,
        )
        config.pop("trainable", None)
        config.pop("dtype", None)
        return config

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
          candidate_sampling_probability: `[num_candidates]` per-draw ``Q(d)``
            of each candidate under the proposal the negatives came from.
          candidate_ids: `[num_candidates]` ids (integers or strings), for
            accidental hits, deduplication and id-based factorized metrics.
          compute_metrics: update factorized metrics.
          compute_batch_metrics: update batch metrics.
          score_mask: `[num_queries, num_candidates]` bool, True where the
            candidate may count as a negative of the row (False drops it; the
            positive is unaffected).
          candidate_log_sampling_probability: `[num_candidates]` ``log Q(d)``,
            an alternative to ``candidate_sampling_probability`` that is not
            clipped.

        Returns:
          The reduced loss (scalar), or `[num_queries]` with ``reduction="none"``.
        """
        scores = candidate_scores(query_embeddings, candidate_embeddings, self._temperature)
        dtype = scores.dtype
        num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
        num_candidates_static = scores.shape[1]

        ids = None
        if candidate_ids is not None:
            ids = coded_candidate_ids(candidate_ids, num_candidates_static)
        remove_hits = self._correction == "corrected" or self._remove_accidental_hits
        if ids is None and (remove_hits or self._deduplicate_candidates):
            reason = (
                "correction='corrected' always masks accidental hits"
                if self._correction == "corrected"
                else "accidental hit removal / deduplication is enabled"
            )
            raise ValueError(f"`candidate_ids` is required: {reason}.")
        is_negative, num_negatives = negative_mask(
            ids, num_queries, num_candidates,
            remove_accidental_hits=remove_hits,
            deduplicate=self._deduplicate_candidates,
            score_mask=score_mask,
        )

        log_q = None
        if self._correction != "none":
            log_q = proposal_log_q(
                candidate_sampling_probability,
                candidate_log_sampling_probability,
                num_candidates=num_candidates_static,
                min_probability=self._min_sampling_probability,
                dtype=dtype,
                correction=self._correction,
            )
            if self._deduplicate_candidates and self._deduplicated_proposal == "inclusion":
                log_q = inclusion_log_q(log_q, num_queries)

        if self._num_hard_negatives is None:
            positives = positive_scores(query_embeddings, candidate_embeddings,
                                        self._temperature)
            per_example = in_batch_softmax_loss(
                scores, correction=self._correction, log_q=log_q,
                is_negative=is_negative, num_negatives=num_negatives,
                positive_logits=positives, positives_masked=remove_hits,
                proposal=self.proposal,
            )
        else:
            per_example = hard_negative_softmax_loss(
                scores, log_q, is_negative, self._num_hard_negatives, self._correction,
                self.proposal)
        loss = reduce_loss(per_example, self._reduction, sample_weight)

        update_ops = self._update_metrics(
            loss, scores, log_q, is_negative, query_embeddings, candidate_embeddings,
            candidate_ids, sample_weight, compute_metrics, compute_batch_metrics,
        )
        with tf.control_dependencies([op for op in update_ops if op is not None]):
            return tf.identity(loss)

    def _update_metrics(self, loss, scores, log_q, is_negative, query_embeddings,
                        candidate_embeddings, candidate_ids, sample_weight,
                        compute_metrics, compute_batch_metrics) -> list:
        update_ops = [metric.update_state(loss) for metric in self._loss_metrics]
        num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
        query_embeddings = tf.convert_to_tensor(query_embeddings)
        if compute_metrics and query_embeddings.shape.rank == 2:
            true_ids = None
            if candidate_ids is not None:
                true_ids = tf.reshape(tf.convert_to_tensor(candidate_ids), [-1])[:num_queries]
            for metric in self._factorized_metrics:
                update_ops.append(
                    metric.update_state(
                        query_embeddings,
                        tf.convert_to_tensor(candidate_embeddings)[:num_queries],
                        true_candidate_ids=true_ids,
                        sample_weight=sample_weight,
                    )
                )
        if compute_batch_metrics and self._batch_metrics:
            labels = tf.eye(num_queries, num_candidates, dtype=scores.dtype)
            metric_scores = scores if log_q is None else scores - log_q[None, :]
            if is_negative is not None:
                on_diagonal = tf.cast(labels, tf.bool)
                keep = tf.logical_or(is_negative, on_diagonal)
                metric_scores = tf.where(keep, metric_scores, masked_value(scores.dtype))
            for metric in self._batch_metrics:
                update_ops.append(
                    metric.update_state(labels, metric_scores, sample_weight=sample_weight)
                )
        return update_ops
