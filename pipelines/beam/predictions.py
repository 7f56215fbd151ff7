"""The BulkInferrer's records: one `tf.train.Example` per test target, read without Beam.

``BulkInferrer/predictions/part-SSSSS-of-NNNNN.tfrecord`` holds, per test target:

- ``user`` `[1]` int64: the user index; ``user_id`` `[1]`: the dataset's id (int64,
  or bytes for string ids);
- ``history_length`` `[1]`: the target is predicted from ``item_ids[:history_length]``
  of the user's ExampleGen record; ``target`` `[1]` (the item index) and
  ``target_id`` `[1]` (the dataset's id); ``target_in_history`` `[1]`: 1 when the
  user has already seen the target;
- ``item_ids`` `[n]` (the dataset's ids, as the export answers) and ``scores`` `[n]`
  float: the top ``n = min(k, unseen items)`` items, best first, the user's whole
  history left out.

The messages come from the private ``tf.train.Example`` pool of
`tfrs_logq.pipelines.examples` (``tf.io.parse_single_example`` reads them).
"""

from __future__ import annotations

import os

import numpy as np

from tfrs_logq.pipelines.beam.artifacts import verified_manifest
from tfrs_logq.pipelines.examples import example_class, read_records

PREDICTIONS_DIR = "predictions"


def encode_features(example_cls, features: dict) -> bytes:
    """A ``tf.train.Example`` of named arrays: integers as ``int64_list``, floats as
    ``float_list``, strings and bytes as ``bytes_list`` (UTF-8); deterministic bytes."""
    example = example_cls()
    for name, values in features.items():
        values = np.asarray(values).reshape(-1)
        feature = example.features.feature[name]
        if values.dtype.kind in "iub":
            feature.int64_list.SetInParent()
            feature.int64_list.value.extend(values.astype(np.int64).tolist())
        elif values.dtype.kind == "f":
            feature.float_list.SetInParent()
            feature.float_list.value.extend(values.astype(np.float32).tolist())
        else:
            feature.bytes_list.SetInParent()
            feature.bytes_list.value.extend(
                v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values.tolist())
    return example.SerializeToString(deterministic=True)


def decode_features(example_cls, data: bytes) -> dict:
    """`encode_features` reversed: int64, float32 or str arrays by name."""
    out = {}
    for name, feature in example_cls.FromString(data).features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "int64_list":
            out[name] = np.asarray(feature.int64_list.value, np.int64)
        elif kind == "float_list":
            out[name] = np.asarray(feature.float_list.value, np.float32)
        else:
            out[name] = np.asarray([v.decode("utf-8") for v in feature.bytes_list.value], str)
    return out


def read_predictions(artifact_dir: str) -> list[dict]:
    """Every prediction of a BulkInferrer artifact, ordered by user and history length.

    Raises:
      ArtifactError: no finished artifact, or its files do not match its manifest.
    """
    manifest = verified_manifest(artifact_dir, "BulkInferrer")
    example = example_class()
    out = [decode_features(example, data) for rel in manifest["outputs"]
           if rel.startswith(PREDICTIONS_DIR + "/")
           for data in read_records(os.path.join(artifact_dir, rel))]
    out.sort(key=lambda r: (int(r["user"][0]), int(r["history_length"][0])))
    return out
