"""Which candidates count as a row's negatives: the task's masks, on integer-coded ids.

`coded_candidate_ids` turns any ids (strings, as TFRS users pass them) into integer codes;
`negative_mask` builds ``is_negative[i, j]`` (True: candidate ``j`` counts as a negative
of query ``i``; accidental hits, duplicates and a ``score_mask``'s False entries do not);
`first_occurrence_mask` marks the copy of each id that counts. The same module as
`keras_logq.masks`, for TensorFlow: both implement tests/reference.py's numpy masks.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf


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


def first_occurrence_in_order(candidate_ids: tf.Tensor, order: tf.Tensor):
    """`first_occurrence_mask` of ids whose columns sit at positions ``order`` of another
    order (the one-device order of `cross_replica_candidates`): which copy of an id counts
    is decided there, so deduplication keeps the copy one device would keep."""
    in_order = tf.gather(candidate_ids, tf.math.invert_permutation(order))
    is_first, num_unique = first_occurrence_mask(in_order)
    return tf.gather(is_first, order), num_unique
