"""Training objectives of the paper's table: a loss plus where its negatives come from.

Every objective maps the query embedding at each position of a batch of
sequences (`[batch, L, dim]`), the next-item targets and the item embedding
table to one scalar loss: the mean over target positions. Names:

| name | loss | negatives |
| --- | --- | --- |
| ``bce`` | BCE (SASRec) | 1 uniform per position |
| ``gbce`` | gBCE, t = 0.75 (gSASRec) | 256 uniform per sequence |
| ``uniform`` | sampled softmax | 256 uniform per sequence |
| ``inbatch-{none,logq,corrected}`` | sampled softmax | 256 distinct in-batch items |
| ``mns-{none,logq,corrected}`` | sampled softmax | 128 uniform per sequence + 128 in-batch |
| ``full-softmax`` | softmax over the catalog | all items |

In-batch negatives follow the paper's official code: the distinct targets of the
batch, shuffled, first k, shared by every position; ``log Q`` is the exact
unigram frequency of the training data, ``log Q'(d) = log(#d / (N - #p))`` for
``corrected``; ``logq`` leaves the positive's denominator term uncorrected, as the
official code does. For MNS every negative, uniform ones too, is corrected with
the unigram ``log Q`` (the paper). Accidental hits are always masked. Uniform
negatives are drawn per sequence (shared by its positions), not per position as
the PyTorch code does, which keeps the `[batch, L, k, dim]` gather off the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.losses import full_softmax_loss, gbce_loss, masked_value, sampled_softmax_loss

CORRECTED_NAMES = ("none", "logq", "corrected")
OBJECTIVES = (
    "bce", "gbce", "uniform",
    *(f"inbatch-{c}" for c in CORRECTED_NAMES),
    *(f"mns-{c}" for c in CORRECTED_NAMES),
    "full-softmax",
)


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    loss: str  # "bce", "gbce", "softmax", "full"
    num_uniform: int = 0
    num_in_batch: int = 0
    correction: str = "none"
    gbce_t: float = 0.0
    per_position_uniform: bool = False


def objective_spec(name: str, num_negatives: int = 256, gbce_t: float = 0.75) -> ObjectiveSpec:
    """The objective called ``name`` with ``num_negatives`` negatives (split in
    half for MNS)."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown loss {name!r}; expected one of {OBJECTIVES}.")
    if name == "bce":
        return ObjectiveSpec(name, "bce", num_uniform=1, per_position_uniform=True)
    if name == "gbce":
        return ObjectiveSpec(name, "gbce", num_uniform=num_negatives, gbce_t=gbce_t)
    if name == "uniform":
        return ObjectiveSpec(name, "softmax", num_uniform=num_negatives)
    if name == "full-softmax":
        return ObjectiveSpec(name, "full")
    sampling, correction = name.split("-")
    if sampling == "inbatch":
        return ObjectiveSpec(name, "softmax", num_in_batch=num_negatives, correction=correction)
    half = num_negatives // 2
    return ObjectiveSpec(name, "softmax", num_uniform=num_negatives - half, num_in_batch=half,
                         correction=correction)


class SequenceObjective(tf.Module):
    """Computes an objective's loss for a batch of sequences.

    Args:
      spec: `ObjectiveSpec` (see `objective_spec`).
      num_items: int. Catalog size; ids ``1..num_items``, 0 is padding.
      item_counts: `[num_items + 1]` training counts (``log Q`` for in-batch
        negatives and MNS).
      seed: int. Seed of the negative sampling.
      cross_replica_negatives: bool. Under a multi-replica strategy, draw in-batch
        negatives from the targets of all replicas (an all-gather of ids; the
        embeddings are looked up in the mirrored table, so gradients need no
        extra communication). Defaults to False: each replica uses its own batch.
    """

    def __init__(self, spec: ObjectiveSpec, num_items: int, item_counts=None, seed: int = 0,
                 cross_replica_negatives: bool = False) -> None:
        super().__init__(name=spec.name.replace("-", "_"))
        self.spec = spec
        self.num_items = int(num_items)
        self.seed = int(seed)
        self.cross_replica_negatives = bool(cross_replica_negatives)
        self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="sample_calls")
        needs_counts = spec.num_in_batch > 0 and spec.correction != "none"
        if needs_counts and item_counts is None:
            raise ValueError(f"loss {spec.name!r} needs `item_counts` (training frequencies).")
        if item_counts is not None:
            counts = np.asarray(item_counts, np.float64)
            if counts.shape != (self.num_items + 1,):
                raise ValueError(f"`item_counts` must have shape [{self.num_items + 1}], "
                                 f"received {counts.shape}.")
            self._counts = tf.constant(np.maximum(counts, 1.0), tf.float32)
            self._total = float(counts.sum())
        else:
            self._counts = None

    def _seed(self) -> tf.Tensor:
        self._calls.assign_add(1)
        return tf.stack([tf.constant(self.seed, tf.int64), self._calls.read_value()])

    def _in_batch(self, targets_flat: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
        pool = targets_flat
        ctx = tf.distribute.get_replica_context()
        if self.cross_replica_negatives and ctx is not None and ctx.num_replicas_in_sync > 1:
            pool = ctx.all_gather(pool, axis=0)
        pool = tf.boolean_mask(pool, pool > 0)
        unique = tf.unique(pool).y
        shuffled = tf.random.experimental.stateless_shuffle(unique, seed=self._seed())[:k]
        n = tf.shape(shuffled)[0]
        ids = tf.ensure_shape(tf.pad(shuffled, [[0, k - n]]), [k])
        return ids, tf.range(k) < n

    def _uniform(self, shape) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, seed=self._seed(), minval=1,
                                           maxval=self.num_items + 1, dtype=tf.int32)

    def __call__(self, queries, targets, is_target, item_embeddings) -> tf.Tensor:
        """Mean loss over target positions.

        Args:
          queries: `[batch, L, dim]`.
          targets: `[batch, L]` next-item ids (0 where there is none).
          is_target: `[batch, L]` bool.
          item_embeddings: `[num_items + 1, dim]`.
        """
        spec = self.spec
        queries = tf.cast(queries, tf.float32)
        table = tf.cast(item_embeddings, tf.float32)
        targets = tf.cast(targets, tf.int32)
        batch, length = tf.shape(targets)[0], tf.shape(targets)[1]
        flat_q = tf.reshape(queries, [batch * length, -1])
        flat_t = tf.reshape(targets, [-1])
        weight = tf.cast(tf.reshape(is_target, [-1]), tf.float32)

        if spec.loss == "full":
            logits = tf.matmul(flat_q, table, transpose_b=True)
            exclude = tf.range(self.num_items + 1) == 0
            per_position = full_softmax_loss(logits, flat_t, exclude=exclude)
            return self._reduce(per_position, weight)

        positive = tf.reduce_sum(flat_q * tf.gather(table, flat_t), axis=-1)
        neg_ids, neg_valid = [], []
        neg_logits = []
        if spec.num_uniform:
            if spec.per_position_uniform:
                ids = self._uniform([batch * length, spec.num_uniform])
                logits = tf.einsum("nd,nkd->nk", flat_q, tf.gather(table, ids))
            else:
                ids_seq = self._uniform([batch, spec.num_uniform])
                logits = tf.einsum("bld,bkd->blk", queries, tf.gather(table, ids_seq))
                logits = tf.reshape(logits, [batch * length, spec.num_uniform])
                ids = tf.reshape(tf.repeat(ids_seq[:, None, :], length, axis=1),
                                 [batch * length, spec.num_uniform])
            neg_ids.append(ids)
            neg_valid.append(tf.ones_like(ids, tf.bool))
            neg_logits.append(logits)
        if spec.num_in_batch:
            ids, valid = self._in_batch(flat_t, spec.num_in_batch)
            logits = tf.matmul(flat_q, tf.gather(table, ids), transpose_b=True)
            n = batch * length
            neg_ids.append(tf.broadcast_to(ids[None, :], [n, spec.num_in_batch]))
            neg_valid.append(tf.broadcast_to(valid[None, :], [n, spec.num_in_batch]))
            neg_logits.append(logits)
        ids = tf.concat(neg_ids, axis=1)
        logits = tf.concat(neg_logits, axis=1)
        mask = tf.logical_and(tf.concat(neg_valid, axis=1), tf.not_equal(ids, flat_t[:, None]))

        if spec.loss in ("bce", "gbce"):
            rate = min(1.0, spec.num_uniform / max(self.num_items - 1, 1))
            per_position = gbce_loss(positive, logits, sampling_rate=rate,
                                     t=spec.gbce_t if spec.loss == "gbce" else 0.0,
                                     negative_mask=mask)
            return self._reduce(per_position, weight)

        log_q = None
        if spec.correction != "none":
            counts = tf.gather(self._counts, ids)
            if spec.correction == "logq":
                log_q = tf.math.log(counts / self._total)
            else:
                remaining = self._total - tf.gather(self._counts, flat_t)[:, None]
                log_q = tf.math.log(counts / tf.maximum(remaining, 1.0))
            log_q = tf.where(mask, log_q, masked_value(tf.float32))
        per_position = sampled_softmax_loss(
            positive, logits, correction=spec.correction, negative_log_q=log_q,
            negative_mask=mask)
        return self._reduce(per_position, weight)

    @staticmethod
    def _reduce(per_position: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
        total = tf.reduce_sum(per_position * weight)
        count = tf.maximum(tf.reduce_sum(weight), 1.0)
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        return total / count / float(replicas)


def make_objective(name: str, num_items: int, item_counts: Optional[np.ndarray] = None,
                   num_negatives: int = 256, seed: int = 0,
                   cross_replica_negatives: bool = False) -> SequenceObjective:
    return SequenceObjective(objective_spec(name, num_negatives), num_items, item_counts,
                             seed=seed, cross_replica_negatives=cross_replica_negatives)
