"""Negative samplers: in-batch, uniform over a catalog, and mixed, with their ``log Q``.

Every sampler is a Keras layer that returns `SampledNegatives`: a fixed-size
`[k]` vector of ids, the ``log Q`` to correct them with, and an ``is_valid``
mask (False marks padding when fewer than ``k`` distinct in-batch items exist).
Shapes are static (sort and top-k, no `unique`), so the samplers run under
`jit_compile` on every backend; their random state is a `keras.random.SeedGenerator`,
tracked by the layer, so it advances under `model.fit` on JAX as well. The
negatives are shared by every row of the batch:

```python
negatives = sampler(positive_ids)
candidate_ids = keras.ops.concatenate([positive_ids, negatives.ids])
log_q = keras.ops.concatenate([positive_log_q, negatives.log_q])
scores = query_embeddings @ item_tower(candidate_ids).T
loss = CorrectedRetrieval()(scores, candidate_ids, log_q,
                            is_negative=negatives.score_mask(batch_size))
```

The mirror of `tfrs_logq.sampling` (TensorFlow).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import keras
from keras import ops

LOG_Q_MODES = ("unigram", "mixture")


class SampledNegatives(NamedTuple):
    """Negatives shared by a batch.

    Attributes:
        ids: int tensor, `[k]`. Item ids (padding entries hold ``pad_id``).
        log_q: float32 tensor, `[k]`. ``log Q(d)`` to correct each negative with
            (0 on padding).
        is_valid: bool tensor, `[k]`. `False` for padding entries.
    """

    ids: object
    log_q: object
    is_valid: object

    def score_mask(self, num_queries: int):
        """`[num_queries, num_queries + k]` bool mask for candidates ``[positives; ids]``.

        True on the diagonal (each row's own positive) and on valid sampled
        negatives; False on the other rows' positives and on padding.
        """
        rows = ops.arange(num_queries)
        eye = ops.equal(rows[:, None], rows[None, :])
        extra = ops.logical_and(
            ops.ones((num_queries, 1), "bool"), ops.cast(self.is_valid, "bool")[None, :]
        )
        return ops.concatenate([eye, extra], axis=1)


def _check_positive_int(value, name: str) -> int:
    if value is None or isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"`{name}` must be a positive int, received {value!r}.")
    return int(value)


def _flat_ids(ids):
    ids = ops.convert_to_tensor(ids)
    kind = keras.backend.standardize_dtype(ids.dtype)
    if "int" not in kind:
        raise ValueError(f"`ids` must be an integer tensor, received dtype {kind}.")
    return ops.reshape(ids, (-1,))


def batch_log_frequency(ids, batch_ids, is_real=None):
    """``log(#id in batch / batch size)``: the unigram estimate from one batch.

    ``is_real`` (bool, like ``batch_ids``) marks the entries that count towards the
    batch size (padding does not); all of them by default. An id absent from the
    batch gets count 1.
    """
    ids, batch_ids = _flat_ids(ids), _flat_ids(batch_ids)
    batch_ids = ops.cast(batch_ids, ids.dtype)
    counts = ops.sum(ops.cast(ops.equal(ids[:, None], batch_ids[None, :]), "float32"), axis=1)
    if is_real is None:
        real = ops.cast(ops.shape(batch_ids)[0], "float32")
    else:
        real = ops.sum(ops.cast(is_real, "float32"))
    return ops.log(ops.maximum(counts, 1.0) / ops.maximum(real, 1.0))


def distinct_in_random_order(ids, k: int, seed, pad_id: int = 0, distinct: bool = True):
    """The distinct values of ``ids`` (``pad_id`` excluded) in uniformly random order.

    The first ``k`` are kept: ``(ids_out [k], is_valid [k])``, padded with
    ``pad_id`` (``is_valid`` False) when fewer than ``k`` distinct values exist.
    With ``distinct=False`` every non-padding entry is a candidate: ``k``
    positions drawn without replacement. Static shapes only (sort, first
    occurrences, random keys, top-k).

    Args:
        ids: int tensor of any shape (flattened).
        k: int. Number of ids returned.
        seed: a `keras.random.SeedGenerator` or an int.
        pad_id: int. Ignored in ``ids`` and used for padding. Defaults to 0.
        distinct: bool. Deduplicate before drawing. Defaults to `True`.
    """
    k = _check_positive_int(k, "k")
    flat = _flat_ids(ids)
    ordered = ops.sort(flat)
    pad = ops.cast(pad_id, ordered.dtype)
    keep = ops.not_equal(ordered, pad)
    if distinct:
        first = ops.concatenate(
            [ops.ones((1,), "bool"), ops.not_equal(ordered[1:], ordered[:-1])], axis=0
        )
        keep = ops.logical_and(first, keep)
    keys = keras.random.uniform(ops.shape(ordered), seed=seed, dtype="float32")
    keys = ops.where(keep, keys, 2.0)  # kept keys lie in [0, 1)
    padded_keys = ops.concatenate([keys, ops.full((k,), 3.0, "float32")], axis=0)
    padded_ids = ops.concatenate([ordered, ops.full((k,), pad_id, ordered.dtype)], axis=0)
    _, order = ops.top_k(-padded_keys, k=k)
    is_valid = ops.take(padded_keys, order) < 1.0
    out = ops.where(is_valid, ops.take(padded_ids, order), pad)
    return out, is_valid


@keras.saving.register_keras_serializable(package="keras_logq")
class InBatchNegatives(keras.layers.Layer):
    """Negatives drawn from the batch's own positives (a unigram proposal).

    With ``deduplicate=True`` the batch's distinct items are shuffled and the
    first ``num_negatives`` kept, as the paper's official code does; otherwise
    ``num_negatives`` positions of the batch are drawn without replacement.
    ``log Q`` is the batch's own frequency of each item, or a frequency
    estimator's (`keras_logq.ItemFrequency`) when one is given.

    Args:
        num_negatives: int. ``k``, the number of negatives returned.
        deduplicate: bool. Sample from distinct items. Defaults to `True`.
        pad_id: int. Id of padding in the positives (ignored) and of padding
            entries in the output. Defaults to 0.
        seed: int. Seed of the layer's `keras.random.SeedGenerator`. Defaults
            to `None`.
        **kwargs: other `keras.layers.Layer` arguments.

    Call arguments:
        positive_ids: int tensor, any shape. The batch's positives.
        frequency: optional `keras_logq.ItemFrequency` (anything with
            ``log_q(ids)``) giving ``log Q(d)``. Defaults to `None`.

    Example:

    ```python
    sampler = keras_logq.InBatchNegatives(num_negatives=64, seed=1)
    negatives = sampler(batch["item"])  # ids [64], log_q [64], is_valid [64]
    ```
    """

    def __init__(
        self,
        num_negatives: int,
        deduplicate: bool = True,
        pad_id: int = 0,
        seed: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.num_negatives = _check_positive_int(num_negatives, "num_negatives")
        self.deduplicate = bool(deduplicate)
        self.pad_id = int(pad_id)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def log_q(self, ids, batch_ids, frequency=None):
        if frequency is not None:
            return ops.cast(frequency.log_q(ids), "float32")
        batch_ids = _flat_ids(batch_ids)
        return batch_log_frequency(ids, batch_ids, ops.not_equal(batch_ids, self.pad_id))

    def call(self, positive_ids, frequency=None) -> SampledNegatives:
        ids = _flat_ids(positive_ids)
        sampled, is_valid = distinct_in_random_order(
            ids, self.num_negatives, self.seed_generator, pad_id=self.pad_id,
            distinct=self.deduplicate,
        )
        log_q = ops.where(is_valid, self.log_q(sampled, ids, frequency), 0.0)
        return SampledNegatives(sampled, log_q, is_valid)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(num_negatives=self.num_negatives, deduplicate=self.deduplicate,
                      pad_id=self.pad_id, seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="keras_logq")
class UniformNegatives(keras.layers.Layer):
    """``k`` negatives drawn uniformly, with replacement, from a catalog.

    The catalog is the ``num_items`` ids ``first_id, ..., first_id + num_items - 1``
    (the default ``first_id=1`` keeps id 0 free for padding); ``log Q = -log num_items``.

    Args:
        num_items: int. Catalog size ``V``.
        num_negatives: int. ``k``.
        first_id: int. Smallest catalog id. Defaults to 1.
        seed: int. Seed of the layer's `keras.random.SeedGenerator`. Defaults
            to `None`.
        **kwargs: other `keras.layers.Layer` arguments.

    Call arguments:
        positive_ids: ignored (the draw does not depend on the batch).

    Example:

    ```python
    negatives = keras_logq.UniformNegatives(num_items=10_000, num_negatives=128)(None)
    ```
    """

    def __init__(self, num_items: int, num_negatives: int, first_id: int = 1,
                 seed: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_items = _check_positive_int(num_items, "num_items")
        self.num_negatives = _check_positive_int(num_negatives, "num_negatives")
        self.first_id = int(first_id)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, positive_ids=None) -> SampledNegatives:
        ids = keras.random.randint(
            (self.num_negatives,), self.first_id, self.first_id + self.num_items,
            seed=self.seed_generator, dtype="int32",
        )
        log_q = ops.full((self.num_negatives,), -math.log(self.num_items), "float32")
        return SampledNegatives(ids, log_q, ops.ones((self.num_negatives,), "bool"))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(num_items=self.num_items, num_negatives=self.num_negatives,
                      first_id=self.first_id, seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="keras_logq")
class MixedNegatives(keras.layers.Layer):
    """Mixed negative sampling (Yang et al. 2020): uniform and in-batch negatives.

    Args:
        uniform: `UniformNegatives` for the ``k_uniform`` part.
        in_batch: `InBatchNegatives` for the ``k_in_batch`` part.
        log_q: str. ``"unigram"`` (the paper: every negative, the uniform ones
            too, is corrected with the unigram ``log Q`` of the in-batch
            sampler) or ``"mixture"`` (the proposal of one negative slot of the
            mixture, ``Q(d) = a / V + (1 - a) Q_unigram(d)`` with
            ``a = k_uniform / k``). Defaults to ``"unigram"``.
        **kwargs: other `keras.layers.Layer` arguments.

    Call arguments:
        positive_ids: int tensor, any shape. The batch's positives.
        frequency: optional `keras_logq.ItemFrequency` for the unigram ``log Q``.

    Example:

    ```python
    sampler = keras_logq.MixedNegatives(
        keras_logq.UniformNegatives(num_items=10_000, num_negatives=64),
        keras_logq.InBatchNegatives(num_negatives=64),
    )
    negatives = sampler(batch["item"])  # 128 ids: 64 uniform, then 64 in-batch
    ```
    """

    def __init__(self, uniform: UniformNegatives, in_batch: InBatchNegatives,
                 log_q: str = "unigram", **kwargs) -> None:
        super().__init__(**kwargs)
        if log_q not in LOG_Q_MODES:
            raise ValueError(f"`log_q` must be one of {LOG_Q_MODES}, received {log_q!r}.")
        if isinstance(uniform, dict):
            uniform = keras.saving.deserialize_keras_object(uniform)
        if isinstance(in_batch, dict):
            in_batch = keras.saving.deserialize_keras_object(in_batch)
        self.uniform = uniform
        self.in_batch = in_batch
        self.log_q_mode = log_q

    @property
    def num_negatives(self) -> int:
        return self.uniform.num_negatives + self.in_batch.num_negatives

    def call(self, positive_ids, frequency=None) -> SampledNegatives:
        batch_ids = _flat_ids(positive_ids)
        uni = self.uniform(positive_ids)
        inb = self.in_batch(positive_ids, frequency=frequency)
        ids = ops.concatenate([ops.cast(uni.ids, batch_ids.dtype), inb.ids], axis=0)
        is_valid = ops.concatenate([uni.is_valid, inb.is_valid], axis=0)
        uniform_unigram = self.in_batch.log_q(ops.cast(uni.ids, batch_ids.dtype), batch_ids,
                                              frequency)
        unigram = ops.concatenate([uniform_unigram, inb.log_q], axis=0)
        if self.log_q_mode == "unigram":
            log_q = unigram
        else:
            a = self.uniform.num_negatives / self.num_negatives
            log_q = ops.log(a / self.uniform.num_items + (1.0 - a) * ops.exp(unigram))
        log_q = ops.where(is_valid, log_q, 0.0)
        return SampledNegatives(ids, log_q, is_valid)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(uniform=keras.saving.serialize_keras_object(self.uniform),
                      in_batch=keras.saving.serialize_keras_object(self.in_batch),
                      log_q=self.log_q_mode)
        return config
