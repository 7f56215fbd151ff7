"""Two-tower retrieval: a query tower over the user's recent history and an item
embedding table, trained with `CorrectedRetrieval`: the one two-tower model, which the
demo, ``model.fit`` and the two-tower trainer (`tfrs_logq.towers`, its own loop over
`TwoTowerModel.retrieval_loss` with sampled negatives) all train."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq.sampling import SampledNegatives
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
        return self.retrieval_loss(features["history"], target, log_q)

    def retrieval_loss(self, history: tf.Tensor, positive_ids: tf.Tensor,
                       positive_log_q: Optional[tf.Tensor] = None,
                       negatives: Optional[SampledNegatives] = None,
                       sample_weight: Optional[tf.Tensor] = None) -> tf.Tensor:
        """The task's loss of the queries of ``history`` against the candidates
        ``[positive_ids; negatives.ids]``: in-batch (the other rows' positives) when
        ``negatives`` is None, else each row's own positive and the shared sampled
        negatives alone (``negatives.score_mask``, as `tfrs_logq.sampling` describes).

        Args:
          history: `[batch_size, L]` int item ids, 0 padding.
          positive_ids: `[batch_size]` int64 item ids.
          positive_log_q: `[batch_size]` float32 ``log Q`` of the positives, or None
            (the task then needs none: correction ``none``).
          negatives: `SampledNegatives` shared by the batch, or None. Defaults to None.
          sample_weight: `[batch_size]` float32 loss weight of each row, or None.
        """
        ids, log_q, score_mask = positive_ids, positive_log_q, None
        if negatives is not None:
            ids = tf.concat([positive_ids, negatives.ids], 0)
            if positive_log_q is not None:
                log_q = tf.concat([positive_log_q, negatives.log_q], 0)
            score_mask = negatives.score_mask(tf.shape(positive_ids)[0])
        return self.task(
            self.query_tower(history),
            self.item_tower(ids),
            candidate_ids=ids,
            candidate_log_sampling_probability=log_q,
            score_mask=score_mask,
            sample_weight=sample_weight,
            compute_metrics=False,
            compute_batch_metrics=False,
        )

    def item_embeddings(self) -> tf.Tensor:
        """`[num_ids, dim]` item embedding table (row 0 is padding)."""
        if not self.item_tower.built:
            self.item_tower(tf.zeros([1], tf.int64))
        return self.item_tower.embeddings


__all__ = ["HistoryQueryTower", "TwoTowerModel"]
