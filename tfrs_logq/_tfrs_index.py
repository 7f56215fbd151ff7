"""What a TFRS top-k index returns as identifiers, read from TFRS 0.7.7's layers: the one
place that reads their private attributes (``Streaming._candidates``,
``ScaNN._identifiers``, ``BruteForce._identifiers``, ``FactorizedTopK._candidates``), so
that the task's metrics get the ``true_candidate_ids`` stock TFRS gives them
(`metric_ids`). tests/tfrs_flows/test_tfrs_index.py pins those attributes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

_POSITIONS = "positions"


def index_identifiers_dtype(index):
    """What a TFRS top-k index returns as identifiers: their dtype; ``"positions"`` when
    it was built from embeddings alone (as TFRS's tutorials build it); None when this
    cannot be read (an index class of your own).

    `tfrs.layers.factorized_top_k.Streaming` over a dataset of embeddings and `ScaNN`
    without identifiers return positions; so does `BruteForce` indexed without
    identifiers, whose identifiers are then ``0..n-1`` as int32 (an index given exactly
    those int32 ids reads the same: they are its positions). Read when the metric's step is
    traced.
    """
    from tensorflow_recommenders.layers import factorized_top_k as top_k

    if isinstance(index, top_k.Streaming):
        dataset = getattr(index, "_candidates", None)
        spec = None if dataset is None else dataset.element_spec
        return spec[0].dtype if isinstance(spec, tuple) else _POSITIONS
    if isinstance(index, top_k.ScaNN):
        identifiers = getattr(index, "_identifiers", None)
        return _POSITIONS if identifiers is None else identifiers.dtype
    if isinstance(index, top_k.BruteForce):
        identifiers = getattr(index, "_identifiers", None)
        if identifiers is None:
            return _POSITIONS
        if identifiers.dtype == tf.int32:
            with tf.init_scope():
                values = np.asarray(identifiers.numpy()).reshape(-1)
            if np.array_equal(values, np.arange(values.size)):
                return _POSITIONS
        return identifiers.dtype
    return None


def metric_ids(metric, positive_ids: Optional[tf.Tensor],
               by_id: Optional[bool] = None) -> Optional[tf.Tensor]:
    """The ``true_candidate_ids`` a factorized metric gets: what stock TFRS gives it.

    The ids go to a `tfrs.metrics.FactorizedTopK` only when its index has identifiers
    (TFRS then matches by id); an index of embeddings alone gets none (TFRS then matches
    by score), since comparing ids with positions breaks (strings) or is silently wrong
    (integers). Integer ids are cast to the index's integer dtype. A metric whose index
    is not one of TFRS's (`index_identifiers_dtype` None), or that is not a
    `FactorizedTopK`, gets the ids, as in TFRS. ``by_id`` False gives no metric ids
    (score matching, as stock TFRS called without ids); True gives them to any index
    but one known to return positions.
    """
    if by_id is False or positive_ids is None:
        return None
    index = getattr(metric, "_candidates", None)
    if index is None:
        return positive_ids
    dtype = index_identifiers_dtype(index)
    if dtype is None:
        return positive_ids
    if dtype == _POSITIONS:
        if by_id and not isinstance(index, _tfrs_top_k().BruteForce):
            raise ValueError(
                f"metrics_by_id=True but the index of metric {metric.name!r} has no "
                "identifiers (it returns positions): index (id, embedding) pairs, e.g. "
                "FactorizedTopK(candidates=items.batch(128).map(lambda i: (i, item_model(i)))).")
        if not by_id:
            return None
        dtype = tf.int32
    if positive_ids.dtype == dtype:
        return positive_ids
    if positive_ids.dtype.is_integer and dtype.is_integer:
        return tf.cast(positive_ids, dtype)
    raise ValueError(
        f"the index of metric {metric.name!r} holds {dtype.name} identifiers but "
        f"`candidate_ids` are {positive_ids.dtype.name}: index the same ids as the task gets, "
        "e.g. FactorizedTopK(candidates=items.batch(128).map(lambda i: (i, item_model(i))))."
    )


def _tfrs_top_k():
    from tensorflow_recommenders.layers import factorized_top_k

    return factorized_top_k
