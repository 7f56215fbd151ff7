"""ExampleGen: raw interactions -> one `tf.train.Example` per user, split, and the id vocabulary.

The result is exactly what the in-memory loaders give (``load_split``: the same
5-core filtering, ids and leave-one-out / gSASRec / temporal split, tested on
every format), written as an artifact::

    ExampleGen/
      manifest.json                     inputs (file + sha256), parameters, counts, outputs
      examples/data-SSSSS-of-NNNNN.tfrecord    users u with u % N == S, in user order
      vocabulary/users.txt              the source's id of user u on line u + 1
      vocabulary/items.txt              the source's id of item d on line d

The records are described in `tfrs_logq.pipelines.examples`.

Beam steps::

    file --plan--> byte ranges ending at line ends (a plain file: one per
                   ``shard_bytes``, read in parallel) or the whole file (.gz/.zip
                   do not split)
         --read--> chunks of ``chunk_lines`` lines with the number of their first line
         --reshuffle, parse--> parsed columns per chunk; malformed lines counted
                   with their file and line number (the project's parsers)
         --collect, assemble--> the global steps in one worker: the project's own
                   `build_interactions` (5-core filter, ids, order) and `make_split`;
                   at ML-1M size (1M rows, 24 MB of columns) a distributed version
                   would only add shuffles
         --by shard--> the record files, written in parallel

A malformed line fails the run with the file and line number (the first one in
the file), or with ``skip_bad_lines`` is dropped and counted in the manifest
(``skipped_lines``, and the first five messages). A truncated or corrupt ``.gz``
or ``.zip`` always fails.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Callable, Optional

import apache_beam as beam
import numpy as np
from apache_beam.io.tfrecordio import _TFRecordUtil

from tfrs_logq._util.fingerprint import file_fingerprint
from tfrs_logq.pipelines.beam import SOURCE_FORMATS
from tfrs_logq.pipelines.beam.artifacts import ArtifactError
from tfrs_logq.pipelines.beam.synthetic_source import DATASET, ItemTable, SyntheticSpec, draw_chunk
from tfrs_logq.pipelines.datasets import (
    DEFAULT_TEMPORAL_FRACTION,
    _parse_interactions_csv,
    _parse_ratings_dat,
    _parse_sasrec,
    _parse_steam_review,
)
from tfrs_logq.pipelines.examples import encode_user, example_class
from tfrs_logq.pipelines.interactions import (
    _DAMAGED,
    DataFormatError,
    ParseReport,
    build_interactions,
    open_text,
    parse_lines,
)
from tfrs_logq.pipelines.splits import SPLITS, make_split

NAME = "ExampleGen"
VERSION = 1
EXAMPLES_DIR = "examples"
VOCABULARY_DIR = "vocabulary"
_SUMMARY = "_summary.json"  # the assemble step's report to the driver; not part of the artifact


@dataclasses.dataclass(frozen=True)
class SourceFormat:
    """How one kind of interaction file is read, as the in-memory loader reads it.

    Attributes:
      parse: line -> tuple of fields, or None to ignore the line (the loader's parser).
      fields: int. 3 (user, item, timestamp) or 2 (user, item).
      encoding: str. The text encoding.
      reindex: bool. `build_interactions`'s ``reindex`` (False keeps SASRec's ids).
      zip_member: str. The member read from a ``.zip`` (or None).
    """

    parse: Callable
    fields: int
    encoding: str = "latin-1"
    reindex: bool = True
    zip_member: Optional[str] = None


FORMATS = {
    "ratings": SourceFormat(_parse_ratings_dat, 3, zip_member="ml-1m/ratings.dat"),
    "sasrec": SourceFormat(_parse_sasrec, 2, reindex=False),
    "csv": SourceFormat(_parse_interactions_csv, 3, encoding="utf-8"),
    "steam": SourceFormat(_parse_steam_review, 3, encoding="utf-8"),
}


assert tuple(FORMATS) == SOURCE_FORMATS


def shard_name(shard: int, num_shards: int) -> str:
    return f"data-{shard:05d}-of-{num_shards:05d}.tfrecord"


# ------------------------------------------------------------------ the Beam steps


def _member(path: str, fmt: SourceFormat) -> Optional[str]:
    return fmt.zip_member if path.endswith(".zip") else None


def _is_compressed(path: str) -> bool:
    if path.endswith(".zip"):
        return True
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _count_lines(data: bytes) -> int:
    """Lines in ``data`` as text-mode reading counts them (``\\n``, ``\\r\\n``, ``\\r``)."""
    n = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    return n + (1 if data and data[-1:] not in (b"\n", b"\r") else 0)


def plan_shards(path: str, shard_bytes: int):
    """``(path, start, length, first_line)`` byte ranges of a plain file, each ending
    at a line end; a compressed file is one range ``(path, 0, -1, 1)``."""
    if _is_compressed(path):
        yield path, 0, -1, 1
    else:
        yield from _plain_ranges(path, shard_bytes)


def _plain_ranges(path: str, shard_bytes: int):
    line = 1
    with open(path, "rb") as f:
        while True:
            start = f.tell()
            data = f.read(shard_bytes)
            if not data:
                break
            if not data.endswith((b"\n", b"\r")):
                data += f.readline()
            elif data.endswith(b"\r"):  # keep a \r\n pair in one range
                following = f.read(1)
                if following == b"\n":
                    data += following
                elif following:
                    f.seek(-1, os.SEEK_CUR)
            yield path, start, len(data), line
            line += _count_lines(data)


def read_shard(shard: tuple, fmt_name: str, chunk_lines: int):
    """Chunks ``(source, first_line, lines, fatal)`` of a planned range; ``fatal`` is
    the message of a file that ends early or does not decode (the last chunk)."""
    path, start, length, first_line = shard
    fmt = FORMATS[fmt_name]
    member = _member(path, fmt)
    source = path if member is None else f"{path}:{member}"
    lines: list = []
    number = first_line - 1  # lines before ``lines``
    try:
        if length < 0:
            stream = open_text(path, member=member, encoding=fmt.encoding)
        else:
            with open(path, "rb") as f:
                f.seek(start)
                stream = io.StringIO(f.read(length).decode(fmt.encoding), newline=None)
        with stream:
            for line in stream:
                lines.append(line)
                if len(lines) == chunk_lines:
                    yield source, number + 1, lines, None
                    number += len(lines)
                    lines = []
        fatal = None
    except DataFormatError as exc:  # an unreadable archive
        fatal = str(exc)
    except _DAMAGED as exc:
        fatal = (f"{source}: the file is truncated or corrupt (after line "
                 f"{number + len(lines)}: {type(exc).__name__}: {exc}); download or copy it "
                 "again.")
    if lines or fatal:
        yield source, number + 1, lines, fatal


def parse_chunk(chunk: tuple, fmt_name: str) -> dict:
    """Parses one chunk with the loader's parser; bad lines are counted, never raised."""
    source, first_line, lines, fatal = chunk
    fmt = FORMATS[fmt_name]
    report = ParseReport()
    rows = list(parse_lines(lines, fmt.parse, source, skip_bad_lines=True, report=report,
                            first_line=first_line))
    columns = []
    for k in range(fmt.fields):
        values = [row[k] for row in rows]
        columns.append(values if values and isinstance(values[0], str)
                       else np.asarray(values, np.int64))
    return {"first_line": first_line, "lines": report.lines, "rows": report.rows,
            "skipped": report.skipped, "errors": report.first_errors, "fatal": fatal,
            "columns": columns}


def _concatenate(parts: list):
    if parts and isinstance(parts[0], list):
        return np.asarray([v for part in parts for v in part], dtype=str)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _write_lines(path: str, values) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for value in values:
            f.write(f"{value}\n")


def assemble(chunks: list, params: dict, staging: str):
    """The global steps, in one worker: `build_interactions` and `make_split` on the
    whole log, the vocabulary files, and ``(shard, user record)`` per user. Writes the
    counts (or the error that stops the run) to ``staging/_summary.json``."""
    built = _build_split(chunks, params, staging)
    if built is not None:
        yield from _user_records(built, params["num_shards"])


def _build_split(chunks: list, params: dict, staging: str):
    chunks = sorted(chunks, key=lambda c: c["first_line"])
    fmt = FORMATS[params["data_format"]]
    path = params["input"]
    summary = {"lines": sum(c["lines"] for c in chunks), "rows": sum(c["rows"] for c in chunks),
               "skipped_lines": sum(c["skipped"] for c in chunks),
               "skipped_examples": [e for c in chunks for e in c["errors"]][:5]}

    def finish(error=None, **counts):
        summary.update(counts)
        if error is not None:
            summary["error"] = error
        with open(os.path.join(staging, _SUMMARY), "w") as f:
            json.dump(summary, f)

    for chunk in chunks:  # the first problem in the file decides
        if chunk["errors"] and not params["skip_bad_lines"]:
            return finish(f"{chunk['errors'][0]} (--skip-bad-lines, or skip_bad_lines=True, "
                          "skips and counts malformed lines)")
        if chunk["fatal"]:
            return finish(chunk["fatal"])
    if summary["rows"] == 0:
        return finish(f"{path}: no interactions ({summary['lines']} lines read, "
                      f"{summary['skipped_lines']} skipped as malformed).")
    columns = [_concatenate([c["columns"][k] for c in chunks]) for k in range(fmt.fields)]
    timestamps = columns[2] if fmt.fields == 3 else None
    try:
        interactions = build_interactions(
            columns[0], columns[1], timestamps, reindex=fmt.reindex,
            min_item_interactions=params["min_item_interactions"], name=params["dataset"])
    except ValueError as exc:
        return finish(f"{path}: {exc}")
    if len(interactions) == 0:
        return finish(f"{path}: no interactions left after preprocessing ({summary['rows']} "
                      "rows read; every item has fewer interactions than the minimum).")
    options = params["split_options"]
    if params["split"] == "gsasrec" and options["num_validation_users"] > interactions.num_users:
        return finish(f"{path}: the gsasrec split draws {options['num_validation_users']} "
                      f"validation users, and the data has {interactions.num_users}; lower "
                      "num_validation_users.")
    try:
        split = make_split(interactions, params["split"], **options)
    except ValueError as exc:
        return finish(f"{path}: {exc}")
    return _write_vocabulary(split, path, staging, finish)


def _write_vocabulary(split, path: str, staging: str, finish):
    """The vocabulary files and the counts of a built split (its ``finish``); the
    split, or None when an id cannot be written."""
    interactions = split.interactions
    for kind, ids in (("users", interactions.raw_users), ("items", interactions.raw_items)):
        if ids.dtype.kind == "U" and any(("\n" in v or "\r" in v) for v in ids.tolist()):
            return finish(f"{path}: a {kind[:-1]} id holds a line break; ids must be one line.")
        _write_lines(os.path.join(staging, VOCABULARY_DIR, f"{kind}.txt"), ids.tolist())
    finish(raw_id_types={kind: "str" if ids.dtype.kind == "U" else "int" for kind, ids in
                         (("users", interactions.raw_users), ("items", interactions.raw_items))},
           has_timestamps=interactions.timestamp is not None, **split.stats())
    return split


def _user_records(split, num_shards: int):
    interactions = split.interactions
    offsets = interactions.user_offsets()
    parts = {}
    for name, part in (("validation", split.validation), ("test", split.test)):
        order = np.argsort(part.users, kind="stable")
        users = part.users[order]
        bounds = np.searchsorted(users, np.arange(interactions.num_users + 1))
        parts[name] = (bounds, part.history_lengths[order], part.targets[order])
    for u in range(interactions.num_users):
        record = {"user": u, "item_ids": interactions.item[offsets[u]:offsets[u + 1]],
                  "train_length": int(split.train_lengths[u])}
        if interactions.timestamp is not None:
            record["timestamps"] = interactions.timestamp[offsets[u]:offsets[u + 1]]
        for name, (bounds, lengths, targets) in parts.items():
            record[f"{name}_history_lengths"] = lengths[bounds[u]:bounds[u + 1]]
            record[f"{name}_targets"] = targets[bounds[u]:bounds[u + 1]]
        yield u % num_shards, record


class WriteShard(beam.DoFn):
    """Writes ``(shard, records)`` to one TFRecord file, records in user order."""

    def __init__(self, staging: str, num_shards: int):
        self.staging, self.num_shards = staging, num_shards

    def setup(self):
        self._example = example_class()

    def process(self, element):
        shard, records = element
        directory = os.path.join(self.staging, EXAMPLES_DIR)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, shard_name(shard, self.num_shards)), "wb") as f:
            for record in sorted(records, key=lambda r: r["user"]):
                _TFRecordUtil.write_record(f, encode_user(self._example, record))
        yield shard, len(records)


# ---------------------------------------------------------------------- the component


@dataclasses.dataclass
class ExampleGen:
    """Builds the ExampleGen artifact from one interaction file.

    Args:
      input_path: str. The data file (plain, ``.gz``, or ML-1M's ``ml-1m.zip``).
      data_format: str. One of `FORMATS`: ``"ratings"`` (``user::item::rating::ts``),
        ``"sasrec"`` (``user item``, SASRec's ids kept), ``"csv"``
        (``user,item,timestamp``, header optional), ``"steam"`` (Steam reviews).
      split: str. One of ``loo``, ``gsasrec``, ``temporal``. Defaults to ``"gsasrec"``.
      dataset: str. The dataset's name (``ml-1m``, ``steam``, ...); it picks the default
        temporal fraction. Defaults to ``""``.
      min_item_interactions: int. Items with fewer interactions are removed. Defaults to 5.
      temporal_fraction: float. The temporal split's test (and validation) fraction.
        Defaults to the dataset's (`DEFAULT_TEMPORAL_FRACTION`), else 0.1.
      num_validation_users: int, validation_seed: int. gSASRec's validation draw.
        Default to 512 and 42.
      skip_bad_lines: bool. Drop and count malformed lines instead of failing.
        Defaults to False.
      num_shards: int. Record files. Defaults to 4.
      shard_bytes: int. Bytes of a plain file read by one worker. Defaults to 4 MiB.
      chunk_lines: int. Lines parsed as one element. Defaults to 50,000.
    """

    input_path: str
    data_format: str
    split: str = "gsasrec"
    dataset: str = ""
    min_item_interactions: int = 5
    temporal_fraction: Optional[float] = None
    num_validation_users: int = 512
    validation_seed: int = 42
    skip_bad_lines: bool = False
    num_shards: int = 4
    shard_bytes: int = 4 << 20
    chunk_lines: int = 50_000

    name = NAME
    version = VERSION

    def __post_init__(self) -> None:
        if self.data_format not in FORMATS:
            raise ValueError(f"`data_format` must be one of {tuple(FORMATS)}, received "
                             f"{self.data_format!r}.")
        if self.split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}, received {self.split!r}.")
        if self.split == "temporal" and FORMATS[self.data_format].fields < 3:
            raise ValueError(f"the temporal split needs timestamps, and {self.data_format} "
                             "files have none; use --split loo or --split gsasrec.")
        for name in ("num_shards", "shard_bytes", "chunk_lines"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"`{name}` must be positive, received {getattr(self, name)}.")
        if not os.path.isfile(self.input_path):
            raise FileNotFoundError(f"no such file: {self.input_path}")

    def split_options(self) -> dict:
        if self.split == "gsasrec":
            return {"num_validation_users": self.num_validation_users,
                    "seed": self.validation_seed}
        if self.split == "temporal":
            fraction = self.temporal_fraction or DEFAULT_TEMPORAL_FRACTION.get(self.dataset, 0.1)
            return {"fraction": fraction}
        return {}

    def inputs(self, root: str) -> dict:
        path = os.path.abspath(self.input_path)
        return {"data": {"path": path, "sha256": file_fingerprint(path)}}

    def parameters(self) -> dict:
        return {"dataset": self.dataset, "data_format": self.data_format, "split": self.split,
                "split_options": self.split_options(),
                "min_item_interactions": self.min_item_interactions,
                "skip_bad_lines": self.skip_bad_lines, "num_shards": self.num_shards}

    def build(self, root: str, staging: str, run) -> dict:
        """Runs the Beam job into ``staging``; returns the manifest's counts.

        Raises:
          DataFormatError: a malformed line (unless ``skip_bad_lines``), a damaged
            file, or no interactions.
        """
        params = {**self.parameters(), "input": os.path.abspath(self.input_path)}
        fmt_name, chunk_lines, shard_bytes = self.data_format, self.chunk_lines, self.shard_bytes

        def pipeline(p):
            (p
             | "File" >> beam.Create([params["input"]])
             | "PlanShards" >> beam.FlatMap(plan_shards, shard_bytes)
             | "SpreadShards" >> beam.Reshuffle()
             | "ReadShards" >> beam.FlatMap(read_shard, fmt_name, chunk_lines)
             | "SpreadChunks" >> beam.Reshuffle()
             | "Parse" >> beam.Map(parse_chunk, fmt_name)
             | "Collect" >> beam.combiners.ToList()
             | "Assemble" >> beam.FlatMap(assemble, params, staging)
             | "ByShard" >> beam.GroupByKey()
             | "WriteShards" >> beam.ParDo(WriteShard(staging, self.num_shards)))

        run(pipeline)
        return finish_build(staging, self.num_shards)


def finish_build(staging: str, num_shards: int) -> dict:
    """After a file source's Beam job: the assemble step's summary (its error raised as
    `DataFormatError`), an empty record file for each shard no user went to, and the
    manifest's counts."""
    summary_path = os.path.join(staging, _SUMMARY)
    if not os.path.exists(summary_path):
        raise ArtifactError(f"{NAME}: the Beam job finished without its summary "
                            f"({summary_path})")
    with open(summary_path) as f:
        summary = json.load(f)
    os.remove(summary_path)
    if "error" in summary:
        raise DataFormatError(summary.pop("error"))
    examples = os.path.join(staging, EXAMPLES_DIR)
    os.makedirs(examples, exist_ok=True)
    for shard in range(num_shards):  # a shard with no user is an empty file
        path = os.path.join(examples, shard_name(shard, num_shards))
        if not os.path.exists(path):
            open(path, "wb").close()
    return {"num_rows": summary.pop("rows"), **summary}


# ------------------------------------------------------------ the synthetic source


class SyntheticUsers(beam.DoFn):
    """Chunk index -> ``(shard, user record)`` for each of the chunk's users
    (`synthetic_source.draw_chunk`; leave-one-out: the last two items are the
    validation and the test target)."""

    def __init__(self, spec, num_shards: int):
        self.spec, self.num_shards = spec, num_shards

    def setup(self):
        self._table = ItemTable(self.spec)

    def process(self, chunk: int):
        if not hasattr(self, "_table"):
            self.setup()
        h = self.spec.history_length
        users, _, items = draw_chunk(self.spec, chunk, self._table)
        for u, row in zip(users.tolist(), items):
            yield u % self.num_shards, {
                "user": u, "item_ids": row, "train_length": h,
                "validation_history_lengths": np.array([h], np.int64),
                "validation_targets": row[h:h + 1],
                "test_history_lengths": np.array([h + 1], np.int64),
                "test_targets": row[h + 1:h + 2]}


@dataclasses.dataclass
class SyntheticExampleGen:
    """The ExampleGen artifact of ``--dataset synthetic`` (`synthetic_source`): the
    same records, vocabulary and manifest counts as a file's, drawn by the workers
    from ``Create(range(num_chunks))``. The same spec gives the same bytes on any
    number of workers (tested).

    Args:
      spec: `SyntheticSpec`.
      num_shards: int. Record files. Defaults to 4.
    """

    spec: SyntheticSpec
    num_shards: int = 4

    name = NAME
    version = VERSION

    def __post_init__(self) -> None:
        if int(self.num_shards) < 1:
            raise ValueError(f"`num_shards` must be positive, received {self.num_shards}.")

    def inputs(self, root: str) -> dict:
        # ``path`` as a file's (read_split names it as the source).
        return {"data": {"path": DATASET, "synthetic": self.spec.as_dict()}}

    def parameters(self) -> dict:
        return {"dataset": DATASET, "data_format": DATASET, "split": "loo", "split_options": {},
                "min_item_interactions": 0, "skip_bad_lines": False,
                "num_shards": self.num_shards}

    def counts(self) -> dict:
        s = self.spec
        users = {"num_users": s.num_users}
        return {"num_rows": s.num_users * s.sequence_length, "lines": 0, "skipped_lines": 0,
                "skipped_examples": [], "raw_id_types": {"users": "int", "items": "int"},
                "has_timestamps": False, "num_users": s.num_users, "num_items": s.num_items,
                "num_interactions": s.num_users * s.sequence_length, "time_range": None,
                "train": {"num_interactions": s.train_interactions, **users},
                "validation": {"num_targets": s.num_users, **users},
                "test": {"num_targets": s.num_users, **users}}

    def build(self, root: str, staging: str, run) -> dict:
        spec, num_shards = self.spec, self.num_shards

        def pipeline(p):
            (p
             | "Chunks" >> beam.Create(list(range(spec.num_chunks)))
             | "SpreadChunks" >> beam.Reshuffle()
             | "Draw" >> beam.ParDo(SyntheticUsers(spec, num_shards))
             | "ByShard" >> beam.GroupByKey()
             | "WriteShards" >> beam.ParDo(WriteShard(staging, num_shards)))

        run(pipeline)
        _write_lines(os.path.join(staging, VOCABULARY_DIR, "users.txt"), range(spec.num_users))
        _write_lines(os.path.join(staging, VOCABULARY_DIR, "items.txt"),
                     range(1, spec.num_items + 1))
        examples = os.path.join(staging, EXAMPLES_DIR)
        os.makedirs(examples, exist_ok=True)
        for shard in range(num_shards):
            path = os.path.join(examples, shard_name(shard, num_shards))
            if not os.path.exists(path):
                open(path, "wb").close()
        return self.counts()
