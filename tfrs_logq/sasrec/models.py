"""SASRec (gSASRec's variant) and the sequential retrieval model around it."""

from __future__ import annotations

import math
import random
from typing import Optional

import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq.sasrec import native


def gsasrec_initializer() -> tf.keras.initializers.Initializer:
    """gSASRec's weight initialisation: truncated normal, std 0.02, cut at 2 std."""
    return tf.keras.initializers.TruncatedNormal(stddev=0.02)


def _dense(units: int, name: str, activation=None) -> tf.keras.layers.Dense:
    # A new initializer per layer: one unseeded instance reused draws identical values.
    return tf.keras.layers.Dense(units, activation=activation, name=name,
                                 kernel_initializer=gsasrec_initializer(),
                                 bias_initializer="zeros")


def _embedding(rows: int, dim: int, name: str) -> tf.keras.layers.Embedding:
    return tf.keras.layers.Embedding(rows, dim, embeddings_initializer=gsasrec_initializer(),
                                     name=name)


@tf.keras.utils.register_keras_serializable(package="tfrs_logq")
class WordDropout(tf.keras.layers.Layer):
    """`tf.keras.layers.Dropout` with the keep decisions read from random integer
    words instead of one random float per entry.

    Each entry is kept with probability ``1 - rate`` and scaled by
    ``1 / (1 - rate)``, as in Keras. When ``rate`` is a multiple of ``2**-16``
    (0.5, 0.25, ...) an entry's decision is one 16-bit half of a random 32-bit
    word (``half >= rate * 2**16``), so the keep probability is exactly
    ``1 - rate`` and a word serves two entries; otherwise each entry compares a
    whole 32-bit word with ``round(rate * 2**32)`` (keep probability within
    ``2**-33`` of ``1 - rate``; Keras' float draw is quantised at ``2**-24``).
    Random integers are cheaper to draw and compare than floats.

    The words come from a stateless Philox draw keyed by ``(seed, n)``, where ``n``
    counts the layer's training calls in a variable of the layer (``calls``, saved
    in checkpoints). Every call draws a fresh mask, and the masks are a function of
    the seed and the count only: a run restored from a checkpoint draws exactly
    the masks the uninterrupted run drew, under XLA too. Under a distribution
    strategy each replica folds its replica id into the key.

    With ``native_kernels``, float32 inputs are dropped by the one-pass CPU kernel
    `tfrs_logq.sasrec.native.dropout` instead (the same seed draw; its fields are 1 bit at
    rate 0.5, 8 or 16 bits when they represent the rate exactly, else 32 bits); the
    masks differ from the TensorFlow-op path's but have the same distribution.

    Args:
      rate: float in ``[0, 1)``. Fraction of entries dropped.
      seed: optional int. The layer's key. Defaults to None: drawn from Python's
        `random` when the layer is made, so `tf.keras.utils.set_random_seed` (which
        seeds it) before building a model makes its masks reproducible.
      native_kernels: bool or None. See `tfrs_logq.sasrec.native.enabled`: None (default)
        uses the kernel on hosts without GPU or TPU when it builds. Inside XLA
        compilation (``jit_compile``), which cannot compile it, TensorFlow's ops run.
    """

    def __init__(self, rate: float, seed: Optional[int] = None,
                 native_kernels: Optional[bool] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"`rate` must be in [0, 1), received {rate}.")
        self.rate, self.seed = float(rate), seed
        self.native_kernels = native_kernels
        self._native = None  # decided (and the kernel built) at the first training call
        self._key = int(seed) if seed is not None else random.getrandbits(62)
        self._calls = None
        self.bits = 16 if float(self.rate * 2 ** 16).is_integer() else 32
        self.supports_masking = True

    def build(self, input_shape):
        # Per replica (on-read), so each replica counts its own calls; a checkpoint
        # holds the first replica's count (they are all equal).
        self._calls = self.add_weight(
            name="calls", shape=[], dtype=tf.int64, initializer="zeros", trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        super().build(input_shape)

    def _next_seed(self) -> tf.Tensor:
        """`[2]` int64 Philox key of this call: ``(seed, calls)``, the replica folded in."""
        self._calls.assign_add(1)
        seed = tf.stack([tf.constant(self._key, tf.int64), self._calls.read_value()])
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            replica = tf.cast(ctx.replica_id_in_sync_group, tf.int64)
            seed = tf.random.experimental.stateless_fold_in(seed, replica, alg="philox")
            seed = tf.cast(seed, tf.int64)
        return seed

    def call(self, inputs, training=None):
        if self.rate == 0.0:
            return tf.identity(inputs)
        if training is None:
            training = tf.keras.backend.learning_phase()
        return tf.__internal__.smart_cond.smart_cond(
            training, lambda: self._drop(inputs), lambda: tf.identity(inputs))

    def _drop(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        size = tf.size(inputs)
        per_word = 32 // self.bits
        seed = self._next_seed()
        if inputs.dtype == tf.float32:
            if self._native is None:
                self._native = native.enabled(self.native_kernels)
            if self._native and native.usable_here():
                return native.dropout(inputs, seed, self.rate)
        words = tf.random.stateless_uniform([(size + per_word - 1) // per_word], seed,
                                            minval=None, maxval=None, dtype=tf.uint32)
        if self.bits == 16:
            draws = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]
            threshold = tf.constant(int(self.rate * 2 ** 16), tf.uint16)
        else:
            draws = words
            threshold = tf.constant(min(round(self.rate * 2 ** 32), 2 ** 32 - 1), tf.uint32)
        keep = tf.reshape(draws >= threshold, tf.shape(inputs))
        # One scaled 0/scale mask and one multiply (its gradient is one multiply), as
        # `tf.nn.dropout` computes it, rather than a select on a scaled copy.
        mask = tf.where(keep, tf.constant(1.0 / (1.0 - self.rate), inputs.dtype),
                        tf.constant(0.0, inputs.dtype))
        return inputs * mask

    def get_config(self) -> dict:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed,
                "native_kernels": self.native_kernels}


@tf.keras.utils.register_keras_serializable(package="tfrs_logq")
class LayerNorm(tf.keras.layers.LayerNormalization):
    """`tf.keras.layers.LayerNormalization` (PyTorch's default epsilon, 1e-5) that
    trains with the fused CPU kernel of `tfrs_logq.sasrec.native` when asked to.

    Keras takes its unfused path when epsilon is below 1.001e-5 (six or so full-size
    elementwise ops forward, more backward); the kernel reads each row once forward
    and once backward, with the same result up to float rounding. It is used in
    training calls on float32 inputs normalised over the last axis with a scale and
    an offset (not ragged), outside XLA compilation and SavedModel tracing; inference
    (``training=False``, e.g. exported serving graphs) and every other case run Keras'
    ops, so SavedModels never hold the custom op. The weights
    (``gamma``, ``beta``) are Keras', so checkpoints are interchangeable.

    Args:
      epsilon: float. Defaults to 1e-5.
      native_kernels: bool or None. See `tfrs_logq.sasrec.native.enabled`: None (default)
        uses the kernel on hosts without GPU or TPU when it builds. Inside XLA
        compilation (``jit_compile``), which cannot compile it, TensorFlow's ops run.
      **kwargs: `tf.keras.layers.LayerNormalization`'s.
    """

    def __init__(self, epsilon: float = 1e-5, native_kernels: Optional[bool] = None,
                 **kwargs) -> None:
        super().__init__(epsilon=epsilon, **kwargs)
        self.native_kernels = native_kernels
        self._native = None  # decided (and the kernel built) at the first training call

    def call(self, inputs, training=None):
        # Only in calls known (in Python) to train; a symbolic or absent `training`
        # runs Keras' ops, which compute the same.
        if training is True:
            rank = inputs.shape.rank
            if (isinstance(inputs, tf.Tensor) and inputs.dtype == tf.float32
                    and rank is not None and self.axis == [rank - 1]
                    and self.center and self.scale):
                if self._native is None:
                    self._native = native.enabled(self.native_kernels)
                if self._native and native.usable_here():
                    return native.layer_norm(inputs, self.gamma, self.beta, self.epsilon)
        return super().call(inputs)

    def get_config(self) -> dict:
        return {**super().get_config(), "native_kernels": self.native_kernels}


@tf.keras.utils.register_keras_serializable(package="tfrs_logq")
class SASRecAttention(tf.keras.layers.Layer):
    """SASRec's causal self-attention, as gSASRec's PyTorch code computes it.

    Queries come from the layer-normalised state, keys and values from the raw
    state; query, key and value projections have a bias; the heads split the
    ``dim`` channels and there is no output projection (unlike
    `tf.keras.layers.MultiHeadAttention`). Key ``j`` is visible to query ``i``
    when ``j <= i`` and position ``j`` holds an item; a query that sees no key
    (a padding position of a left-padded sequence) outputs the mean of the values,
    where gSASRec outputs 0; `SASRecBlock` zeroes padding positions, so the blocks'
    outputs are the same. Dropout acts on the attention weights.

    Args:
      dim: int. Model width; must be divisible by ``num_heads``.
      num_heads: int.
      dropout: float. Attention-weight dropout rate.
      native_kernels: bool or None. Dropout by `tfrs_logq.sasrec.native` (see
        `WordDropout`).
    """

    def __init__(self, dim: int, num_heads: int, dropout: float,
                 native_kernels: Optional[bool] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if int(dim) % int(num_heads):
            raise ValueError(f"`dim` ({dim}) must be divisible by `num_heads` ({num_heads}).")
        self.dim, self.num_heads, self.dropout = int(dim), int(num_heads), float(dropout)
        self.query, self.key, self.value = (_dense(self.dim, name) for name in
                                            ("query", "key", "value"))
        self.native_kernels = native_kernels
        self.weight_dropout = WordDropout(self.dropout, native_kernels=native_kernels)

    def _heads(self, x: tf.Tensor) -> tf.Tensor:
        if self.num_heads == 1:
            return x  # [batch, L, dim]: no head axis to move
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        x = tf.reshape(x, [batch, length, self.num_heads, self.dim // self.num_heads])
        return tf.transpose(x, [0, 2, 1, 3])  # [batch, heads, L, dim / heads]

    def call(self, queries, keys, is_item, training=False):
        """`[b, L, dim]` normalised queries, `[b, L, dim]` keys/values, `[b, L]`
        bool ``is_item`` -> `[b, L, dim]`."""
        q, k, v = (self._heads(layer(x)) for layer, x in
                   ((self.query, queries), (self.key, keys), (self.value, keys)))
        # The 1/sqrt(d) scale on the [L, d] queries rather than the [L, L] scores
        # (exact when d is a power of 4, else within float rounding).
        q *= tf.cast(1.0 / math.sqrt(self.dim // self.num_heads), q.dtype)
        scores = tf.matmul(q, k, transpose_b=True)
        length = tf.shape(is_item)[1]
        causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
        visible = tf.logical_and(causal[None], is_item[:, None, :])  # [b, L, L]
        if self.num_heads > 1:
            visible = visible[:, None]
        # An additive mask (its gradient is the identity): hidden keys get -1e9
        # (-1e4 in float16), whose exp is 0.
        hidden = tf.constant(-1e4 if scores.dtype == tf.float16 else -1e9, scores.dtype)
        scores += tf.where(visible, tf.constant(0.0, scores.dtype), hidden)
        # A query that sees no key (a padding position) gets arbitrary weights here,
        # not 0 as in gSASRec: its state is zeroed at the end of the block
        # (`SASRecBlock`), so no output and no gradient depends on it, and a
        # [b, h, L, L] pass is saved.
        weights = tf.nn.softmax(scores, axis=-1)
        weights = self.weight_dropout(weights, training=training)
        out = tf.matmul(weights, v)
        if self.num_heads == 1:
            return out
        return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), tf.shape(queries))

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads,
                "dropout": self.dropout, "native_kernels": self.native_kernels}


@tf.keras.utils.register_keras_serializable(package="tfrs_logq")
class SASRecBlock(tf.keras.layers.Layer):
    """One SASRec block as in gSASRec's code::

        q = LN1(x);  h = LN2(q + Attention(q, x));  x' = (h + FFN(h)) * is_item

    with ``FFN(h) = Dropout(Dense(Dropout(relu(Dense(h)))))`` (hidden width =
    ``dim``). Note that both residuals start from normalised states (SASRec's
    original design), not from ``x``.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float,
                 layer_norm_epsilon: float = 1e-5, native_kernels: Optional[bool] = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.dim, self.num_heads, self.dropout = int(dim), int(num_heads), float(dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.native_kernels = native_kernels
        self.attention_norm = LayerNorm(self.layer_norm_epsilon, native_kernels,
                                        name="attention_norm")
        self.attention = SASRecAttention(self.dim, self.num_heads, self.dropout, native_kernels,
                                         name="attention")
        self.ffn_norm = LayerNorm(self.layer_norm_epsilon, native_kernels, name="ffn_norm")
        self.ffn_in = _dense(self.dim, "ffn_in", activation="relu")
        self.ffn_out = _dense(self.dim, "ffn_out")
        self.ffn_dropout = WordDropout(self.dropout, native_kernels=native_kernels)

    def call(self, x, is_item, training=False):
        q = self.attention_norm(x, training=training)
        h = self.ffn_norm(q + self.attention(q, x, is_item, training=training),
                          training=training)
        f = self.ffn_dropout(self.ffn_in(h), training=training)
        f = self.ffn_dropout(self.ffn_out(f), training=training)
        return (h + f) * tf.cast(is_item, h.dtype)[..., None]

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads,
                "dropout": self.dropout, "layer_norm_epsilon": self.layer_norm_epsilon,
                "native_kernels": self.native_kernels}


@tf.keras.utils.register_keras_serializable(package="tfrs_logq")
class SASRecEncoder(tf.keras.layers.Layer):
    """SASRec (Kang & McAuley 2018) exactly as gSASRec's code (the paper's
    backbone) builds it: item + learned absolute position embeddings (no
    ``sqrt(dim)`` scaling), dropout, causal self-attention blocks
    (`SASRecBlock`), a final layer norm. The output at every position is a
    query embedding, scored against a separate output item table
    (`item_embeddings`).

    Every kernel and embedding starts from a truncated normal (std 0.02, cut at
    2 std), biases at 0, layer-norm scales at 1; layer norms use epsilon 1e-5
    (PyTorch's default), as in gSASRec.

    Args:
      num_ids: int. Item id space, ``num_items + 1`` (0 is padding).
      max_length: int. ``L``.
      dim: int. Embedding size. Defaults to 128.
      num_blocks: int. Defaults to 2.
      num_heads: int. Defaults to 1.
      dropout: float. Defaults to 0.5 (the paper's runs).
      share_item_embeddings: bool. Score against the input item table instead
        of a separate output table (gSASRec's ``reuse_item_embeddings=True``,
        SASRec's original choice): half the item parameters, which matters for
        very large catalogs, but on ML-1M it learns markedly more slowly.
        Defaults to False (gSASRec's default, the paper's runs).
      length_buckets: int. Speed only, the result is the same: sort the batch's
        sequences by length, split them into this many groups and run the blocks
        on each group with its leading all-padding columns cut off (nothing
        crosses sequences in SASRec, and padding keys are masked, so every
        output is unchanged; padding outputs are those of a zero state, as
        without buckets). On ML-1M at L = 200, where half of all positions are
        padding, 8 buckets do about 0.59 of the dense and 0.47 of the attention
        work. Needs dynamic shapes: use 1 under XLA or on TPU. Defaults to 1.
      native_kernels: bool or None. Layer norms and dropout in training calls run
        the fused CPU kernels of `tfrs_logq.sasrec.native` (see `LayerNorm`,
        `WordDropout`): None (default) on hosts without GPU or TPU when they build;
        never inside XLA compilation.
    """

    def __init__(self, num_ids: int, max_length: int, dim: int = 128, num_blocks: int = 2,
                 num_heads: int = 1, dropout: float = 0.5, share_item_embeddings: bool = False,
                 length_buckets: int = 1, native_kernels: Optional[bool] = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_ids, self.max_length, self.dim = int(num_ids), int(max_length), int(dim)
        self.num_blocks, self.num_heads = int(num_blocks), int(num_heads)
        self.dropout = float(dropout)
        self.share_item_embeddings = bool(share_item_embeddings)
        if int(length_buckets) < 1:
            raise ValueError(f"`length_buckets` must be >= 1, received {length_buckets}.")
        self.length_buckets = int(length_buckets)
        self.native_kernels = native_kernels
        self.item_embedding = _embedding(self.num_ids, self.dim, "items")
        self.position_embedding = _embedding(self.max_length, self.dim, "positions")
        self.output_embedding = None if self.share_item_embeddings else (
            _embedding(self.num_ids, self.dim, "output_items"))
        self.input_dropout = WordDropout(self.dropout, native_kernels=native_kernels)
        self.blocks = [SASRecBlock(self.dim, self.num_heads, self.dropout,
                                   native_kernels=native_kernels, name=f"block_{i}")
                       for i in range(self.num_blocks)]
        self.final_norm = LayerNorm(1e-5, native_kernels, name="final_norm")

    def build(self, input_shape=None):
        for table in (self.item_embedding, self.output_embedding):
            if table is not None and not table.built:
                table.build([None])
        super().build(input_shape)

    def call(self, input_ids, training=False):
        """`[batch, L]` item ids (0 = padding, left-padded) -> `[batch, L, dim]`."""
        if self.length_buckets == 1:
            length = tf.shape(input_ids)[1]
            return self.final_norm(self._blocks(input_ids, tf.range(length), training),
                                   training=training)
        return self._bucketed_blocks(input_ids, training)

    def _blocks(self, input_ids, positions, training):
        """The state after the last block (before the final norm) for `[n, m]` ids at
        absolute ``positions`` `[m]`."""
        is_item = tf.not_equal(input_ids, 0)
        x = self.item_embedding(input_ids)
        x = x + self.position_embedding(positions)[None]
        x = self.input_dropout(x, training=training) * tf.cast(is_item, x.dtype)[..., None]
        for block in self.blocks:
            x = block(x, is_item, training=training)
        return x

    def _bucketed_blocks(self, input_ids, training):
        """``final_norm(_blocks(...))`` over all `[n, L]` ids, computed per group of
        sequences of similar span (columns from the first item on), each group cut to
        its longest span. The cut columns are padding, whose state is 0 after the
        blocks, so their output is the final norm of 0: its offset ``beta``."""
        shape = tf.shape(input_ids)
        n, length = shape[0], shape[1]
        is_item = tf.not_equal(input_ids, 0)
        first = tf.argmax(tf.cast(is_item, tf.int32), axis=1, output_type=tf.int32)
        span = tf.where(tf.reduce_any(is_item, axis=1), length - first, 0)
        order = tf.argsort(span, direction="DESCENDING", stable=True)
        sorted_span = tf.gather(span, order)
        outputs = []
        for g in range(self.length_buckets):
            start = g * n // self.length_buckets
            end = (g + 1) * n // self.length_buckets
            # At least one column, so that empty groups and all-padding rows keep
            # well-formed shapes; the group's longest span is its first (sorted).
            width = tf.maximum(tf.reduce_max(tf.concat([sorted_span[start:end], [1]], 0)), 1)
            ids = tf.gather(input_ids, order[start:end])[:, length - width:]
            x = self.final_norm(self._blocks(ids, tf.range(length - width, length), training),
                                training=training)
            offset = tf.broadcast_to(tf.cast(self.final_norm.beta, x.dtype),
                                     [tf.shape(x)[0], length - width, self.dim])
            outputs.append(tf.concat([offset, x], axis=1))
        x = tf.gather(tf.concat(outputs, axis=0), tf.math.invert_permutation(order))
        x.set_shape(input_ids.shape.concatenate([self.dim]))
        return x

    def item_embeddings(self) -> tf.Tensor:
        """`[num_ids, dim]`: the table queries are scored against (row 0 is padding)."""
        if not self.built:
            self.build()
        table = self.item_embedding if self.output_embedding is None else self.output_embedding
        return table.embeddings

    def last_query(self, input_ids, training=False) -> tf.Tensor:
        """`[batch, dim]`: the output at the last position (inputs are left-padded)."""
        return self(input_ids, training=training)[:, -1, :]

    def get_config(self) -> dict:
        return {**super().get_config(), "num_ids": self.num_ids, "max_length": self.max_length,
                "dim": self.dim, "num_blocks": self.num_blocks, "num_heads": self.num_heads,
                "dropout": self.dropout, "share_item_embeddings": self.share_item_embeddings,
                "length_buckets": self.length_buckets, "native_kernels": self.native_kernels}


class SequentialRetrievalModel(tfrs.Model):
    """A sequence encoder (e.g. `SASRecEncoder`) trained with a `SequenceObjective`.

    Features: ``{"input_ids", "target_ids": [batch, L], "is_target": [batch, L]}``
    (from `tfrs_logq.pipelines.sequential.training_dataset`).
    """

    def __init__(self, encoder: SASRecEncoder, objective) -> None:
        super().__init__()
        self.encoder = encoder
        self.objective = objective

    def train_step(self, inputs):
        """`tfrs.Model.train_step`, plus loss scaling when the optimizer is a
        `LossScaleOptimizer` (mixed float16)."""
        scaling = isinstance(self.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        with tf.GradientTape() as tape:
            loss = self.compute_loss(inputs, training=True)
            regularization_loss = tf.add_n([tf.cast(x, loss.dtype) for x in self.losses]) \
                if self.losses else tf.zeros([], loss.dtype)
            total_loss = loss + regularization_loss
            scaled = self.optimizer.get_scaled_loss(total_loss) if scaling else total_loss
        gradients = tape.gradient(scaled, self.trainable_variables)
        if scaling:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        metrics = {metric.name: metric.result() for metric in self.metrics}
        metrics.update(loss=loss, regularization_loss=regularization_loss,
                       total_loss=total_loss)
        return metrics

    def compute_loss(self, features, training: bool = False) -> tf.Tensor:
        queries = self.encoder(features["input_ids"], training=training)
        return self.objective(queries, features["target_ids"], features["is_target"],
                              self.encoder.item_embeddings())

    def query(self, history: tf.Tensor) -> tf.Tensor:
        """`[batch, L]` histories -> `[batch, dim]` query embeddings (inference)."""
        return self.encoder.last_query(history, training=False)


__all__ = ["LayerNorm", "SASRecAttention", "SASRecBlock", "SASRecEncoder",
           "SequentialRetrievalModel", "WordDropout", "gsasrec_initializer"]
