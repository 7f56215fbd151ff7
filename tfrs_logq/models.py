"""Retrieval models built on `CorrectedRetrieval`."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq.tasks import CorrectedRetrieval


class HistoryQueryTower(tf.keras.layers.Layer):
    """Query tower: masked mean of history item embeddings, then a 2-layer MLP.

    Args:
      num_ids: int. Size of the item id space (id 0 is padding).
      embedding_dim: int. Output dimension.
    """

    def __init__(self, num_ids: int, embedding_dim: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_ids, self.embedding_dim = int(num_ids), int(embedding_dim)
        self.embedding = tf.keras.layers.Embedding(self.num_ids, self.embedding_dim)
        self.hidden = tf.keras.layers.Dense(2 * self.embedding_dim, activation="relu")
        self.out = tf.keras.layers.Dense(self.embedding_dim)

    def call(self, history: tf.Tensor) -> tf.Tensor:
        is_item = tf.cast(tf.not_equal(history, 0), self.compute_dtype)[..., None]
        summed = tf.reduce_sum(self.embedding(history) * is_item, axis=1)
        mean = summed / tf.maximum(tf.reduce_sum(is_item, axis=1), 1.0)
        return self.out(self.hidden(mean))

    def get_config(self) -> dict:
        return {**super().get_config(), "num_ids": self.num_ids,
                "embedding_dim": self.embedding_dim}


class TwoTowerModel(tfrs.Model):
    """Two-tower retrieval with in-batch negatives and a logQ-corrected loss.

    Features: ``{"history": [batch, L] int (0 = padding), "target": [batch] int}``.
    ``log Q`` of each in-batch candidate comes from ``frequency`` (an estimator
    of :mod:`tfrs_logq.frequency`, updated with every training batch's targets)
    or, when None, from a ``"target_log_q"`` feature.

    Args:
      num_ids: int. Item id space (``num_items + 1``; 0 is padding).
      embedding_dim: int. Embedding size.
      task: `CorrectedRetrieval`.
      frequency: optional frequency estimator.
    """

    def __init__(
        self,
        num_ids: int,
        embedding_dim: int,
        task: CorrectedRetrieval,
        frequency: Optional[tf.Module] = None,
    ) -> None:
        super().__init__()
        self.query_tower = HistoryQueryTower(num_ids, embedding_dim)
        self.item_tower = tf.keras.layers.Embedding(int(num_ids), int(embedding_dim))
        self.task = task
        self.frequency = frequency

    def compute_loss(self, features, training: bool = False) -> tf.Tensor:
        target = tf.cast(features["target"], tf.int64)
        log_q = None
        if self.task.correction != "none":
            if self.frequency is not None:
                if training:
                    self.frequency.update(target)
                log_q = self.frequency.log_q(target)
            else:
                log_q = features["target_log_q"]
        return self.task(
            self.query_tower(features["history"]),
            self.item_tower(target),
            candidate_ids=target,
            candidate_log_sampling_probability=log_q,
            compute_metrics=False,
            compute_batch_metrics=False,
        )

    def item_embeddings(self) -> tf.Tensor:
        """`[num_ids, dim]` item embedding table (row 0 is padding)."""
        if not self.item_tower.built:
            self.item_tower(tf.zeros([1], tf.int64))
        return self.item_tower.embeddings




class SASRecBlock(tf.keras.layers.Layer):
    """One causal self-attention block (pre-layer-norm, as SASRec's code does)."""

    def __init__(self, dim: int, num_heads: int, dropout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dim, self.num_heads, self.dropout = int(dim), int(num_heads), float(dropout)
        self.attention_norm = tf.keras.layers.LayerNormalization(epsilon=1e-8)
        self.attention = tf.keras.layers.MultiHeadAttention(
            num_heads=self.num_heads, key_dim=self.dim // self.num_heads, dropout=self.dropout)
        self.ffn_norm = tf.keras.layers.LayerNormalization(epsilon=1e-8)
        self.ffn_in = tf.keras.layers.Dense(self.dim, activation="relu")
        self.ffn_out = tf.keras.layers.Dense(self.dim)
        self.ffn_dropout = tf.keras.layers.Dropout(self.dropout)

    def call(self, x, is_item, training=False):
        length = tf.shape(x)[1]
        causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
        mask = tf.logical_and(causal[None], is_item[:, None, :])
        q = self.attention_norm(x)
        x = q + self.attention(q, x, attention_mask=mask, training=training)
        h = self.ffn_norm(x)
        h = self.ffn_dropout(self.ffn_out(self.ffn_dropout(self.ffn_in(h), training=training)),
                             training=training)
        x = x + h
        return x * tf.cast(is_item, x.dtype)[..., None]

    def get_config(self) -> dict:
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads,
                "dropout": self.dropout}


class SASRecEncoder(tf.keras.layers.Layer):
    """SASRec (Kang & McAuley 2018): item + learned position embeddings, causal
    self-attention blocks; the output at every position is a query embedding,
    scored against the same item embeddings.

    Args:
      num_ids: int. Item id space, ``num_items + 1`` (0 is padding).
      max_length: int. ``L``.
      dim: int. Embedding size. Defaults to 128.
      num_blocks: int. Defaults to 2.
      num_heads: int. Defaults to 1.
      dropout: float. Defaults to 0.5 (the paper's runs).
    """

    def __init__(self, num_ids: int, max_length: int, dim: int = 128, num_blocks: int = 2,
                 num_heads: int = 1, dropout: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_ids, self.max_length, self.dim = int(num_ids), int(max_length), int(dim)
        self.num_blocks, self.num_heads, self.dropout = int(num_blocks), int(num_heads), dropout
        self.item_embedding = tf.keras.layers.Embedding(self.num_ids, self.dim, name="items")
        self.position_embedding = tf.keras.layers.Embedding(self.max_length, self.dim,
                                                            name="positions")
        self.input_dropout = tf.keras.layers.Dropout(dropout)
        self.blocks = [SASRecBlock(self.dim, self.num_heads, dropout, name=f"block_{i}")
                       for i in range(self.num_blocks)]
        self.final_norm = tf.keras.layers.LayerNormalization(epsilon=1e-8)

    def call(self, input_ids, training=False):
        """`[batch, L]` item ids (0 = padding, left-padded) -> `[batch, L, dim]`."""
        is_item = tf.not_equal(input_ids, 0)
        x = self.item_embedding(input_ids) * tf.sqrt(tf.cast(self.dim, self.compute_dtype))
        positions = tf.range(tf.shape(input_ids)[1])
        x = x + self.position_embedding(positions)[None]
        x = self.input_dropout(x, training=training) * tf.cast(is_item, x.dtype)[..., None]
        for block in self.blocks:
            x = block(x, is_item, training=training)
        return self.final_norm(x)

    def item_embeddings(self) -> tf.Tensor:
        if not self.item_embedding.built:
            self.item_embedding(tf.zeros([1], tf.int32))
        return self.item_embedding.embeddings

    def last_query(self, input_ids, training=False) -> tf.Tensor:
        """`[batch, dim]`: the output at the last position (inputs are left-padded)."""
        return self(input_ids, training=training)[:, -1, :]

    def get_config(self) -> dict:
        return {**super().get_config(), "num_ids": self.num_ids, "max_length": self.max_length,
                "dim": self.dim, "num_blocks": self.num_blocks, "num_heads": self.num_heads,
                "dropout": self.dropout}


class SequentialRetrievalModel(tfrs.Model):
    """A sequence encoder (e.g. `SASRecEncoder`) trained with a `SequenceObjective`.

    Features: ``{"input_ids", "target_ids": [batch, L], "is_target": [batch, L]}``
    (from `tfrs_logq.pipelines.sequential.training_dataset`).
    """

    def __init__(self, encoder: SASRecEncoder, objective) -> None:
        super().__init__()
        self.encoder = encoder
        self.objective = objective

    def compute_loss(self, features, training: bool = False) -> tf.Tensor:
        queries = self.encoder(features["input_ids"], training=training)
        return self.objective(queries, features["target_ids"], features["is_target"],
                              self.encoder.item_embeddings())

    def query(self, history: tf.Tensor) -> tf.Tensor:
        """`[batch, L]` histories -> `[batch, dim]` query embeddings (inference)."""
        return self.encoder.last_query(history, training=False)


__all__ = ["HistoryQueryTower", "SASRecBlock", "SASRecEncoder", "SequentialRetrievalModel",
           "TwoTowerModel"]
