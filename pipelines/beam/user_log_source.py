"""ExampleGen's user-log source: a user's own log (CSV, TSV, Parquet, JSON Lines) on Beam.

`UserLogExampleGen` writes the same artifact as `ExampleGen` (records, vocabulary,
manifest; read back with `read_split`) from a `UserLogSource`, the source and
column options of `tfrs_logq.pipelines.user_log`, so that Dataflow, Flink or Spark
read a log larger than one machine. Beam steps::

    pieces (a file each; a Parquet file a row group each)
      --reshuffle, read--> each piece's rows with its own id vocabularies
                           (`user_log.read_piece`: streamed, malformed rows named or
                           skipped and counted)
      --collect, assemble--> one worker: the pieces merged in reading order
                           (`merge_raw_logs`), then the library's own
                           `interactions_from_raw` and `split_interactions`, so the
                           split equals `load_user_log_split`'s
      --by shard--> the record files, written in parallel (`WriteShard`)
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import apache_beam as beam

from tfrs_logq._util.fingerprint import file_fingerprint
from tfrs_logq.pipelines.beam.example_gen import (
    _SUMMARY,
    NAME,
    VERSION,
    WriteShard,
    _user_records,
    _write_vocabulary,
    finish_build,
)
from tfrs_logq.pipelines.interactions import DataFormatError
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.pipelines.user_log import DEFAULT_TEMPORAL_FRACTION as USER_LOG_TEMPORAL_FRACTION
from tfrs_logq.pipelines.user_log import (
    UserLogSource,
    interactions_from_raw,
    merge_raw_logs,
    read_piece,
    split_interactions,
)

__all__ = ["UserLogExampleGen", "read_log_piece", "assemble_user_log"]


def read_log_piece(element: tuple, source) -> dict:
    """``(order, piece)`` -> the piece's rows (`user_log.read_piece`), or the one-line
    error that stops the run (the first in reading order decides)."""
    order, piece = element
    try:
        return {"order": order, "raw": read_piece(source, piece), "fatal": None}
    except (DataFormatError, OSError) as exc:
        return {"order": order, "raw": None, "fatal": str(exc)}


def assemble_user_log(parts: list, params: dict, staging: str, source):
    """The global steps of the user-log source, in one worker: the pieces merged in
    reading order (`user_log.merge_raw_logs`), then the library's own
    `interactions_from_raw` and `split_interactions`, the vocabulary, and
    ``(shard, user record)`` per user."""
    parts = sorted(parts, key=lambda p: p["order"])
    path = params["input"]
    summary: dict = {}

    def finish(error=None, **counts):
        summary.update(counts)
        if error is not None:
            summary["error"] = error
        with open(os.path.join(staging, _SUMMARY), "w") as f:
            json.dump(summary, f)

    fatal = next((p["fatal"] for p in parts if p["fatal"]), None)
    if fatal:
        return finish(fatal)
    raw = merge_raw_logs([p["raw"] for p in parts])
    summary.update(lines=raw.report.lines, rows=raw.report.rows,
                   skipped_lines=raw.report.skipped,
                   skipped_examples=raw.report.first_errors[:5])
    options = params["split_options"]
    try:
        interactions = interactions_from_raw(
            raw, source, name=params["log_name"],
            min_item_interactions=params["min_item_interactions"],
            min_user_interactions=params["min_user_interactions"],
            deduplicate=params["deduplicate"])
        split = split_interactions(interactions, params["split"],
                                   temporal_fraction=options.get("fraction"),
                                   num_validation_users=options.get("num_validation_users", 512),
                                   validation_seed=options.get("seed", 42))
    except ValueError as exc:
        return finish(str(exc))
    if _write_vocabulary(split, path, staging, finish) is not None:
        yield from _user_records(split, params["num_shards"])


@dataclasses.dataclass
class UserLogExampleGen:
    """The ExampleGen artifact of a user's log (`tfrs_logq.pipelines.user_log`): the
    same `UserLogSource` (a file, glob or directory of CSV, TSV, Parquet or JSON
    Lines; the column names) and preprocessing options as `load_user_log_split`,
    and the same split (tested), read by the workers a piece each (a file, or a
    Parquet row group) so that a log of many files is read in parallel.

    Args:
      source: `UserLogSource`. The files must be readable at the same path by every
        worker.
      split: str. One of ``loo``, ``gsasrec``, ``temporal``. Defaults to ``"temporal"``.
      dataset: str. The log's name, the manifest's ``log_name`` (its ``dataset`` is
        ``""``, as ExampleGen's for a file of no built-in dataset, so that the Trainer,
        whose `TrainConfig` takes a built-in dataset's name or ``""``, reads the
        artifact). Defaults to the source's base name.
      min_item_interactions: int. Defaults to 5. min_user_interactions: int. Defaults
        to 0. deduplicate: bool. Defaults to False (as `load_user_log`).
      temporal_fraction: float. Defaults to 0.1.
      num_validation_users: int, validation_seed: int. Default to 512 and 42.
      num_shards: int. Record files. Defaults to 4.

    The records hold ids, times and the split; a weight column is read and checked
    but not written into them.
    """

    source: UserLogSource
    split: str = "temporal"
    dataset: str = ""
    min_item_interactions: int = 5
    min_user_interactions: int = 0
    deduplicate: bool = False
    temporal_fraction: Optional[float] = None
    num_validation_users: int = 512
    validation_seed: int = 42
    num_shards: int = 4

    name = NAME
    version = VERSION

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}, received {self.split!r}.")
        if self.split == "temporal" and self.source.time_column is None:
            raise ValueError("the temporal split needs times: name the time column "
                             "(--time-column), or use --split loo or --split gsasrec.")
        if int(self.num_shards) < 1:
            raise ValueError(f"`num_shards` must be positive, received {self.num_shards}.")
        self.source.files()  # FileNotFoundError now, not in a worker

    def split_options(self) -> dict:
        if self.split == "gsasrec":
            return {"num_validation_users": self.num_validation_users,
                    "seed": self.validation_seed}
        if self.split == "temporal":
            return {"fraction": self.temporal_fraction or USER_LOG_TEMPORAL_FRACTION}
        return {}

    def inputs(self, root: str) -> dict:
        files = [os.path.abspath(f) for f in self.source.files()]
        return {"data": {"path": os.path.abspath(os.path.expanduser(str(self.source.path))),
                         "files": [{"path": f, "sha256": file_fingerprint(f)} for f in files]}}

    def parameters(self) -> dict:
        return {"dataset": "", "log_name": self.dataset or self.source.name(),
                "data_format": "user-log",
                "source": self.source.as_dict(), "split": self.split,
                "split_options": self.split_options(),
                "min_item_interactions": self.min_item_interactions,
                "min_user_interactions": self.min_user_interactions,
                "deduplicate": self.deduplicate,
                "skip_bad_lines": self.source.skip_bad_lines, "num_shards": self.num_shards}

    def build(self, root: str, staging: str, run) -> dict:
        """Runs the Beam job into ``staging``; returns the manifest's counts.

        Raises:
          DataFormatError: what `load_user_log_split` raises on the same log.
        """
        params = {**self.parameters(), "input": str(self.source.path)}
        source, num_shards = self.source, self.num_shards
        parts = list(enumerate(source.pieces()))

        def pipeline(p):
            (p
             | "Pieces" >> beam.Create(parts)
             | "SpreadPieces" >> beam.Reshuffle()
             | "ReadPieces" >> beam.Map(read_log_piece, source)
             | "Collect" >> beam.combiners.ToList()
             | "Assemble" >> beam.FlatMap(assemble_user_log, params, staging, source)
             | "ByShard" >> beam.GroupByKey()
             | "WriteShards" >> beam.ParDo(WriteShard(staging, num_shards)))

        run(pipeline)
        return finish_build(staging, num_shards)
