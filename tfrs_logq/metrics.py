"""Full-catalog retrieval metrics: Recall@k and NDCG@k by exact (brute-force) ranking.

The one implementation of ranks, Recall and NDCG in the package: training's
evaluation, the serving client and the Beam Evaluator call these; and of the items'
popularity deciles (`popularity_deciles`), by which ``diagnose`` and the Beam
Evaluator slice their figures. Importing the
module needs numpy only; `target_ranks` imports TensorFlow when first called (so
the client and Beam workers can use the formulas without it).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np

NOT_RETURNED = 2**62
"""The rank of a target the served model can never return (left out with the history):
a miss at every cut-off."""


def target_ranks(
    query_embeddings,
    item_embeddings,
    targets,
    *,
    exclude=None,
    padding_id: Optional[int] = 0,
    chunk_size: int = 1024,
) -> np.ndarray:
    """0-based rank of each target among all catalog items, by dot-product score.

    Ties count against the target (an item scoring exactly the target's score
    ranks above it), so a constant model gets the worst rank, not the best; a
    target whose score is NaN ranks last (a diverged model scores as a miss).

    ``exclude`` is the served policy (``docs/evaluation.md``): every id in it is left
    out of the ranking, the target included, as the exported ``top_k`` with
    ``exclude_history`` never returns an item of the history it was sent. A target
    in ``exclude`` therefore gets rank `NOT_RETURNED` (a miss at every cut-off).

    Args:
      query_embeddings: `[n, dim]`.
      item_embeddings: `[num_ids, dim]`, row ``d`` is item ``d``.
      targets: `[n]` int item ids.
      exclude: optional `[n, L]` int ids per query to leave out of the ranking
        (the history sent to the server); ``padding_id`` entries are ignored.
      padding_id: int or None. Row of ``item_embeddings`` that is not an item.
        Defaults to 0.
      chunk_size: int. Queries scored at once (memory is ``chunk x num_ids``).

    Returns:
      `[n]` int64 numpy array of ranks.
    """
    import tensorflow as tf

    q = tf.convert_to_tensor(query_embeddings)
    items = tf.convert_to_tensor(item_embeddings)
    targets = tf.cast(tf.reshape(tf.convert_to_tensor(targets), [-1]), tf.int64)
    n, num_ids = int(q.shape[0]), int(items.shape[0])
    if int(targets.shape[0]) != n:
        raise ValueError(f"`targets` has {targets.shape[0]} entries for {n} queries.")
    if exclude is not None:
        exclude = tf.cast(tf.convert_to_tensor(exclude), tf.int64)
        if exclude.shape.rank != 2 or int(exclude.shape[0]) != n:
            raise ValueError(f"`exclude` must be `[{n}, L]`, received {exclude.shape}.")
    ranks = []
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        ranks.append(
            _chunk_ranks_function()(
                q[start:stop],
                items,
                targets[start:stop],
                None if exclude is None else exclude[start:stop],
                -1 if padding_id is None else int(padding_id),
                num_ids,
            ).numpy()
        )
    return np.concatenate(ranks) if ranks else np.zeros([0], np.int64)


@functools.lru_cache(maxsize=None)
def _chunk_ranks_function():
    """`_chunk_ranks` as one `tf.function` (built on first use: TensorFlow loads then)."""
    import tensorflow as tf

    return tf.function(_chunk_ranks, reduce_retracing=True)


def _chunk_ranks(q, items, targets, exclude, padding_id, num_ids):
    import tensorflow as tf

    scores = tf.matmul(tf.cast(q, tf.float32), tf.cast(items, tf.float32), transpose_b=True)
    valid = tf.ones_like(scores, tf.bool)
    if padding_id >= 0:
        valid = tf.logical_and(valid, tf.not_equal(tf.range(num_ids, dtype=tf.int64), padding_id))
    if exclude is not None:
        rows = tf.broadcast_to(tf.range(tf.shape(exclude)[0], dtype=tf.int64)[:, None],
                               tf.shape(exclude))
        keep = tf.logical_and(tf.logical_and(exclude >= 0, exclude < num_ids),
                              tf.not_equal(exclude, padding_id))
        idx = tf.boolean_mask(tf.stack([rows, exclude], -1), keep)
        seen = tf.scatter_nd(idx, tf.ones([tf.shape(idx)[0]], tf.bool), tf.shape(scores, tf.int64))
        valid = tf.logical_and(valid, tf.logical_not(seen))
        # The served top_k never returns a seen item: a seen target is a miss.
        target_seen = tf.logical_or(
            tf.reduce_any(tf.logical_and(keep, tf.equal(exclude, targets[:, None])), axis=1),
            tf.equal(targets, padding_id))  # padding is no item: never returned
        ranks = ranks_from_scores(scores, targets, valid)
        return tf.where(target_seen, tf.constant(NOT_RETURNED, tf.int64), ranks)
    return ranks_from_scores(scores, targets, valid)


def ranks_from_scores(scores, targets, valid=None):
    """0-based rank of each row's target among the row's scores (TensorFlow, graph-safe):
    the number of other columns, of those ``valid``, scoring at least the target's (ties
    count against the target). A NaN target score ranks last: below every other valid
    column (a diverged model is never a hit). `target_ranks` computes its ranks with it.

    Args:
      scores: `[n, m]` float tensor.
      targets: `[n]` int64 column of each row's target.
      valid: optional `[n, m]` or `[m]` bool: columns that are items. Defaults to all.

    Returns:
      `[n]` int64 tensor.
    """
    import tensorflow as tf

    targets = tf.cast(targets, tf.int64)
    target_scores = tf.gather(scores, targets, batch_dims=1)
    # A NaN target compares as below everything: every other valid column is above it.
    at_least = tf.logical_or(scores >= target_scores[:, None],
                             tf.math.is_nan(target_scores)[:, None])
    columns = tf.range(tf.shape(scores, out_type=tf.int64)[1])
    above = tf.logical_and(at_least, tf.not_equal(columns[None, :], targets[:, None]))
    if valid is not None:
        above = tf.logical_and(above, valid)
    return tf.cast(tf.reduce_sum(tf.cast(above, tf.int32), axis=1), tf.int64)


def dcg_gain(ranks) -> np.ndarray:
    """``1 / log2(rank + 2)``: the DCG gain of a target at 0-based ``rank``.

    One relevant item per query, so the ideal DCG is 1 and NDCG@k is the mean gain
    of the targets ranked below ``k`` (0 for the others).

    >>> dcg_gain([0, 3]).round(4)
    array([1.    , 0.4307])
    """
    return 1.0 / np.log2(np.asarray(ranks) + 2.0)


def recall_ndcg_from_ranks(ranks, ks: Sequence[int] = (10, 20)) -> dict[str, float]:
    """Recall@k (hit rate of the single target) and NDCG@k from 0-based ranks.

    >>> recall_ndcg_from_ranks([0, 3, 50], ks=(10,))
    {'recall@10': 0.6666666666666666, 'ndcg@10': 0.4768...}
    """
    ranks = np.asarray(ranks)
    out = {}
    for k in ks:
        hit = ranks < k
        out[f"recall@{k}"] = float(hit.mean()) if ranks.size else float("nan")
        gain = np.where(hit, dcg_gain(ranks), 0.0)
        out[f"ndcg@{k}"] = float(gain.mean()) if ranks.size else float("nan")
    return out


def rank_histogram(ranks, max_cutoff: int) -> np.ndarray:
    """`[max_cutoff + 1]` int64: how many targets have each rank ``0..max_cutoff-1``,
    then the misses (rank ``>= max_cutoff``). Histograms of parts add up exactly."""
    ranks = np.minimum(np.asarray(ranks, np.int64), int(max_cutoff))
    return np.bincount(ranks, minlength=int(max_cutoff) + 1).astype(np.int64)


def recall_ndcg_from_histogram(histogram, recall_cutoffs: Sequence[int],
                               ndcg_cutoffs: Sequence[int]) -> dict:
    """Recall@k and NDCG@k (the formulas of `recall_ndcg_from_ranks`) from a
    `rank_histogram`, plus ``num_targets``; NaN when there is no target.

    The Beam Evaluator's form: integer histograms merge exactly in any order.
    """
    histogram = np.asarray(histogram, np.int64)
    n = int(histogram.sum())
    out: dict = {"num_targets": n}
    for k in recall_cutoffs:
        out[f"recall@{k}"] = float(histogram[:k].sum() / n) if n else float("nan")
    for k in ndcg_cutoffs:
        gains = dcg_gain(np.arange(k))
        out[f"ndcg@{k}"] = float(np.dot(histogram[:k], gains) / n) if n else float("nan")
    return out


def popularity_deciles(frequencies) -> np.ndarray:
    """`[N]` int64: each item's popularity decile, ``0`` for the 10% most frequent items
    and ``9`` for the 10% least (``rank * 10 // N``, capped at 9, where ``rank`` is the
    item's 0-based position in the items sorted by frequency, descending, ties by index).

    Args:
      frequencies: `[N]` training counts or probabilities of the items (any numbers
        that order them; unsigned and boolean ones are read as int64).

    >>> popularity_deciles([5, 0, 9, 5])
    array([2, 7, 0, 5])
    """
    frequencies = np.asarray(frequencies)
    if frequencies.dtype.kind in "ub":  # -x of an unsigned count wraps around
        frequencies = frequencies.astype(np.int64)
    num_items = len(frequencies)
    order = np.argsort(-frequencies, kind="stable")
    rank = np.empty(num_items, np.int64)
    rank[order] = np.arange(num_items)
    return np.minimum(rank * 10 // max(num_items, 1), 9)


BANDS = ("head", "torso", "tail")


def popularity_bands(counts) -> np.ndarray:
    """`[N]` int64: each item's popularity band, ``0`` head, ``1`` torso, ``2`` tail
    (`BANDS`): the items sorted by training count, descending (ties by index), the head
    being the most popular items that hold the first third of the interactions, the
    torso the next third, the tail the rest (items with no interaction among them).

    >>> popularity_bands([0, 10, 1, 5, 4])
    array([2, 0, 2, 1, 2])
    """
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    bands = np.full(len(counts), 2, np.int64)
    if total <= 0:
        return bands
    order = np.argsort(-counts, kind="stable")
    before = (np.cumsum(counts[order]) - counts[order]) / total  # share of the items above
    bands[order] = np.where(before < 1 / 3, 0, np.where(before < 2 / 3, 1, 2))
    bands[counts == 0] = 2
    return bands


def recall_ndcg_by_band(ranks, target_bands, ks: Sequence[int] = (10, 20)) -> dict:
    """`recall_ndcg_from_ranks` of the targets of each popularity band (`popularity_bands`
    of the target), keyed ``"<band>:recall@k"`` / ``"<band>:ndcg@k"`` (NaN for a band with
    no target), and ``"<band>:share"``, the band's share of the targets."""
    ranks, target_bands = np.asarray(ranks), np.asarray(target_bands)
    out: dict = {}
    for b, band in enumerate(BANDS):
        chosen = target_bands == b
        out[f"{band}:share"] = float(chosen.mean()) if len(ranks) else float("nan")
        for name, value in recall_ndcg_from_ranks(ranks[chosen], ks).items():
            out[f"{band}:{name}"] = value
    return out


__all__ = ["BANDS", "NOT_RETURNED", "dcg_gain", "popularity_bands", "popularity_deciles",
           "recall_ndcg_by_band", "rank_histogram", "ranks_from_scores",
           "recall_ndcg_from_histogram", "recall_ndcg_from_ranks", "target_ranks"]
