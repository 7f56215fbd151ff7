"""tf.data for SASRec-style training and full-catalog evaluation on a `Split`.

Training examples are users: the last ``max_length + 1`` items of the user's
training sequence, left-padded with 0, give ``input_ids`` (all but the last)
and ``target_ids`` (all but the first), so position ``t`` predicts the next
item. ``is_target`` marks positions whose input *and* target are real items, as
the paper's official code does: a user's first item is never a target (nothing
precedes it), so no query is trained from padding alone.
The padded matrix is built once in numpy; the pipeline is slicing, a seeded
shuffle, batching and prefetching, with no Python in the loop.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
from tfrs_logq.pipelines.splits import EvalPart, Split

from tfrs_logq.metrics import recall_ndcg_from_ranks, target_ranks


def left_pad(sequences, length: int) -> np.ndarray:
    """`[len(sequences), length]` int32: the last ``length`` items of each, 0-padded left."""
    out = np.zeros((len(sequences), length), np.int32)
    for row, seq in enumerate(sequences):
        tail = np.asarray(seq[-length:] if length else seq[:0])
        if len(tail):
            out[row, length - len(tail):] = tail
    return out


def training_dataset(
    split: Split,
    batch_size: int,
    max_length: int = 200,
    seed: int = 0,
    shuffle: bool = True,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """Batches of ``{"input_ids", "target_ids": [b, L] int32, "is_target": [b, L] bool,
    "user": [b] int32}`` over users with at least 2 training interactions; one pass
    is one epoch, reshuffled each epoch from ``seed``."""
    if int(batch_size) < 1 or int(max_length) < 1:
        raise ValueError(f"`batch_size` and `max_length` must be positive, received "
                         f"{batch_size}, {max_length}.")
    sequences = split.train_sequences()
    users = np.array([u for u, s in enumerate(sequences) if len(s) >= 2], np.int32)
    windows = left_pad([sequences[u] for u in users], max_length + 1)
    data = {
        "input_ids": windows[:, :-1],
        "target_ids": windows[:, 1:],
        "is_target": (windows[:, :-1] != 0) & (windows[:, 1:] != 0),
        "user": users,
    }
    ds = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        ds = ds.shuffle(len(users), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(int(batch_size), drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def evaluation_arrays(split: Split, part: EvalPart, max_length: int = 200,
                      exclude_seen: bool = True) -> dict:
    """Inputs for `evaluate`: ``history`` `[m, L]` (the model's input, left-padded),
    ``targets`` `[m]`, and ``exclude`` `[m, H]` (the whole history, 0-padded; the
    gSASRec protocol leaves already-seen items out of the ranking) or None."""
    histories = [split.sequences[u][:n] for u, n in zip(part.users, part.history_lengths)]
    longest = max((len(h) for h in histories), default=0)
    return {
        "history": left_pad(histories, max_length),
        "targets": part.targets.astype(np.int64),
        "exclude": left_pad(histories, max(longest, 1)) if exclude_seen else None,
    }


def evaluate(
    query_fn,
    item_embeddings,
    arrays: dict,
    ks=(10, 20),
    batch_size: int = 512,
    per_target: Optional[list] = None,
) -> dict:
    """Recall@k and NDCG@k over the full catalog, averaged over targets.

    Args:
      query_fn: maps a `[b, L]` history batch to `[b, dim]` query embeddings.
      item_embeddings: `[num_items + 1, dim]`, row 0 (padding) is never ranked.
      arrays: from `evaluation_arrays`.
      ks: cut-offs.
      batch_size: queries per step.
      per_target: if a list, the 0-based rank of every target is appended to it.
    """
    ranks = []
    history, targets, exclude = arrays["history"], arrays["targets"], arrays["exclude"]
    for start in range(0, len(targets), batch_size):
        stop = start + batch_size
        queries = query_fn(tf.constant(history[start:stop]))
        ranks.append(target_ranks(queries, item_embeddings, targets[start:stop],
                                  exclude=None if exclude is None else exclude[start:stop],
                                  chunk_size=batch_size))
    ranks = np.concatenate(ranks) if ranks else np.zeros(0, np.int64)
    if per_target is not None:
        per_target.extend(ranks.tolist())
    return recall_ndcg_from_ranks(ranks, ks)


__all__ = ["evaluate", "evaluation_arrays", "left_pad", "training_dataset"]
