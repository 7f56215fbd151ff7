"""A finished training run, loaded back: its config, item vocabulary, best weights and split.

A run's model directory (``tfrs-logq train --model-dir``) holds ``config.json`` (the
`TrainConfig` and the catalog size), ``vocabulary.json`` (``raw_items``, the raw id of
internal item ``i + 1`` at ``i``) and ``best.weights``. `load_trained` rebuilds the
encoder that run trained, with TensorFlow ops only (no native kernels, one length
bucket), and loads its best weights; `load_run_split` loads the data it trained on.

The export (`tfrs_logq.serving.export`) and `tfrs_logq.studies.diagnose` both start here, so
this sits at the training layer: it imports `tfrs_logq.sasrec.training`, never the serving or
pipeline layers above it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.corrections import parse_loss_name
from tfrs_logq.pipelines.vocabulary import read_run_items
from tfrs_logq.sasrec.config import TrainConfig
from tfrs_logq.sasrec.models import SASRecEncoder, SequentialRetrievalModel
from tfrs_logq.sasrec.objectives import make_objective


def read_run_config(model_dir: str) -> dict:
    """The run's ``config.json``, as written (the `TrainConfig` fields and ``num_items``)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def read_train_config(model_dir: str) -> TrainConfig:
    """The run's `TrainConfig` (`TrainConfig.from_json` of its ``config.json``).

    Raises:
      FileNotFoundError: no ``config.json``.
      ConfigError: it is not a config this version reads (the message names the file).
    """
    return TrainConfig.from_json(os.path.join(model_dir, "config.json"))


def read_vocabulary(model_dir: str) -> np.ndarray:
    """The raw id of each item, in internal order (internal id ``i + 1`` at ``i``):
    int64 when every id is an integer, else strings."""
    return read_run_items(model_dir)


def load_trained(model_dir: str) -> tuple[SASRecEncoder, dict, np.ndarray]:
    """The encoder with its best weights, its config and the item vocabulary.

    Raises:
      FileNotFoundError: the run has no ``best.weights`` (not trained, or not finished).
    """
    config = read_run_config(model_dir)
    train_config = read_train_config(model_dir)
    num_items = int(config["num_items"])
    raw_ids = read_vocabulary(model_dir)
    from tfrs_logq.sasrec.training import build_encoder  # the encoder the run trained

    # One bucket: serving batches are small, where empty groups would only cost time.
    # TensorFlow ops only: the SavedModel must load without tfrs_logq's kernels.
    encoder = build_encoder(train_config, num_items, length_buckets=1, native_kernels=False)
    # The config checked the name when it was read: parsed here without a second check.
    objective = make_objective(parse_loss_name(train_config.loss, None), num_items,
                               np.ones(num_items + 1),
                               num_negatives=train_config.num_negatives)
    model = SequentialRetrievalModel(encoder, objective)
    encoder(tf.zeros([1, train_config.max_length], tf.int32))
    weights = os.path.join(model_dir, "best.weights")
    if not os.path.exists(weights + ".index"):
        raise FileNotFoundError(f"{model_dir} has no best.weights: train it with "
                                "`tfrs-logq train --model-dir` first.")
    model.load_weights(weights).expect_partial()
    return encoder, config, raw_ids


def load_run_split(model_dir: str, data_dir: Optional[str] = None,
                   split_name: Optional[str] = None):
    """The `Split` the run trained on (`tfrs_logq.sasrec.training.load_recorded_split` of
    its config): its ExampleGen artifact's when it trained on one (``train --examples``),
    else its dataset's or log's file; ``data_dir`` reads the dataset from another directory
    instead (and then the dataset, even for a run trained on an artifact); ``split_name``
    another split of the same data."""
    from tfrs_logq.sasrec.training import load_recorded_split

    config = read_train_config(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        record = json.load(f)
    if data_dir:
        config = dataclasses.replace(config, examples=None, data_dir=data_dir)
    if split_name:
        config = dataclasses.replace(config, split=split_name)
    return load_recorded_split(config, record)


__all__ = ["load_run_split", "load_trained", "read_run_config", "read_train_config",
           "read_vocabulary"]
