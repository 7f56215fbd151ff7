"""Training objectives of the paper's table: a loss plus where its negatives come from.

Every objective maps the query embedding at each position of a batch of
sequences (`[batch, L, dim]`), the next-item targets and the item embedding
table to one scalar loss: the mean over target positions. Names:

| name | loss | negatives |
| --- | --- | --- |
| ``bce`` | BCE (SASRec) | 1 uniform per position |
| ``gbce`` | gBCE, t = 0.75 (gSASRec) | 256 uniform per position |
| ``uniform`` | sampled softmax | 256 uniform per position |
| ``inbatch-<correction>`` | sampled softmax | 256 distinct in-batch items |
| ``mns-<correction>`` | sampled softmax | 128 uniform per position + 128 in-batch |
| ``full-softmax`` | softmax over the catalog | all items |

``<correction>``: ``none``, ``logq-tfrs``, ``logq-official`` or ``corrected``
(`tfrs_logq.corrections`).

In-batch negatives follow the paper's official code: the distinct targets of the
batch, shuffled, first k, shared by every position; ``log Q`` is the exact
unigram frequency of the training data, ``log Q'(d) = log(#d / (N - #p))`` for
``corrected`` (`tfrs_logq.proposal.unigram_log_tables`); ``logq-official`` leaves the
positive's denominator term uncorrected, as the official code does, and ``logq-tfrs``
corrects it with ``log Q(p)``, as TFRS's ``Retrieval`` does. For MNS every
negative, uniform ones too, is corrected with the unigram ``log Q`` (the paper).
Accidental hits are always masked (the official gBCE/BCE scripts do not mask them;
a uniform negative equals the positive with probability ``1/|I|``). Uniform
negatives are drawn independently for every position, as the official code does.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np
import tensorflow as tf

from tfrs_logq.corrections import STANDARD_FORMS, LossName, parse_loss_name
from tfrs_logq.losses import full_softmax_loss, gbce_loss, sampled_softmax_loss
from tfrs_logq.proposal import unigram_log_tables
from tfrs_logq.sampling import SampledIds, draw_negative_ids
from tfrs_logq.sasrec import native
from tfrs_logq.sasrec.config import CORRECTED_NAMES, OBJECTIVES  # noqa: F401  (TensorFlow-free)

# Score per-position uniform negatives against the whole catalog (one matmul and a
# gather) when the catalog has at most this many ids per negative.
DENSE_UNIFORM_FACTOR = 32


# The bincount gradient is used below this many `[n, catalog]` cells (TensorFlow's
# GPU bincount indexes with 32-bit ints) and when op determinism is off (its GPU
# kernel refuses to run deterministically); otherwise an `UnsortedSegmentSum`,
# TensorFlow's own gradient of the gather.
BINCOUNT_MAX_CELLS = 2 ** 29
# With the native kernel, catalogs up to this many rows take a dense table gradient;
# larger ones score against the step's distinct rows (a sparse gradient).
NATIVE_DENSE_TABLE_ROWS = 2 ** 16


def _op_determinism_enabled() -> bool:
    try:
        from tensorflow.python.framework import config as tf_config

        return bool(tf_config.is_op_determinism_enabled())
    except (ImportError, AttributeError):  # pragma: no cover - other TF versions
        return False


def _scatter_rows(upstream: tf.Tensor, ids: tf.Tensor, num_columns) -> tf.Tensor:
    """`[n, num_columns]` with ``upstream[i, j]`` added at ``[i, ids[i, j]]``."""
    n = tf.shape(ids, out_type=tf.int64)[0]
    columns = tf.cast(num_columns, tf.int64)
    flat = tf.range(n)[:, None] * columns + tf.cast(ids, tf.int64)
    summed = tf.math.unsorted_segment_sum(tf.reshape(upstream, [-1]), tf.reshape(flat, [-1]),
                                          n * columns)
    return tf.reshape(summed, tf.stack([n, columns]))


@tf.custom_gradient
def _sampled_logits_dense(queries: tf.Tensor, table: tf.Tensor, ids: tf.Tensor):
    """``queries[n] . table[ids[n, j]]`` as `[n, k]`, through one `[n, catalog]` matmul.

    The gradient (the same as differentiating ``tf.gather(queries @ table.T, ids,
    batch_dims=1)``) scatters the `[n, k]` upstream gradient into a dense
    `[n, catalog]` matrix with one weighted per-row bincount (duplicates add up) and
    multiplies it back: about twice as fast on CPU as the `UnsortedSegmentSum` of
    the gather's own gradient, which was the largest single op of an MNS step.
    """
    logits = tf.gather(tf.matmul(queries, table, transpose_b=True), ids, batch_dims=1)

    def grad(upstream):
        upstream = tf.cast(upstream, queries.dtype)
        num_columns = tf.shape(table)[0]
        if _op_determinism_enabled():
            dense = _scatter_rows(upstream, ids, num_columns)
        else:
            cells = tf.cast(tf.shape(ids)[0], tf.int64) * tf.cast(num_columns, tf.int64)
            dense = tf.cond(
                cells < BINCOUNT_MAX_CELLS,
                lambda: tf.raw_ops.DenseBincount(input=ids, size=num_columns,
                                                 weights=upstream, binary_output=False),
                lambda: _scatter_rows(upstream, ids, num_columns))
        return (tf.matmul(dense, table),
                tf.matmul(dense, queries, transpose_a=True),
                None)

    return logits, grad


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    loss: str  # "bce", "gbce", "softmax", "full"
    num_uniform: int = 0
    num_in_batch: int = 0
    correction: str = "none"
    gbce_t: float = 0.0


def objective_spec(name: Union[str, LossName], num_negatives: int = 256,
                   gbce_t: float = 0.75) -> ObjectiveSpec:
    """The objective called ``name`` with ``num_negatives`` negatives (split in half for
    MNS). ``name``: a `LossName` already parsed (a checked config's: not checked again),
    or its text, parsed and checked here (`tfrs_logq.corrections.parse_loss_name`: an
    unknown name raises its error)."""
    loss = name if isinstance(name, LossName) else parse_loss_name(name, OBJECTIVES)
    text = str(loss)
    if text == "bce":
        return ObjectiveSpec(text, "bce", num_uniform=1)
    if text == "gbce":
        return ObjectiveSpec(text, "gbce", num_uniform=num_negatives, gbce_t=gbce_t)
    if text == "uniform":
        return ObjectiveSpec(text, "softmax", num_uniform=num_negatives)
    if text == "full-softmax":
        return ObjectiveSpec(text, "full")
    if loss.negatives == "inbatch" and loss.correction is not None:
        return ObjectiveSpec(text, "softmax", num_in_batch=num_negatives,
                             correction=loss.correction)
    if loss.negatives == "mns" and loss.correction is not None:
        half = num_negatives // 2
        return ObjectiveSpec(text, "softmax", num_uniform=num_negatives - half,
                             num_in_batch=half, correction=loss.correction)
    raise ValueError(f"`loss` must be one of {', '.join(OBJECTIVES)}; received {text!r}.")


class SequenceObjective(tf.Module):
    """Computes an objective's loss for a batch of sequences.

    Negatives follow the paper's official code: uniform negatives are drawn
    independently for every position (ids ``1..num_items``), in-batch negatives
    are the batch's distinct targets in random order, first ``k``, shared by
    every position. `sample` draws them and `loss` computes the objective for
    given negatives, so both can be checked separately.

    Args:
      spec: `ObjectiveSpec` (see `objective_spec`).
      num_items: int. Catalog size; ids ``1..num_items``, 0 is padding.
      item_counts: `[num_items + 1]` training counts (``log Q`` for in-batch
        negatives and MNS).
      seed: int. Seed of the negative sampling. Every draw is a function of the
        seed, a draw counter (a variable, so a checkpoint resumes the sequence) and,
        under a multi-replica strategy, the replica id: replicas draw different
        negatives (cross-replica in-batch negatives, drawn from a pool every replica
        holds, are shared).
      cross_replica_negatives: bool. Under a multi-replica strategy, draw in-batch
        negatives from the targets of all replicas (an all-gather of ids; the
        embeddings are looked up in the mirrored table, so gradients need no
        extra communication). Defaults to False: each replica uses its own batch.
      compact_positions: bool. Score only the target positions (a gather of the
        ``is_target`` rows; about half of ML-1M's positions at L = 200 are
        padding). Exact; needs dynamic shapes, so set it False under XLA.
        Defaults to True.
      native_kernels: bool or None. Score per-position negatives (uniform, MNS,
        BCE/gBCE) with the fused gather-dot CPU kernel of `tfrs_logq.sasrec.native`
        (compiled on first use) instead of TensorFlow ops: the same logits up to
        float rounding, about 5x cheaper at the paper's MNS shapes. None (default):
        when it builds and the host has no GPU or TPU. Inside XLA compilation
        (``jit_compile``), which cannot compile it, TensorFlow's ops run.
    """

    def __init__(self, spec: ObjectiveSpec, num_items: int, item_counts=None, seed: int = 0,
                 cross_replica_negatives: bool = False, compact_positions: bool = True,
                 native_kernels: Optional[bool] = None) -> None:
        super().__init__(name=spec.name.replace("-", "_"))
        self.spec = spec
        self.num_items = int(num_items)
        self.seed = int(seed)
        self.cross_replica_negatives = bool(cross_replica_negatives)
        self.compact_positions = bool(compact_positions)
        self.native_kernels = native_kernels
        self._native = None  # decided (and the kernel built) at the first `loss`
        # One count per `sample`, the `step` of its draw (`draw_negative_ids`).
        # Per replica (on-read), so each replica counts its own draws; a checkpoint holds
        # the first replica's count (they are all equal).
        self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="sample_calls",
                                  synchronization=tf.VariableSynchronization.ON_READ,
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        needs_counts = spec.num_in_batch > 0 and spec.correction != "none"
        if needs_counts and item_counts is None:
            raise ValueError(f"loss {spec.name!r} needs `item_counts` (training frequencies).")
        if item_counts is not None:
            counts = np.asarray(item_counts, np.float64)
            if counts.shape != (self.num_items + 1,):
                raise ValueError(f"`item_counts` must have shape [{self.num_items + 1}], "
                                 f"received {counts.shape}.")
            # log Q(d) = log c_d - log N; log Q'(d) = log c_d - log(N - c_p), as
            # per-item tables (float64 logs, then float32) read by id.
            log_counts, self._log_total, log_remaining = unigram_log_tables(counts)
            self._log_counts = tf.constant(log_counts, tf.float32)
            self._log_remaining = tf.constant(log_remaining, tf.float32)
        else:
            self._log_counts = None
        # Per-position uniform negatives are scored by one matmul against the whole
        # catalog and a gather when that is cheaper than gathering a
        # [positions, k, dim] block of embeddings (small catalogs such as ML-1M).
        self._dense_uniform = self.num_items + 1 <= DENSE_UNIFORM_FACTOR * max(spec.num_uniform, 1)

    def _use_native(self) -> bool:
        if self._native is None:
            use = self.spec.num_uniform > 0 and native.enabled(self.native_kernels)
            self._native = use
        return self._native

    def sample(self, targets: tf.Tensor, is_target=None) -> SampledIds:
        """Draws the negatives for `[batch, L]` next-item ``targets`` through
        `tfrs_logq.sampling.draw_negative_ids`, keyed by ``(seed, draw)`` (the draw counter,
        advanced by one): `[batch * L, k_u]` uniform ids (int32) drawn per position, and
        ``k_b`` in-batch ids from the targets where ``is_target`` (all non-zero targets
        when None), shared by every position.

        Under a multi-replica strategy the replica id is folded into the key, so replicas
        draw different negatives, except in-batch ones drawn from the targets of all
        replicas (``cross_replica_negatives``: a pool every replica holds), which all
        replicas share: they are drawn with a single device's key."""
        spec = self.spec
        flat_t = tf.reshape(tf.cast(targets, tf.int32), [-1])
        if is_target is not None:
            flat_t = tf.where(tf.reshape(is_target, [-1]), flat_t, tf.zeros_like(flat_t))
        self._calls.assign_add(1)
        draw = self._calls.read_value()
        ctx = tf.distribute.get_replica_context()
        replicated = ctx is not None and ctx.num_replicas_in_sync > 1
        replica = ctx.replica_id_in_sync_group if replicated else None
        pool, shared = flat_t, False
        if spec.num_in_batch and replicated and self.cross_replica_negatives:
            pool, shared = ctx.all_gather(flat_t, axis=0), True

        def drawn(num_uniform, num_in_batch, replica):
            return draw_negative_ids(pool, self.seed, draw, num_uniform=num_uniform,
                                     num_in_batch=num_in_batch, num_items=self.num_items,
                                     num_rows=tf.size(flat_t), dtype=tf.int32,
                                     replica=replica)

        if not shared:
            return drawn(spec.num_uniform, spec.num_in_batch, replica)
        in_batch = drawn(0, spec.num_in_batch, None)
        if not spec.num_uniform:
            return in_batch
        return drawn(spec.num_uniform, 0, replica)._replace(
            in_batch=in_batch.in_batch, in_batch_valid=in_batch.in_batch_valid)

    def __call__(self, queries, targets, is_target, item_embeddings) -> tf.Tensor:
        """Mean loss over target positions, with freshly drawn negatives.

        Args:
          queries: `[batch, L, dim]`.
          targets: `[batch, L]` next-item ids (0 where there is none).
          is_target: `[batch, L]` bool.
          item_embeddings: `[num_items + 1, dim]`.
        """
        negatives = None if self.spec.loss == "full" else self.sample(targets, is_target)
        return self.loss(queries, targets, is_target, item_embeddings, negatives)

    def loss(self, queries, targets, is_target, item_embeddings,
             negatives: Optional[SampledIds]) -> tf.Tensor:
        """Mean loss over target positions for the given ``negatives`` (see `sample`).

        The steps: the scored positions (`_positions`), the positive's and the negatives'
        scores (`_scores`, one of three paths), which negatives count (`_is_negative`),
        the spec's loss (full softmax, BCE/gBCE, or sampled softmax with its ``log Q``),
        then the mean over target positions.
        """
        table = tf.cast(item_embeddings, tf.float32)
        flat_q, flat_t, weight, uniform = self._positions(
            queries, targets, is_target, None if negatives is None else negatives.uniform)
        if self.spec.loss == "full":
            logits = tf.matmul(flat_q, table, transpose_b=True)
            exclude = tf.range(self.num_items + 1) == 0
            return self._reduce(full_softmax_loss(logits, flat_t, exclude=exclude), weight)

        in_batch, in_batch_valid = negatives.in_batch, negatives.in_batch_valid
        positive, logits = self._scores(flat_q, flat_t, table, uniform, in_batch)
        is_negative = _is_negative(flat_t, uniform, in_batch, in_batch_valid)
        if self.spec.loss in ("bce", "gbce"):
            per_position = self._binary_loss(positive, logits, is_negative)
        else:
            per_position = sampled_softmax_loss(
                positive, logits, correction=self.spec.correction,
                negative_log_q=self._negative_log_q(flat_t, uniform, in_batch),
                positive_log_q=self._positive_log_q(flat_t),
                # log Q comes from this objective's own count tables (log of a share, at
                # most 0 by construction): no per-step check on the training hot path.
                is_negative=is_negative, validate=False)
        return self._reduce(per_position, weight)

    def _positions(self, queries, targets, is_target, uniform):
        """The scored positions, flattened: queries `[n, dim]` float32, targets `[n]`
        int32, their weights `[n]` and uniform negatives `[n, k_u]` (or None). Every
        position, weighted by ``is_target``; with ``compact_positions`` only the target
        rows, weighing 1 (exact: the others weigh 0)."""
        queries = tf.cast(queries, tf.float32)
        flat_q = tf.reshape(queries, [-1, tf.shape(queries)[-1]])
        flat_t = tf.reshape(tf.cast(targets, tf.int32), [-1])
        weight = tf.cast(tf.reshape(is_target, [-1]), tf.float32)
        if self.compact_positions:
            rows = tf.where(tf.reshape(is_target, [-1]))[:, 0]
            flat_q, flat_t = tf.gather(flat_q, rows), tf.gather(flat_t, rows)
            weight = tf.ones_like(flat_t, tf.float32)
            if uniform is not None:
                uniform = tf.gather(uniform, rows)
        return flat_q, flat_t, weight, uniform

    def _scores(self, flat_q, flat_t, table, uniform, in_batch):
        """The positive's score `[n]` and the negatives' `[n, k_u + k_b]` (uniform, then
        in-batch), by the cheapest path: the native kernel (`_scores_native`), one matmul
        against a small catalog (`_scores_dense`), or gathered embeddings
        (`_scores_gathered`). In-batch negatives are shared by every position: their ids
        stay `[k_b]` and broadcast, rather than a `[positions, k_b]` copy."""
        if uniform is not None and self._use_native() and native.usable_here():
            return self._scores_native(flat_q, flat_t, table, uniform, in_batch)
        if uniform is not None and self._dense_uniform:
            return _scores_dense(flat_q, flat_t, table, uniform, in_batch)
        return _scores_gathered(flat_q, flat_t, table, uniform, in_batch)

    def _scores_native(self, flat_q, flat_t, table, uniform, in_batch):
        """One fused kernel scores the positive and the per-position negatives (no
        `[positions, k, dim]` gather); shared in-batch negatives are a matmul."""
        scored = self._native_logits(flat_q, table, tf.concat([flat_t[:, None], uniform], 1))
        positive, parts = scored[:, 0], [scored[:, 1:]]
        if in_batch is not None:
            parts.append(tf.matmul(flat_q, tf.gather(table, in_batch), transpose_b=True))
        return positive, _concat_columns(parts)

    def _binary_loss(self, positive, logits, is_negative) -> tf.Tensor:
        """BCE (gBCE with ``t = 0``) or gBCE per position, at the uniform sampling rate."""
        spec = self.spec
        rate = min(1.0, spec.num_uniform / max(self.num_items - 1, 1))
        return gbce_loss(positive, logits, sampling_rate=rate,
                         t=spec.gbce_t if spec.loss == "gbce" else 0.0, is_negative=is_negative)

    def _negative_log_q(self, flat_t, uniform, in_batch) -> Optional[tf.Tensor]:
        """The negatives' ``log Q`` for the spec's correction: None (``none``), the unigram
        ``log Q`` (the standard forms; `[k_b]` when in-batch only), or ``log Q'`` with the target
        excluded (``corrected``). Masked entries need no care: the loss drops them, value
        and gradient."""
        if self.spec.correction == "none":
            return None
        log_counts = []
        if uniform is not None:
            log_counts.append(tf.gather(self._log_counts, uniform))
        if in_batch is not None:
            shared = tf.gather(self._log_counts, in_batch)[None, :]
            log_counts.append(shared if uniform is None else
                              tf.broadcast_to(shared, [tf.size(flat_t), tf.size(in_batch)]))
        log_counts = _concat_columns(log_counts)
        if self.spec.correction in STANDARD_FORMS:
            log_q = log_counts - self._log_total  # [1, k] when in-batch only
            return log_q[0] if uniform is None else log_q
        return log_counts - tf.gather(self._log_remaining, flat_t)[:, None]

    def _positive_log_q(self, flat_t) -> Optional[tf.Tensor]:
        """The targets' unigram ``log Q(p)`` `[n]` for ``logq-tfrs`` (the positive's
        denominator term corrected too); None for the other corrections."""
        if self.spec.correction != "logq-tfrs":
            return None
        return tf.gather(self._log_counts, flat_t) - self._log_total

    def _native_logits(self, queries, table, ids) -> tf.Tensor:
        if self.num_items + 1 <= NATIVE_DENSE_TABLE_ROWS:
            return native.sampled_dot(queries, table, ids)
        # A large catalog: score against the rows this step reads, so the table's
        # gradient is sparse (`IndexedSlices` through the gather), not [catalog, dim].
        rows, local = tf.unique(tf.reshape(ids, [-1]))
        return native.sampled_dot(queries, tf.gather(table, rows),
                                  tf.reshape(local, tf.shape(ids)))

    @staticmethod
    def _reduce(per_position: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
        total = tf.reduce_sum(per_position * weight)
        count = tf.maximum(tf.reduce_sum(weight), 1.0)
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        return total / count / float(replicas)


def _concat_columns(parts: list) -> tf.Tensor:
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)


def _scores_dense(flat_q, flat_t, table, uniform, in_batch):
    """The positive, the uniform and the in-batch negatives all read one `[positions,
    catalog]` matmul (one backward scatter and two matmuls): for small catalogs."""
    ids = [flat_t[:, None], uniform]
    if in_batch is not None:
        ids.append(tf.broadcast_to(in_batch[None, :], [tf.size(flat_t), tf.size(in_batch)]))
    scored = _sampled_logits_dense(flat_q, table, tf.concat(ids, 1))
    return scored[:, 0], scored[:, 1:]


def _scores_gathered(flat_q, flat_t, table, uniform, in_batch):
    """Dot products with the gathered embeddings: the positive's, the uniform negatives'
    (`[positions, k_u, dim]`) and the shared in-batch negatives' (a matmul)."""
    positive = tf.reduce_sum(flat_q * tf.gather(table, flat_t), axis=-1)
    parts = []
    if uniform is not None:
        parts.append(tf.einsum("nd,nkd->nk", flat_q, tf.gather(table, uniform)))
    if in_batch is not None:
        parts.append(tf.matmul(flat_q, tf.gather(table, in_batch), transpose_b=True))
    return positive, _concat_columns(parts)


def _is_negative(flat_t, uniform, in_batch, in_batch_valid) -> tf.Tensor:
    """`[n, k_u + k_b]` bool: the negatives that count (`is_negative`): not the
    position's target (accidental hits) and, in-batch, not padding."""
    masks = []
    if uniform is not None:
        masks.append(tf.not_equal(uniform, flat_t[:, None]))
    if in_batch is not None:
        masks.append(tf.logical_and(in_batch_valid[None, :],
                                    tf.not_equal(in_batch[None, :], flat_t[:, None])))
    return _concat_columns(masks)


def make_objective(name: Union[str, LossName], num_items: int,
                   item_counts: Optional[np.ndarray] = None, num_negatives: int = 256,
                   seed: int = 0, cross_replica_negatives: bool = False,
                   compact_positions: bool = True,
                   native_kernels: Optional[bool] = None) -> SequenceObjective:
    """The `SequenceObjective` of ``name`` (a parsed `LossName` or its text:
    `objective_spec`)."""
    return SequenceObjective(objective_spec(name, num_negatives), num_items, item_counts,
                             seed=seed, cross_replica_negatives=cross_replica_negatives,
                             compact_positions=compact_positions,
                             native_kernels=native_kernels)


__all__ = ["BINCOUNT_MAX_CELLS", "CORRECTED_NAMES", "DENSE_UNIFORM_FACTOR",
           "NATIVE_DENSE_TABLE_ROWS", "OBJECTIVES", "ObjectiveSpec", "SampledIds",
           "SequenceObjective", "make_objective", "objective_spec"]
