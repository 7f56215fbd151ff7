"""The steps of `tfrs_logq.tasks.CorrectedRetrieval.call`, each tested on its own:
scores, the positive's score, coded ids, the negative mask, the checked ``log Q`` and
the reduction. `tfrs_logq.tasks` is the public surface and re-exports them
(TF-Ranking's ``losses.py`` over ``losses_impl.py``).

One mask convention throughout: ``is_negative[i, j]`` is True when candidate
``j`` counts as a negative of query ``i``. The positive (column ``i`` of row
``i``) never does, whatever the mask says.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.losses import compute_dtype_for
from tfrs_logq.proposal import MIN_PROBABILITY, log_q_from_probability

REDUCTIONS = ("sum", "sum_over_batch_size", "none")
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


__all__ = ["REDUCTIONS", "candidate_scores", "coded_candidate_ids", "first_occurrence_mask",
           "negative_mask", "positive_scores", "proposal_log_q", "reduce_loss"]
