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

from tfrs_logq.metrics import recall_ndcg_from_ranks, target_ranks
from tfrs_logq.pipelines.splits import EvalPart, Split


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
    repeat: bool = False,
    start_batch: int = 0,
) -> tf.data.Dataset:
    """Batches of ``{"input_ids", "target_ids": [b, L] int32, "is_target": [b, L] bool,
    "user": [b] int32}`` over users with at least 2 training interactions.

    One pass over the users is one epoch. Pass ``p`` visits them in the order of a
    stateless shuffle seeded by ``(seed, p)``, so the stream is a function of
    ``seed`` alone and batch ``n`` of it is the same batch whether the stream
    started at 0 or at ``start_batch=n`` (an exact resume restores the data
    position this way). Every pass ends with its partial batch unless
    ``drop_remainder``.

    Args:
      split: the `Split` whose training sequences are used.
      batch_size: int. Users per batch.
      max_length: int. ``L``.
      seed: int. Seed of the shuffles. Defaults to 0.
      shuffle: bool. False keeps the users in id order. Defaults to True.
      drop_remainder: bool. Drop each pass's partial batch. Defaults to False.
      repeat: bool. An endless stream of passes (0, 1, 2, ...) instead of pass 0
        only. Defaults to False.
      start_batch: int. Skip the stream's first ``start_batch`` batches (from the
        start of pass ``start_batch // batches_per_pass``). Defaults to 0.
    """
    if int(batch_size) < 1 or int(max_length) < 1:
        raise ValueError(f"`batch_size` and `max_length` must be positive, received "
                         f"{batch_size}, {max_length}.")
    if int(start_batch) < 0:
        raise ValueError(f"`start_batch` must be >= 0, received {start_batch}.")
    batch_size, start_batch = int(batch_size), int(start_batch)
    sequences = split.train_sequences()
    users = np.array([u for u, s in enumerate(sequences) if len(s) >= 2], np.int32)
    windows = left_pad([sequences[u] for u in users], max_length + 1)
    columns = {
        "input_ids": tf.constant(windows[:, :-1]),
        "target_ids": tf.constant(windows[:, 1:]),
        "is_target": tf.constant((windows[:, :-1] != 0) & (windows[:, 1:] != 0)),
        "user": tf.constant(users),
    }
    n = len(users)
    per_pass = n // batch_size if drop_remainder else -(-n // batch_size)
    if per_pass == 0:  # fewer users than one batch, remainder dropped: nothing to yield
        return tf.data.Dataset.from_tensor_slices(columns).take(0).batch(batch_size)
    first_pass, offset = divmod(start_batch, per_pass)
    if not repeat and first_pass > 0:
        raise ValueError(f"`start_batch` {start_batch} is past the single pass of "
                         f"{per_pass} batches; pass repeat=True.")
    seed = int(seed)

    def one_pass(p):
        order = tf.range(n, dtype=tf.int32)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(
                order, seed=tf.stack([tf.constant(seed, tf.int64), p]))
        return tf.data.Dataset.from_tensor_slices(order).batch(batch_size, drop_remainder)

    passes = tf.data.Dataset.range(first_pass, 2 ** 62 if repeat else 1)
    ds = passes.flat_map(one_pass).skip(offset)
    ds = ds.map(lambda rows: {k: tf.gather(v, rows) for k, v in columns.items()})
    return ds.prefetch(tf.data.AUTOTUNE)


def evaluation_arrays(split: Split, part: EvalPart, max_length: int = 200,
                      exclude_seen: bool = True) -> dict:
    """Inputs for `evaluate`: ``history`` `[m, L]` (the model's input: the last
    ``max_length`` items, left-padded; what a request to the exported model sends),
    ``targets`` `[m]`, and ``exclude``: with ``exclude_seen`` the same history, which
    the served ``top_k`` leaves out of its results by default (``exclude_history``), a
    target among it included (a repeat target is then a miss, as served); else None.
    Offline metrics thus rank as the served model ranks (``docs/evaluation.md``)."""
    histories = [split.sequences[u][:n] for u, n in zip(part.users, part.history_lengths)]
    history = left_pad(histories, max_length)
    return {
        "history": history,
        "targets": part.targets.astype(np.int64),
        "exclude": history if exclude_seen else None,
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
