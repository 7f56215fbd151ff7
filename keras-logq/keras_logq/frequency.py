"""`ItemFrequency`: exact item counts in Keras variables, giving ``log Q(d)`` in the graph.

``Q(d) = #d / N`` is the per-draw unigram probability of item ``d``, the proposal
of in-batch sampling. The counts are non-trainable `keras.Variable`s of the layer:
they are saved with the model (``.keras``, checkpoints) and updated inside
`model.fit` on every backend (on JAX through Keras' stateless training step, as
`BatchNormalization`'s moving statistics are), when the layer is called with
``training=True`` from the model's ``call()``.

The mirror of `tfrs_logq.frequency.ExactFrequency` (TensorFlow).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


@keras.saving.register_keras_serializable(package="keras_logq")
class ItemFrequency(keras.layers.Layer):
    """Exact item counts: ``log Q(d) = log(max(#d, min_count) / max(N, 1))``.

    Counts are float32 variables (exact up to 2^24 occurrences of one item).

    Args:
        num_items: int. Size of the id space; ids lie in ``[0, num_items)``.
        min_count: float. Counts are floored at this before the log, so an
            unseen item gets a finite ``log Q``. Defaults to 1.
        **kwargs: other `keras.layers.Layer` arguments.

    Call arguments:
        ids: int tensor, any shape. Items to look up.
        training: bool. When `True` the ids are counted first (one occurrence
            each), so the estimate includes the current batch. Defaults to
            `None` (no update).

    Returns:
        float32 ``log Q`` of each id, the shape of ``ids``.

    Example:

    ```python
    frequency = keras_logq.ItemFrequency(num_items=10_000)
    log_q = frequency(batch["item"], training=True)  # counts the batch, then looks up
    ```
    """

    def __init__(self, num_items: int, min_count: float = 1.0, **kwargs) -> None:
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if isinstance(num_items, bool) or int(num_items) != num_items or int(num_items) < 1:
            raise ValueError(f"`num_items` must be a positive int, received {num_items!r}.")
        if not min_count > 0:
            raise ValueError(f"`min_count` must be positive, received {min_count!r}.")
        self.num_items = int(num_items)
        self.min_count = float(min_count)
        self.counts = self.add_weight(
            shape=(self.num_items,), initializer="zeros", trainable=False,
            dtype="float32", name="counts",
        )
        self.total = self.add_weight(
            shape=(), initializer="zeros", trainable=False, dtype="float32", name="total",
        )
        self.built = True

    def set_counts(self, counts) -> None:
        """Replaces the state by a `[num_items]` vector of counts (e.g. from a dataset)."""
        counts = np.asarray(counts, np.float32).reshape(-1)
        if counts.shape != (self.num_items,) or (counts < 0).any():
            raise ValueError(
                f"`counts` must be {self.num_items} non-negative counts, received shape "
                f"{counts.shape}."
            )
        self.counts.assign(counts)
        self.total.assign(counts.sum())

    def update(self, ids) -> None:
        """Adds one occurrence of every id in ``ids``."""
        ids = ops.reshape(ops.cast(ids, "int32"), (-1,))
        added = ops.segment_sum(ops.ones(ops.shape(ids), "float32"), ids,
                                num_segments=self.num_items)
        self.counts.assign(self.counts + added)
        self.total.assign(self.total + ops.cast(ops.shape(ids)[0], "float32"))

    def count(self, ids):
        return ops.take(self.counts, ops.cast(ids, "int32"))

    def log_q(self, ids):
        """float32 ``log Q(d)`` of each id."""
        counts = ops.maximum(self.count(ids), self.min_count)
        return ops.log(counts) - ops.log(ops.maximum(self.total, 1.0))

    def call(self, ids, training=None):
        if training:
            self.update(ids)
        return self.log_q(ids)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(num_items=self.num_items, min_count=self.min_count)
        return config
