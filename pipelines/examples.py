"""The ExampleGen artifact's records: one `tf.train.Example` per user, encoded without TensorFlow.

Each user's record holds their whole time-ordered sequence once, and the split as
lengths into it (the layout of `tfrs_logq.pipelines.splits.Split`). Every feature
is an int64 list:

- ``user`` `[1]`: the user index ``0..num_users-1`` (line ``user + 1`` of
  ``vocabulary/users.txt`` holds the source's id);
- ``item_ids`` `[n]`: items ``1..num_items`` in the user's order (0 is padding);
- ``timestamps`` `[n]`: seconds, present only when the source has times;
- ``train_length`` `[1]`: the user trains on ``item_ids[:train_length]``;
- ``validation_history_lengths``, ``validation_targets`` `[k]`: target ``j``,
  ``item_ids[h_j]``, is predicted from ``item_ids[:h_j]``; ``k`` is 0 or 1 for
  loo/gsasrec, any number for the temporal split;
- ``test_history_lengths``, ``test_targets`` `[k]`: the same for the test part.

The messages are built from the ``tf.train.Example`` schema (`example.proto`,
field numbers and types as TensorFlow's) in a private protobuf descriptor pool, so
Beam workers encode and decode records with the protobuf runtime alone and never
import TensorFlow (which costs seconds per worker process); the bytes are the
same, and ``tf.io.parse_single_example`` reads them (tested). They are serialized
deterministically (map keys sorted), so a rebuilt artifact has the same bytes.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

INT_FEATURES = ("user", "item_ids", "timestamps", "train_length",
                "validation_history_lengths", "validation_targets",
                "test_history_lengths", "test_targets")


def example_class():
    """The ``tensorflow.Example`` message class, from a private descriptor pool."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tfrs_logq/example.proto", package="tensorflow", syntax="proto3")

    def message(name, fields, parent=None):
        msg = (parent.nested_type if parent is not None else proto.message_type).add(name=name)
        for number, (field_name, kind, label, type_name, oneof) in enumerate(fields, start=1):
            field = msg.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name
            if oneof is not None:
                field.oneof_index = oneof
        return msg

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", [("value", F.TYPE_BYTES, rep, None, None)])
    message("FloatList", [("value", F.TYPE_FLOAT, rep, None, None)])
    message("Int64List", [("value", F.TYPE_INT64, rep, None, None)])
    feature = message("Feature", [
        ("bytes_list", F.TYPE_MESSAGE, opt, ".tensorflow.BytesList", 0),
        ("float_list", F.TYPE_MESSAGE, opt, ".tensorflow.FloatList", 0),
        ("int64_list", F.TYPE_MESSAGE, opt, ".tensorflow.Int64List", 0)])
    feature.oneof_decl.add(name="kind")
    features = message("Features", [
        ("feature", F.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry", None)])
    entry = message("FeatureEntry", [("key", F.TYPE_STRING, opt, None, None),
                                     ("value", F.TYPE_MESSAGE, opt, ".tensorflow.Feature", None)],
                    parent=features)
    entry.options.map_entry = True
    message("Example", [("features", F.TYPE_MESSAGE, opt, ".tensorflow.Features", None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def encode_user(example_cls, record: dict) -> bytes:
    """Serializes one user's record (a dict of the `INT_FEATURES`, integer arrays; a
    missing or None ``timestamps`` is left out)."""
    example = example_cls()
    features = example.features.feature
    for name in INT_FEATURES:
        values = record.get(name)
        if values is None:
            continue
        int64_list = features[name].int64_list
        int64_list.SetInParent()  # an empty list is still a present, int64 feature
        int64_list.value.extend(np.asarray(values, np.int64).reshape(-1).tolist())
    return example.SerializeToString(deterministic=True)  # map keys sorted: same bytes each run


def decode_user(example_cls, data: bytes) -> dict:
    """One record back as a dict of int64 arrays (``timestamps`` None when absent)."""
    example = example_cls.FromString(data)
    features = example.features.feature
    out: dict[str, Optional[np.ndarray]] = {}
    for name in INT_FEATURES:
        if name in features:
            out[name] = np.asarray(features[name].int64_list.value, np.int64)
        else:
            out[name] = None
    return out


# ------------------------------------------------------------------------- reading


def read_records(path: str):
    """The records of a TFRecord file (framing checked; the artifact's sha256, checked
    by `read_split`, covers the contents)."""
    import struct

    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise ValueError(f"{path}: a record header is cut short")
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:
                raise ValueError(f"{path}: a record is cut short")
            yield data


def read_users(artifact_dir: str, manifest: Optional[dict] = None):
    """Every user's record of an ExampleGen artifact, in user order (dicts as
    `decode_user` gives them). The artifact is verified first unless ``manifest``
    (already verified) is given."""
    from tfrs_logq.pipelines.manifest import verified_manifest

    manifest = manifest or verified_manifest(artifact_dir, "ExampleGen")
    example = example_class()
    records = []
    for rel in manifest["outputs"]:
        if rel.startswith("examples/"):
            records.extend(decode_user(example, data)
                           for data in read_records(os.path.join(artifact_dir, rel)))
    records.sort(key=lambda r: int(r["user"][0]))
    return records


def read_vocabulary(path: str, kind: str) -> np.ndarray:
    """``vocabulary/users.txt`` or ``items.txt`` as an array: ``kind`` ``"str"`` or
    ``"int"`` (the manifest's ``raw_id_types``)."""
    with open(path, encoding="utf-8") as f:
        values = [line.rstrip("\n") for line in f]
    return np.asarray(values, dtype=str) if kind == "str" else np.asarray(values, np.int64)


def read_split(artifact_dir: str):
    """The `tfrs_logq.pipelines.splits.Split` an ExampleGen artifact holds: the same
    users, sequences, timestamps, ids and targets as the in-memory ``load_split``.

    Raises:
      ArtifactError: no finished artifact, or its files do not match its manifest.
    """
    from tfrs_logq.pipelines.interactions import Interactions
    from tfrs_logq.pipelines.manifest import ArtifactError, verified_manifest
    from tfrs_logq.pipelines.splits import EvalPart, Split

    manifest = verified_manifest(artifact_dir, "ExampleGen")
    counts, params = manifest["counts"], manifest["parameters"]
    records = read_users(artifact_dir, manifest)
    if [int(r["user"][0]) for r in records] != list(range(counts["num_users"])):
        raise ArtifactError(f"{artifact_dir}: the records are not users "
                            f"0..{counts['num_users'] - 1}")
    lengths = np.array([len(r["item_ids"]) for r in records], np.int64)
    has_times = bool(counts["has_timestamps"])
    vocabulary = os.path.join(artifact_dir, "vocabulary")
    interactions = Interactions(
        user=np.repeat(np.arange(len(records)), lengths).astype(np.int32),
        item=np.concatenate([r["item_ids"] for r in records]).astype(np.int32),
        timestamp=np.concatenate([r["timestamps"] for r in records]) if has_times else None,
        raw_users=read_vocabulary(os.path.join(vocabulary, "users.txt"),
                                   counts["raw_id_types"]["users"]),
        raw_items=read_vocabulary(os.path.join(vocabulary, "items.txt"),
                                   counts["raw_id_types"]["items"]),
        name=params["dataset"], source=manifest["inputs"]["data"]["path"],
        data_format=params["data_format"], num_rows=counts["num_rows"],
        skipped_lines=counts["skipped_lines"])
    offsets = interactions.user_offsets()
    sequences = [interactions.item[offsets[u]:offsets[u + 1]] for u in range(len(records))]

    def part(name: str) -> EvalPart:
        users = [np.full(len(r[f"{name}_targets"]), int(r["user"][0]), np.int64) for r in records]
        return EvalPart(np.concatenate(users) if users else np.zeros(0, np.int64),
                        np.concatenate([r[f"{name}_history_lengths"] for r in records]),
                        np.concatenate([r[f"{name}_targets"] for r in records]))

    train = np.array([int(r["train_length"][0]) for r in records], np.int64)
    return Split(params["split"], interactions, sequences, train, part("validation"),
                 part("test"))
