"""Negatives from every replica: the global in-batch pool under a `tf.distribute` strategy
(`CorrectedRetrieval(cross_replica_negatives=True)`).

`cross_replica_candidates` all-gathers every replica's candidate embeddings and columns
(ids, ``Q``) in the order one device would hold the concatenated global batch, with this
replica's positives first; `global_candidate_ids` keys ids equally on every replica;
`replicas_in_sync` says whether there is anything to gather. docs/scaling.md says what the
pool changes in ``Q'`` and in the weight.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf


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
