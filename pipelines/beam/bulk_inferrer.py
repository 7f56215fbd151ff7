"""BulkInferrer: top-k items for every test target, through Beam's ``RunInference`` on the export.

::

    BulkInferrer/
      manifest.json
      predictions/part-SSSSS-of-NNNNN.tfrecord    one tf.train.Example per test target

The records are described in `tfrs_logq.pipelines.beam.predictions`: per target
the user, the target, and ``item_ids`` / ``scores`` best first, **the user's whole
history left out** (all of it, not only the last ``max_length`` items the model reads).

Beam steps::

    ExampleGen records --TestQueries--> one query per test target: the history's last
          max_length items in the dataset's ids, and the older seen items
      --RunInference(TopKModelHandler)--> BatchElements (RunInference's own batching,
          sized by the handler), then the export's ``top_k`` signature with
          ``exclude_history`` true; older seen items and ``-inf`` scores dropped
      --WriteToTFRecord--> predictions/

`TopKModelHandler` is a `ModelHandler` of our own: Beam's ``TFModelHandlerTensor``
loads with ``tf.keras.models.load_model``, which does not take this export (a
``tf.Module`` with three signatures). It loads with ``tf.saved_model.load`` after
``import scann`` when the export's index is ScaNN (its ops must be registered).
A target the user has already seen is never in their list (it counts as a miss
in the Evaluator), whereas ``train``'s in-process ranking keeps the target; the
two agree whenever no test target repeats an item of its history (ML-1M).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference

from tfrs_logq.pipelines.beam.artifacts import artifact_input, verified_manifest
from tfrs_logq.pipelines.beam.exporter import saved_model_dir
from tfrs_logq.pipelines.beam.predictions import PREDICTIONS_DIR, encode_features
from tfrs_logq.pipelines.examples import decode_user, example_class, read_vocabulary

NAME = "BulkInferrer"
VERSION = 1
DEFAULT_TOP_K = 1000


# ------------------------------------------------------------------------ the queries


class TestQueries(beam.DoFn):
    """ExampleGen records -> one query per test target: ``history`` (the last
    ``max_length`` items, the dataset's ids), ``older`` (distinct items seen before
    those, not among them), and the target's fields of the prediction record."""

    def __init__(self, vocabulary_dir: str, id_types: dict, max_length: int,
                 history_dtype: str = "int64"):
        self.vocabulary_dir, self.id_types = vocabulary_dir, id_types
        self.max_length, self.history_dtype = int(max_length), history_dtype

    def setup(self):
        self._example = example_class()
        self._items = read_vocabulary(os.path.join(self.vocabulary_dir, "items.txt"),
                                      self.id_types["items"])
        if self.history_dtype == "int64":  # the export's ids (all-digit string ids: ints)
            self._items = self._items.astype(np.int64)
        self._users = read_vocabulary(os.path.join(self.vocabulary_dir, "users.txt"),
                                      self.id_types["users"])

    def process(self, data: bytes):
        record = decode_user(self._example, data)
        user = int(record["user"][0])
        items = record["item_ids"]
        for length, target in zip(record["test_history_lengths"], record["test_targets"]):
            history = items[:int(length)]
            window = history[-self.max_length:] if self.max_length else history[:0]
            older = np.setdiff1d(history[:len(history) - len(window)], window)
            yield {"user": user, "user_id": self._users[user:user + 1],
                   "history_length": int(length), "target": int(target),
                   "target_id": self._items[int(target) - 1:int(target)],
                   "target_in_history": int(np.isin(target, history)),
                   "history": self._items[window - 1], "older": self._items[older - 1]}


# ------------------------------------------------------------------ the model handler


@dataclasses.dataclass
class LoadedExport:
    """A loaded export: its ``top_k`` signature and ``assets/export.json``."""

    top_k: Any
    meta: dict
    keep: Any = None  # the loaded SavedModel object, which the signature needs alive


class TopKModelHandler(ModelHandler):
    """``RunInference`` on an export of `tfrs_logq.serving.export`: ``top_k`` with
    ``exclude_history`` true for a batch of queries (dicts from `TestQueries`).

    Histories are padded to the batch's longest (with 0, or "" for string ids); ``k +
    the most older seen items in the batch`` results are asked for, so that ``k`` are
    left after the older seen items are dropped. Outputs `PredictionResult`s whose
    ``inference`` is ``{"item_ids", "scores"}``.

    Args:
      saved_model: str. The export (``EXPORTER/serving/1``).
      k: int. Items per query (at most the unseen items). Defaults to 1000.
      min_batch_size, max_batch_size: int. `BatchElements`' bounds. Default to 1 and 256.
    """

    def __init__(self, saved_model: str, k: int = DEFAULT_TOP_K, min_batch_size: int = 1,
                 max_batch_size: int = 256):
        super().__init__(min_batch_size=min_batch_size, max_batch_size=max_batch_size)
        self.saved_model, self.k = saved_model, int(k)

    def load_model(self) -> LoadedExport:
        with open(os.path.join(self.saved_model, "assets", "export.json")) as f:
            meta = json.load(f)
        if meta["index"] == "scann":
            import scann  # noqa: F401  (registers the ScaNN ops the SavedModel uses)
        import tensorflow as tf

        loaded = tf.saved_model.load(self.saved_model)
        return LoadedExport(loaded.signatures["top_k"], meta, loaded)

    def run_inference(self, batch: Sequence[dict], model: LoadedExport,
                      inference_args: Optional[dict] = None) -> Iterable[PredictionResult]:
        import tensorflow as tf

        strings = model.meta["history_dtype"] == "string"
        pad = "" if strings else 0
        width = max(1, max(len(q["history"]) for q in batch))
        history = np.array([[pad] * (width - len(q["history"])) + list(q["history"])
                            for q in batch], dtype=object if strings else np.int64)
        most_older = max(len(q["older"]) for q in batch)
        asked = min(self.k + most_older, int(model.meta["num_items"]))
        out = model.top_k(history=tf.constant(history.tolist() if strings else history,
                                              tf.string if strings else tf.int64),
                          k=tf.constant(asked, tf.int32), exclude_history=tf.constant(True))
        ids, scores = out["item_ids"].numpy(), out["scores"].numpy()
        if strings:
            ids = np.asarray([[v.decode("utf-8") for v in row] for row in ids], str)
        for row, query in enumerate(batch):
            keep = np.isfinite(scores[row]) & ~np.isin(ids[row], query["older"])
            kept = np.flatnonzero(keep)[:self.k]
            yield PredictionResult(query, {"item_ids": ids[row][kept],
                                           "scores": scores[row][kept]})

    def get_num_bytes(self, batch: Sequence[dict]) -> int:
        return sum(q["history"].nbytes + q["older"].nbytes for q in batch)

    def get_metrics_namespace(self) -> str:
        return "tfrs_logq.BulkInferrer"


class EncodePrediction(beam.DoFn):
    """A `PredictionResult` -> the serialized prediction record."""

    def setup(self):
        self._example = example_class()

    def process(self, result: PredictionResult):
        query = result.example
        features = {name: query[name] for name in ("user", "user_id", "history_length",
                                                    "target", "target_id", "target_in_history")}
        yield encode_features(self._example, {**features, **result.inference})


# ---------------------------------------------------------------------- the component


@dataclasses.dataclass
class BulkInferrer:
    """Top-k lists for every test target of the ExampleGen artifact, by the Exporter's model.

    Args:
      examples_dir: str. The ExampleGen artifact.
      exporter_dir: str. The Exporter artifact.
      k: int. Items per target. Defaults to 1000 (the Evaluator's largest cut-off).
      max_batch_size: int. Most queries per call of the model. Defaults to 256.
      num_shards: int. Prediction files. Defaults to 2.
    """

    examples_dir: str
    exporter_dir: str
    k: int = DEFAULT_TOP_K
    max_batch_size: int = 256
    num_shards: int = 2

    name = NAME
    version = VERSION

    def __post_init__(self) -> None:
        for name in ("k", "max_batch_size", "num_shards"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"`{name}` must be positive, received {getattr(self, name)}.")

    def inputs(self, root: str) -> dict:
        return {"examples": artifact_input(self.examples_dir, "ExampleGen"),
                "model": artifact_input(self.exporter_dir, "Exporter")}

    def parameters(self) -> dict:
        return {"k": int(self.k), "max_batch_size": int(self.max_batch_size),
                "num_shards": int(self.num_shards)}

    def build(self, root: str, staging: str, run) -> dict:
        examples = verified_manifest(self.examples_dir, "ExampleGen")
        exporter = verified_manifest(self.exporter_dir, "Exporter")
        examples_dir = os.path.abspath(self.examples_dir)
        files = [os.path.join(examples_dir, rel) for rel in examples["outputs"]
                 if rel.startswith("examples/")]
        saved_model = os.path.abspath(saved_model_dir(self.exporter_dir))
        handler = TopKModelHandler(saved_model, self.k, max_batch_size=self.max_batch_size)
        with open(os.path.join(saved_model, "assets", "export.json")) as f:
            meta = json.load(f)
        queries = TestQueries(os.path.join(examples_dir, "vocabulary"),
                              examples["counts"]["raw_id_types"], meta["max_length"],
                              meta["history_dtype"])
        prefix = os.path.join(staging, PREDICTIONS_DIR, "part")

        def pipeline(p):
            (p
             | "Files" >> beam.Create(files)
             | "Read" >> beam.io.ReadAllFromTFRecord()
             | "TestQueries" >> beam.ParDo(queries)
             | "SpreadQueries" >> beam.Reshuffle()
             | "RunInference" >> RunInference(handler)
             | "Encode" >> beam.ParDo(EncodePrediction())
             | "Write" >> beam.io.WriteToTFRecord(prefix, file_name_suffix=".tfrecord",
                                                  num_shards=int(self.num_shards)))

        run(pipeline)
        expected = int(examples["counts"]["test"]["num_targets"])
        written = sum(1 for _ in _all_records(os.path.join(staging, PREDICTIONS_DIR)))
        if written != expected:
            from tfrs_logq.pipelines.beam.artifacts import ArtifactError

            raise ArtifactError(f"{NAME}: {written} predictions written for {expected} test "
                                "targets")
        return {"num_predictions": written, "k": int(self.k),
                "index": exporter["counts"]["index"],
                "num_items": exporter["counts"]["num_items"]}


def _all_records(directory: str):
    from tfrs_logq.pipelines.examples import read_records

    for name in sorted(os.listdir(directory)):
        yield from read_records(os.path.join(directory, name))
