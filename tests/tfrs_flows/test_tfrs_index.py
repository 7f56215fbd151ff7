"""`tfrs_logq._tfrs_index` reads private attributes of TFRS 0.7.7's top-k layers and metric:
pinned here, so that a TFRS release that renames one fails this file by name (the reader
would otherwise fall back to "not one of TFRS's indexes" and match metrics by id where
stock matches by score). What the reader returns for each index is checked in
test_drop_in.py."""

import tfrs_logq  # noqa: F401, I001 (first: selects tf-keras)

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
from tensorflow_recommenders.layers import factorized_top_k as top_k

from tfrs_logq._tfrs_index import index_identifiers_dtype


def _embeddings():
    return tf.constant(np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32))


def test_the_pinned_tfrs_is_the_one_read():
    from importlib.metadata import version

    assert version("tensorflow-recommenders") == "0.7.7"  # (its __version__ says "v0.7.7")


def test_the_private_attributes_read_exist_where_they_are_read():
    items, ids = _embeddings(), tf.constant([f"m{i}" for i in range(6)])
    streaming = top_k.Streaming(k=2).index_from_dataset(
        tf.data.Dataset.from_tensor_slices((ids, items)).batch(3))
    assert isinstance(streaming._candidates, tf.data.Dataset)
    assert streaming._candidates.element_spec[0].dtype == tf.string
    brute = top_k.BruteForce(k=2)
    brute.index(items, ids)
    assert brute._identifiers.dtype == tf.string
    unnamed = top_k.BruteForce(k=2)
    unnamed.index(items)
    assert unnamed._identifiers.dtype == tf.int32  # 0..n-1: read as positions
    metric = tfrs.metrics.FactorizedTopK(candidates=brute)
    assert metric._candidates is brute
    assert [index_identifiers_dtype(i) for i in (streaming, brute, unnamed)] == [
        tf.string, tf.string, "positions"]


def test_scann_holds_its_identifiers_in_the_attribute_read():
    """`ScaNN` sets ``_identifiers`` in its constructor (None: it returns positions) and
    `index` replaces it with the identifiers' tensor; the class is defined whether or not
    the scann package loads, its constructor needs it."""
    pytest.importorskip("scann")
    scann = top_k.ScaNN(k=2, num_leaves=2, num_leaves_to_search=1,
                        training_iterations=2, num_reordering_candidates=4)
    assert scann._identifiers is None
    assert index_identifiers_dtype(scann) == "positions"
    items = tf.constant(np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32))
    scann.index(items, tf.constant([f"m{i}" for i in range(64)]))
    assert scann._identifiers.dtype == tf.string
    assert index_identifiers_dtype(scann) == tf.string
