"""`CorrectedRetrieval`: a drop-in `tfrs.tasks.Retrieval` with the corrected logQ loss.

`CorrectedRetrieval.call` is a short pipeline of named steps, each tested on its own and
defined here above the task:

    scores = candidate_scores(queries, candidates, temperature)
    positives = positive_scores(queries, candidates, temperature)  # its diagonal, cheaply
    ids = coded_candidate_ids(candidate_ids)                 # strings -> int codes
    # cross_replica_negatives=True, several replicas: the global pool instead
    pool = cross_replica_candidates(num_queries, candidates, ids, log_q)
    is_negative, num_negatives = negative_mask(ids, ...)     # True = counts as a negative
    log_q = proposal_log_q(probability, log_probability)     # checked: Q <= 1
    per_example = losses.in_batch_softmax_loss(scores, positive_logits=positives, ...)
    loss = reduce_loss(per_example, reduction, sample_weight)

One mask convention throughout: ``is_negative[i, j]`` is True when candidate
``j`` counts as a negative of query ``i``. The positive (column ``i`` of row
``i``) never does, whatever the mask says.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq.losses import (
    check_correction,
    compute_dtype_for,
    hard_negative_softmax_loss,
    in_batch_softmax_loss,
    masked_value,
)
from tfrs_logq.proposal import (
    MIN_PROBABILITY,
    check_log_q,
    check_probability,
    inclusion_log_q,
)

REDUCTIONS = ("sum", "sum_over_batch_size", "none")


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
    first_occurrence: Optional[tuple[tf.Tensor, tf.Tensor]] = None,
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
      first_occurrence: ``(is_first, num_unique)`` as `first_occurrence_mask` gives them,
        when which copy of an id comes first is decided by another order than the
        columns' (`cross_replica_candidates`). Defaults to None: from ``candidate_ids``.

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
        is_first, num_unique = (first_occurrence if first_occurrence is not None
                                else first_occurrence_mask(candidate_ids))
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


def replicas_in_sync() -> int:
    """How many replicas compute this step together: 1 outside a replica of a strategy."""
    context = tf.distribute.get_replica_context()
    return 1 if context is None else int(context.num_replicas_in_sync)


def global_candidate_ids(candidate_ids) -> tf.Tensor:
    """`[num_candidates]` int64 keys that are equal on every replica exactly where the ids are:
    integers as they are, floats by their bits, strings by their 64-bit fingerprint
    (`tf.strings.to_hash_bucket_fast`, as the hashed frequency estimators key them; two
    distinct strings of one global batch collide with probability about ``n^2 / 2^64``).
    `coded_candidate_ids`' codes are the order of first appearance in one replica's batch,
    not comparable across replicas, and collectives do not carry strings."""
    ids = tf.convert_to_tensor(candidate_ids)
    if ids.shape.rank == 2 and ids.shape[1] == 1:
        ids = tf.reshape(ids, [-1])
    if ids.dtype == tf.string:
        return tf.strings.to_hash_bucket_fast(ids, (1 << 63) - 1)
    if ids.dtype.is_floating:  # equal exactly where the values are (0.0 is -0.0)
        return tf.bitcast(tf.cast(ids, tf.float64) + 0.0, tf.int64)
    if not ids.dtype.is_integer:
        raise ValueError(f"`candidate_ids` must be numbers or strings, received "
                         f"{ids.dtype.name}.")
    return tf.cast(ids, tf.int64)


@tf.custom_gradient
def _dense_gradient(x):
    """``x``, its gradient made dense: `tf.gather`'s is `tf.IndexedSlices`, which the
    gradient of `ReplicaContext.all_gather` (an all-reduce) cannot take."""
    return tf.identity(x), lambda upstream: tf.convert_to_tensor(upstream)


def first_occurrence_in_order(candidate_ids: tf.Tensor, order: tf.Tensor):
    """`first_occurrence_mask` of ids whose columns sit at positions ``order`` of another
    order (the one-device order of `cross_replica_candidates`): which copy of an id counts
    is decided there, so deduplication keeps the copy one device would keep."""
    in_order = tf.gather(candidate_ids, tf.math.invert_permutation(order))
    is_first, num_unique = first_occurrence_mask(in_order)
    return tf.gather(is_first, order), num_unique


def cross_replica_candidates(num_queries, candidate_embeddings, *columns,
                             score_mask: Optional[tf.Tensor] = None):
    """Every replica's candidates, for this replica's queries: the global in-batch pool.

    Called inside a replica of a strategy with several replicas in sync. Each replica's
    candidates are its ``num_queries`` positives, then its extra negatives; the pool on
    one device holding the concatenated global batch is every replica's positives (in
    replica order), then every replica's extras. This replica gets that pool with its own
    positives moved to the front, so that its row ``i``'s positive is still column ``i``
    (every step after this one is the one-device step); the loss of a row does not depend
    on the order of its negatives. `ReplicaContext.all_gather` is differentiable: a
    candidate's gradient from every replica's queries flows back to the replica that
    embedded it, so the replicas' summed gradients are the global batch's.

    Args:
      num_queries: this replica's number of queries.
      candidate_embeddings: `[num_candidates, dim]`, the first ``num_queries`` the positives.
      *columns: `[num_candidates]` tensors gathered the same way (ids, ``Q``), or None.
      score_mask: `[num_queries, num_candidates]` bool over this replica's candidates; the
        other replicas' candidates are kept (masked by id only: hits, deduplication).

    Returns:
      ``(embeddings, columns, score_mask, first_occurrence_order, num_global_queries)``:
      the pool's `[num_global_candidates, dim]` embeddings, its columns, the score mask
      widened to `[num_queries, num_global_candidates]` (None if not given), the
      `[num_global_candidates]` positions of the pool's columns in the one-device order
      (for `first_occurrence_mask` in that order) and the global number of queries.
    """
    context = tf.distribute.get_replica_context()
    embeddings = tf.convert_to_tensor(candidate_embeddings)
    num_queries = tf.cast(num_queries, tf.int32)
    num_candidates = tf.shape(embeddings)[0]
    sizes = context.all_gather(tf.stack([num_queries, num_candidates])[None, :], axis=0)
    queries_per, candidates_per = sizes[:, 0], sizes[:, 1]
    starts = tf.cumsum(candidates_per, exclusive=True)  # each replica's rows, gathered
    positives = tf.ragged.range(starts, starts + queries_per).flat_values
    extras = tf.ragged.range(starts + queries_per, starts + candidates_per).flat_values
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    own = tf.cumsum(queries_per, exclusive=True)[replica]  # our positives, one-device order
    total_queries = tf.reduce_sum(queries_per)
    # The pool's columns as positions in the one-device order: ours, the others', extras.
    order = tf.concat([tf.range(own, own + num_queries), tf.range(0, own),
                       tf.range(own + num_queries, total_queries),
                       tf.range(total_queries, total_queries + tf.size(extras))], axis=0)
    rows = tf.gather(tf.concat([positives, extras], axis=0), order)

    def pooled(value):
        if value is None:
            return None
        dtype = value.dtype
        if dtype == tf.bfloat16:  # the collectives carry no bfloat16: gathered as float32
            value = tf.cast(value, tf.float32)
        gathered = tf.gather(_dense_gradient(context.all_gather(value, axis=0)), rows)
        return tf.cast(gathered, dtype) if gathered.dtype != dtype else gathered

    pool_columns = [pooled(None if c is None else tf.convert_to_tensor(c)) for c in columns]
    if score_mask is not None:
        score_mask = tf.convert_to_tensor(score_mask)
        if score_mask.dtype != tf.bool:
            raise ValueError(f"`score_mask` must be bool, received {score_mask.dtype.name}.")
        mine = tf.logical_and(rows >= starts[replica], rows < starts[replica] + num_candidates)
        local = tf.where(mine, rows - starts[replica], 0)
        score_mask = tf.logical_or(tf.gather(score_mask, local, axis=1),
                                   tf.logical_not(mine)[None, :])
    return pooled(embeddings), pool_columns, score_mask, order, total_queries


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
    elif probability is not None:
        name = "candidate_sampling_probability"
        log_q = tf.cast(tf.convert_to_tensor(probability), dtype)
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
    if probability is not None and log_probability is None:
        return check_probability(log_q, name, min_probability)
    return check_log_q(log_q, name)


def reduce_loss(per_example: tf.Tensor, reduction: str, sample_weight=None,
                global_batch=None) -> tf.Tensor:
    """Weights and reduces `[num_queries]` losses.

    ``"sum"`` sums the replica's examples (TFRS; the replicas' gradients are then
    summed). ``"sum_over_batch_size"`` divides by the *global* batch size: ``global_batch``
    when the caller counted it (`cross_replica_candidates` does), else the replica's
    queries times the replicas in sync (as Keras losses do, `tf.nn.compute_average_loss`),
    so the update does not grow with the number of replicas. ``"none"`` returns the
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
    if global_batch is None:
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        global_batch = tf.size(per_example) * replicas
    return total / tf.maximum(tf.cast(global_batch, per_example.dtype), 1.0)


SAMPLING_PROBABILITIES = ("per_draw", "inclusion", "per_draw_to_inclusion")


_POSITIONS = "positions"


def index_identifiers_dtype(index):
    """What a TFRS top-k index returns as identifiers: their dtype; ``"positions"`` when
    it was built from embeddings alone (as TFRS's tutorials build it); None when this
    cannot be read (an index class of your own).

    `tfrs.layers.factorized_top_k.Streaming` over a dataset of embeddings and `ScaNN`
    without identifiers return positions; so does `BruteForce` indexed without
    identifiers, whose identifiers are then ``0..n-1`` as int32 (an index given exactly
    those int32 ids reads the same: they are its positions). Read when the metric's step is
    traced.
    """
    from tensorflow_recommenders.layers import factorized_top_k as top_k

    if isinstance(index, top_k.Streaming):
        dataset = getattr(index, "_candidates", None)
        spec = None if dataset is None else dataset.element_spec
        return spec[0].dtype if isinstance(spec, tuple) else _POSITIONS
    if isinstance(index, top_k.ScaNN):
        identifiers = getattr(index, "_identifiers", None)
        return _POSITIONS if identifiers is None else identifiers.dtype
    if isinstance(index, top_k.BruteForce):
        identifiers = getattr(index, "_identifiers", None)
        if identifiers is None:
            return _POSITIONS
        if identifiers.dtype == tf.int32:
            with tf.init_scope():
                values = np.asarray(identifiers.numpy()).reshape(-1)
            if np.array_equal(values, np.arange(values.size)):
                return _POSITIONS
        return identifiers.dtype
    return None


def metric_ids(metric, positive_ids: Optional[tf.Tensor],
               by_id: Optional[bool] = None) -> Optional[tf.Tensor]:
    """The ``true_candidate_ids`` a factorized metric gets: what stock TFRS gives it.

    The ids go to a `tfrs.metrics.FactorizedTopK` only when its index has identifiers
    (TFRS then matches by id); an index of embeddings alone gets none (TFRS then matches
    by score), since comparing ids with positions breaks (strings) or is silently wrong
    (integers). Integer ids are cast to the index's integer dtype. A metric whose index
    is not one of TFRS's (`index_identifiers_dtype` None), or that is not a
    `FactorizedTopK`, gets the ids, as in TFRS. ``by_id`` False gives no metric ids
    (score matching, as stock TFRS called without ids); True gives them to any index
    but one known to return positions.
    """
    if by_id is False or positive_ids is None:
        return None
    index = getattr(metric, "_candidates", None)
    if index is None:
        return positive_ids
    dtype = index_identifiers_dtype(index)
    if dtype is None:
        return positive_ids
    if dtype == _POSITIONS:
        if by_id and not isinstance(index, _tfrs_top_k().BruteForce):
            raise ValueError(
                f"metrics_by_id=True but the index of metric {metric.name!r} has no "
                "identifiers (it returns positions): index (id, embedding) pairs, e.g. "
                "FactorizedTopK(candidates=items.batch(128).map(lambda i: (i, item_model(i)))).")
        if not by_id:
            return None
        dtype = tf.int32
    if positive_ids.dtype == dtype:
        return positive_ids
    if positive_ids.dtype.is_integer and dtype.is_integer:
        return tf.cast(positive_ids, dtype)
    raise ValueError(
        f"the index of metric {metric.name!r} holds {dtype.name} identifiers but "
        f"`candidate_ids` are {positive_ids.dtype.name}: index the same ids as the task gets, "
        "e.g. FactorizedTopK(candidates=items.batch(128).map(lambda i: (i, item_model(i))))."
    )


def _tfrs_top_k():
    from tensorflow_recommenders.layers import factorized_top_k

    return factorized_top_k


class CorrectedRetrieval(tfrs.tasks.Retrieval):
    """Retrieval task with no, standard (two forms), or corrected logQ correction.

    Same call signature and in-batch semantics as `tfrs.tasks.Retrieval`: row
    ``i`` of ``query_embeddings`` has candidate ``i`` as its positive; every
    other candidate is a negative for that row, and candidates beyond the number
    of queries are extra negatives shared by all rows (e.g. uniform negatives for
    mixed negative sampling).

    With ``correction="corrected"`` (Khrylchenko et al., RecSys 2025) each row's loss is
    the corrected loss written out in `tfrs_logq.losses` (the formulas of every form
    live there): the positive is out of the denominator, the negatives are corrected
    with ``log Q'(d) = log Q(d) - log(1 - Q(p))`` (`tfrs_logq.proposal`), the row is
    weighted by ``w = stop_gradient(1 - P(p|u))``, and accidental hits (candidates
    with the positive's id) are always masked, so ``candidate_ids`` is required
    (integers or strings).
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

    ``Q`` is a per-draw probability by default (see `proposal_log_q`); values above
    1 are rejected. With ``deduplicate_candidates=True`` the paper's convention keeps
    the per-draw ``Q`` as given; ``sampling_probability="per_draw_to_inclusion"``
    replaces it by the exact probability that the ``num_queries`` in-batch draws
    include the candidate, ``1 - (1 - Q)^B`` (meant for pure in-batch negatives; for
    extra candidates from another sampler pass their log probability yourself).

    ``correction="none"`` and ``"logq-tfrs"`` reproduce stock TFRS (``Retrieval``
    without / with ``candidate_sampling_probability``) to the last bit of the
    formula, including the constant ``log Q(p)`` TFRS subtracts in the numerator.
    ``"logq-official"`` is standard logQ as the paper's official code computes it: the
    negatives corrected, the positive's logit not (numerator and denominator).

    The constructor is TFRS's (``loss``, ``metrics``, ... ``name``, positionally too) with
    this task's options after them, by keyword only.

    Args:
      loss: a Keras loss, as in TFRS: it replaces the cross-entropy over TFRS's logits
        (``correction="none"`` or ``"logq-tfrs"`` only; the other forms are losses of
        their own). Defaults to None: this task's loss, equal to TFRS's default.
      metrics: factorized top-k metrics, as in TFRS. A metric whose index was built
        from embeddings alone gets no ids (it matches by score, as in stock TFRS); one
        whose index has identifiers gets the positives' ids (`metric_ids`).
      batch_metrics: in-batch metrics, as in TFRS.
      loss_metrics: metrics fed the loss, as in TFRS.
      temperature: float. Logits are divided by it. Defaults to None.
      num_hard_negatives: int. Keep only the ``num_hard_negatives`` negatives
        with the largest corrected logits in each row. Defaults to None.
      remove_accidental_hits: bool. Mask accidental hits for ``"none"`` and the
        standard forms (always on for ``"corrected"``). Defaults to False.
      name: str. Task name.
      correction: str. ``"none"``, ``"logq-tfrs"`` (TFRS's standard logQ: the positive's
        logit corrected too), ``"logq-official"`` (the paper's code: the positive
        uncorrected) or ``"corrected"`` (`tfrs_logq.corrections`; a bare ``"logq"`` is
        refused). Stock ``Retrieval`` called with ``candidate_sampling_probability`` is
        ``"logq-tfrs"``, without it ``"none"``. Defaults to ``"corrected"``.
      deduplicate_candidates: bool. When True a candidate id that occurs more
        than once counts once as a negative (needs ``candidate_ids``).
        Defaults to False.
      reduction: str. ``"sum"`` (TFRS's behaviour), ``"sum_over_batch_size"``
        (divided by the global batch size) or ``"none"`` (per-example
        `[batch]` losses). Defaults to ``"sum"``.
      min_sampling_probability: float. ``candidate_sampling_probability`` is
        clipped to ``[min_sampling_probability, 1]`` before the log, as TFRS
        does with 1e-6. Lower it for catalogs with rarer items, or pass
        ``candidate_log_sampling_probability``. Defaults to 1e-6.
      sampling_probability: str. What the candidates' probabilities are
        (`SAMPLING_PROBABILITIES`): ``"per_draw"`` (default: ``Q(d)`` of one draw);
        ``"inclusion"``: ``pi(d)``, the chance ``d`` is among the row's candidates
        (your own deduplicated draws); ``"per_draw_to_inclusion"``: per-draw ``Q``
        that the task turns into ``pi = 1 - (1 - Q)^B`` (only with
        ``deduplicate_candidates``). With inclusion probabilities ``"corrected"``
        weights with the Horvitz-Thompson ``P(p|u)``
        (`tfrs_logq.losses.corrected_weight`); for extra per-draw negatives pass ``k Q``.
      metrics_by_id: bool. Whether factorized metrics match the positives by id. None
        (default): when their index has identifiers (`metric_ids`), so that ids passed
        for the loss never break an index of embeddings alone; False: never (score
        matching, as stock TFRS called without ``candidate_ids``); True: always.
      cross_replica_negatives: bool. Under a `tf.distribute` strategy with more than one
        replica in sync (`MirroredStrategy`, `MultiWorkerMirroredStrategy`), score each
        replica's queries against every replica's candidates (`cross_replica_candidates`,
        `ReplicaContext.all_gather`): a global batch of ``B`` split over ``R`` replicas
        gives each query ``B - 1`` in-batch negatives, not ``B / R - 1``, and ``Q'``, the
        weight ``1 - P`` and the accidental hits are those of the global pool; each
        replica's loss is then exactly its rows of the one-device loss on the concatenated
        global batch, and the replicas' summed gradients are that batch's. String ids are
        compared by their 64-bit fingerprint; ``score_mask`` is refused (a mask of one
        replica's candidates cannot say which of the others' to drop). Factorized metrics
        are unchanged;
        batch metrics see the global pool. Not on TPUs (replicas' batches of different
        sizes). Defaults to False (TFRS's behaviour: each replica's own negatives).
    """

    def __init__(
        self,
        loss: Optional[tf.keras.losses.Loss] = None,
        metrics: Optional[Sequence[tfrs.metrics.Factorized] | tfrs.metrics.Factorized] = None,
        batch_metrics: Optional[list[tf.keras.metrics.Metric]] = None,
        loss_metrics: Optional[list[tf.keras.metrics.Metric]] = None,
        temperature: Optional[float] = None,
        num_hard_negatives: Optional[int] = None,
        remove_accidental_hits: bool = False,
        name: Optional[str] = None,
        *,
        correction: str = "corrected",
        deduplicate_candidates: bool = False,
        reduction: str = "sum",
        min_sampling_probability: float = 1e-6,
        sampling_probability: str = "per_draw",
        metrics_by_id: Optional[bool] = None,
        cross_replica_negatives: bool = False,
    ) -> None:
        if isinstance(loss, str):
            raise TypeError(
                f"CorrectedRetrieval's first argument is TFRS's `loss` (a Keras loss), received "
                f"the string {loss!r}: pass the correction by name, "
                f"CorrectedRetrieval(correction={loss!r})."
            )
        if loss is not None:
            if correction not in ("none", "logq-tfrs"):
                raise ValueError(
                    f"`loss` replaces TFRS's cross-entropy and works with correction='none' or "
                    f"'logq-tfrs' only (the forms TFRS computes); received correction="
                    f"{correction!r}, whose loss is its own: drop `loss`."
                )
            if reduction != "sum":
                raise ValueError(
                    "`loss` reduces with its own reduction: leave `reduction` at 'sum' "
                    f"(received {reduction!r})."
                )
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
        if sampling_probability not in SAMPLING_PROBABILITIES:
            raise ValueError(f"`sampling_probability` must be one of "
                             f"{SAMPLING_PROBABILITIES}, received {sampling_probability!r}.")
        if sampling_probability == "per_draw_to_inclusion" and not deduplicate_candidates:
            raise ValueError("sampling_probability='per_draw_to_inclusion' is the chance a "
                             "deduplicated batch holds the candidate: pass "
                             "deduplicate_candidates=True.")
        super().__init__(
            loss=loss,
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
        self._sampling_probability = sampling_probability
        self._custom_loss = loss is not None
        # TFRS's own forms, reduced as TFRS reduces them, run TFRS's computation: the same
        # ops in the same order, so that weights trained through `model.fit` equal stock
        # TFRS's to the bit (a score-based top-1 metric turns any last-bit difference of
        # the towers into a different hit).
        self._stock_form = self._custom_loss or (
            correction in ("none", "logq-tfrs") and reduction == "sum"
            and not deduplicate_candidates and sampling_probability == "per_draw")
        if metrics_by_id not in (None, True, False):
            raise ValueError(f"`metrics_by_id` must be None, True or False, received "
                             f"{metrics_by_id!r}.")
        self._metrics_by_id = metrics_by_id
        if cross_replica_negatives not in (True, False):
            raise ValueError(f"`cross_replica_negatives` must be True or False, received "
                             f"{cross_replica_negatives!r}.")
        self._cross_replica_negatives = bool(cross_replica_negatives)
        self._warned_probability_ignored = False
        self._warned_one_replica = False

    @property
    def correction(self) -> str:
        return self._correction

    @property
    def proposal(self) -> str:
        """What ``log Q`` holds when the loss reads it (`tfrs_logq.losses.PROPOSALS`)."""
        return "per_draw" if self._sampling_probability == "per_draw" else "inclusion"

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
            sampling_probability=self._sampling_probability,
            metrics_by_id=self._metrics_by_id,
            cross_replica_negatives=self._cross_replica_negatives,
        )
        config.pop("trainable", None)
        config.pop("dtype", None)
        return config

    def __call__(self, *args, **kwargs):
        # Checked before Keras' Layer.__call__, which would wrap the one-line error in a
        # dump of every argument.
        call_kwargs = {k: v for k, v in kwargs.items() if k not in ("training", "mask")}
        bound = inspect.signature(self.call).bind_partial(*args, **call_kwargs).arguments
        self._check_inputs(bound.get("candidate_ids"),
                           bound.get("candidate_sampling_probability"),
                           bound.get("candidate_log_sampling_probability"))
        if self._correction != "none":  # known values: Q checked here too
            for key, check in (("candidate_sampling_probability", check_probability),
                               ("candidate_log_sampling_probability", check_log_q)):
                value = bound.get(key)
                if value is not None and tf.get_static_value(value) is not None:
                    check(tf.convert_to_tensor(value), key)
        return super().__call__(*args, **kwargs)

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
        self._check_inputs(candidate_ids, candidate_sampling_probability,
                           candidate_log_sampling_probability)
        num_local_candidates = candidate_embeddings.shape[0]
        query_embeddings = tf.convert_to_tensor(query_embeddings)
        candidate_embeddings = tf.convert_to_tensor(candidate_embeddings)
        dtype = (tf.float32 if query_embeddings.dtype != candidate_embeddings.dtype
                 else compute_dtype_for(query_embeddings))  # candidate_scores' dtype
        log_q = None
        if self._correction != "none":
            log_q = proposal_log_q(
                candidate_sampling_probability,
                candidate_log_sampling_probability,
                num_candidates=num_local_candidates,
                min_probability=self._min_sampling_probability,
                dtype=dtype,
                correction=self._correction,
            )
        ids = None
        metric_candidates = candidate_embeddings
        num_draws = tf.shape(query_embeddings)[0]
        first_occurrence = None
        gathered = self._gathers_replicas()
        if gathered:
            if score_mask is not None:
                raise ValueError(
                    "`score_mask` with cross_replica_negatives=True: a mask of this replica's "
                    "candidates says nothing of the other replicas' (their rows' positives, "
                    "their copies of shared negatives); pass shared negatives as candidates "
                    "without a mask, or cross_replica_negatives=False.")
            keys = None
            if candidate_ids is not None:
                coded_candidate_ids(candidate_ids, num_local_candidates)  # shape checked
                keys = global_candidate_ids(candidate_ids)
            num_local_queries = tf.shape(query_embeddings)[0]
            if (num_local_candidates is not None and query_embeddings.shape[0] is not None
                    and num_local_candidates < query_embeddings.shape[0]):
                candidate_scores(query_embeddings, candidate_embeddings)  # its one-line error
            candidate_embeddings, (ids, log_q), score_mask, order, num_draws = (
                cross_replica_candidates(num_local_queries, candidate_embeddings, keys, log_q,
                                         score_mask=score_mask))
            if ids is not None and self._deduplicate_candidates:
                first_occurrence = first_occurrence_in_order(ids, order)
        elif candidate_ids is not None:
            ids = coded_candidate_ids(candidate_ids, num_local_candidates)
        scores = candidate_scores(query_embeddings, candidate_embeddings, self._temperature)
        dtype = scores.dtype
        num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
        if log_q is not None and self._sampling_probability == "per_draw_to_inclusion":
            log_q = inclusion_log_q(log_q, num_draws)

        remove_hits = self._correction == "corrected" or self._remove_accidental_hits
        is_negative, num_negatives = negative_mask(
            ids, num_queries, num_candidates,
            remove_accidental_hits=remove_hits,
            deduplicate=self._deduplicate_candidates,
            score_mask=score_mask,
            first_occurrence=first_occurrence,
        )

        batch_logits = None
        if self._stock_form:
            per_example = None
            loss, batch_logits = self._stock_form_loss(scores, log_q, is_negative,
                                                       sample_weight)
        elif self._num_hard_negatives is None:
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
        if per_example is not None:
            loss = reduce_loss(per_example, self._reduction, sample_weight,
                               global_batch=num_draws if gathered else None)

        update_ops = self._update_metrics(
            loss, scores, log_q, is_negative, query_embeddings, metric_candidates,
            candidate_ids, sample_weight, compute_metrics, compute_batch_metrics,
            batch_logits,
        )
        with tf.control_dependencies([op for op in update_ops if op is not None]):
            return tf.identity(loss)

    def _gathers_replicas(self) -> bool:
        """Whether this call scores against every replica's candidates: the option is on and
        the call runs in a replica of a strategy with more than one in sync. With one, a
        warning (once): the option changes nothing there."""
        if not self._cross_replica_negatives:
            return False
        if replicas_in_sync() > 1:
            return True
        if not self._warned_one_replica:
            self._warned_one_replica = True
            warnings.warn(
                "cross_replica_negatives=True with one replica in sync: the negatives are this "
                "device's batch, as without it (it takes effect under a tf.distribute strategy "
                "with several replicas, inside strategy.run or model.fit).",
                UserWarning, stacklevel=4)
        return False

    def _check_inputs(self, candidate_ids, probability, log_probability) -> None:
        """One line naming every argument the correction needs and the call lacks."""
        has_q = probability is not None or log_probability is not None
        missing = []
        if candidate_ids is None and (self._correction == "corrected"
                                      or self._remove_accidental_hits
                                      or self._deduplicate_candidates):
            missing.append("`candidate_ids` (the candidates' ids, ints or strings: "
                           + ("'corrected' always masks accidental hits)"
                              if self._correction == "corrected"
                              else "accidental hit removal / deduplication is on)"))
        if self._correction != "none" and not has_q:
            missing.append("`candidate_sampling_probability` (Q(d) of each candidate, e.g. "
                           "tfrs_logq.ExactFrequency.from_dataset(item_ids).probability(ids))")
        if missing:
            stock = ("; for stock TFRS's loss without them, pass correction='none'"
                     if self._correction != "none" else "")
            raise ValueError(f"correction={self._correction!r} needs "
                             + " and ".join(missing) + stock + ".")
        if (self._correction == "none" and probability is not None
                and not self._warned_probability_ignored):
            self._warned_probability_ignored = True
            warnings.warn(
                "correction='none' ignores `candidate_sampling_probability`; stock TFRS applies "
                "its logQ correction when it is given: pass correction='logq-tfrs' for that.",
                UserWarning, stacklevel=3)

    def _stock_form_loss(self, scores, log_q, is_negative, sample_weight) -> tf.Tensor:
        """TFRS's computation (`tfrs.tasks.Retrieval.call`) with its loss or the user's:
        logits corrected by ``log Q`` for ``"logq-tfrs"`` (the positive's too), hits and
        ``score_mask`` masked, hard negatives mined, then ``loss(labels, logits)``.
        Returns the loss and ``(labels, logits)``, which TFRS hands its batch metrics."""
        num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
        labels = tf.eye(num_queries, num_candidates, dtype=scores.dtype)
        logits = scores if log_q is None else scores - log_q[None, :]
        if is_negative is not None:
            keep = tf.logical_or(is_negative, tf.cast(labels, tf.bool))
            logits = tf.where(keep, logits, masked_value(scores.dtype))
        if self._num_hard_negatives is not None:
            logits, labels = tfrs.layers.loss.HardNegativeMining(self._num_hard_negatives)(
                logits, labels)
        loss = self._loss(y_true=labels, y_pred=logits, sample_weight=sample_weight)
        return loss, (labels, logits)

    def _update_metrics(self, loss, scores, log_q, is_negative, query_embeddings,
                        candidate_embeddings, candidate_ids, sample_weight,
                        compute_metrics, compute_batch_metrics, batch_logits=None) -> list:
        update_ops = [metric.update_state(loss) for metric in self._loss_metrics]
        num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
        query_embeddings = tf.convert_to_tensor(query_embeddings)
        if compute_metrics and query_embeddings.shape.rank == 2:
            positive_ids = None
            if candidate_ids is not None:
                positive_ids = tf.reshape(tf.convert_to_tensor(candidate_ids),
                                          [-1])[:num_queries]
            for metric in self._factorized_metrics:
                update_ops.append(
                    metric.update_state(
                        query_embeddings,
                        tf.convert_to_tensor(candidate_embeddings)[:num_queries],
                        true_candidate_ids=metric_ids(metric, positive_ids,
                                                      self._metrics_by_id),
                        sample_weight=sample_weight,
                    )
                )
        if compute_batch_metrics and self._batch_metrics and batch_logits is not None:
            labels, logits = batch_logits  # TFRS's: after hard-negative mining
            for metric in self._batch_metrics:
                update_ops.append(
                    metric.update_state(labels, logits, sample_weight=sample_weight))
        elif compute_batch_metrics and self._batch_metrics:
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


__all__ = ["CorrectedRetrieval", "REDUCTIONS", "SAMPLING_PROBABILITIES", "candidate_scores",
           "coded_candidate_ids", "cross_replica_candidates", "first_occurrence_in_order",
           "first_occurrence_mask", "global_candidate_ids", "inclusion_log_q",
           "index_identifiers_dtype", "metric_ids", "negative_mask",
           "positive_scores", "proposal_log_q", "reduce_loss", "replicas_in_sync"]
