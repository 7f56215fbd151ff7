"""Where the interactions come from (`DataSource`: a built-in dataset, or a user's log with
its columns and format) and how a log is filtered before the split (`LogFilters`). Free of
TensorFlow and pyarrow: the command line's ``data stats`` and ``compare`` take these
dataclasses as their flags (their field docstrings are the help); the readers are
`tfrs_logq.pipelines.datasets` and `tfrs_logq.pipelines.user_log`."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, Optional

from tyro.conf import arg, create_mutex_group

from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS

LOG_FORMATS = ("csv", "tsv", "parquet", "jsonl")  # `log_readers.FORMATS` (a test checks)
# One source at most: a built-in dataset or a user's log (a subclass that widens one of
# the two fields annotates it with this group too).
SOURCE_GROUP = create_mutex_group(required=False, title="the data: --dataset or --interactions")


@dataclasses.dataclass
class DataSource:
    """A built-in dataset (--dataset), or your own log (--interactions with --user-column
    and --item-column)."""

    dataset: Annotated[Optional[Literal[DATASETS]], SOURCE_GROUP] = None
    """a built-in dataset, instead of --interactions (unset: ml-1m, unless --interactions;
    compare needs one of them)"""
    data_dir: Annotated[Optional[str], arg(metavar="DIR")] = None
    """directory holding --dataset's files, searched at its top level and one level down
    (unset: $TFRS_LOGQ_DATA_DIR, else the download cache)"""
    data_format: Optional[Literal[ML1M_FORMATS]] = None
    """--dataset ml-1m: MovieLens's ratings.dat (timestamps) or SASRec's ml-1m.txt (order
    only; no download exists) (unset: whichever the data directory holds)"""
    interactions: Annotated[Optional[str], arg(metavar="PATH"), SOURCE_GROUP] = None
    """your own log instead of --dataset: a CSV/TSV (optionally .gz), Parquet or JSON Lines
    file, a glob or a directory"""
    user_column: Annotated[Optional[str], arg(metavar="C")] = None
    """--interactions: the column of user ids (text or integers)"""
    item_column: Annotated[Optional[str], arg(metavar="C")] = None
    """--interactions: the column of item ids (text or integers)"""
    time_column: Annotated[Optional[str], arg(metavar="C")] = None
    """--interactions: the column of times, integer seconds or ISO 8601 text (unset: the
    file order is each user's order, and no temporal split)"""
    weight_column: Annotated[Optional[str], arg(metavar="C")] = None
    """--interactions: a number per interaction (>= 0), read and checked; compare's
    two-tower multiplies each example's loss by its target's weight"""
    log_format: Optional[Literal[LOG_FORMATS]] = None
    """--interactions: csv, tsv, parquet or jsonl for every file (unset: each file's
    extension)"""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # "" is neither a path nor a column
            value = getattr(self, field.name)
            if isinstance(value, str) and not value.strip():
                raise ValueError(f"--{field.name.replace('_', '-')} is empty: give a value, "
                                 f"or leave the flag out.")


@dataclasses.dataclass
class LogFilters:
    """How a user's log is filtered before the split (a built-in dataset is preprocessed
    as its papers do)."""

    min_item_interactions: int = 5
    """drop items with fewer interactions"""
    min_user_interactions: int = 0
    """then drop users with fewer"""
    deduplicate: bool = False
    """keep only the first of repeated (user, item) pairs"""

    def __post_init__(self) -> None:
        for name, least in (("min_item_interactions", 1), ("min_user_interactions", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"argument --{name.replace('_', '-')}: must be >= {least}, "
                                 f"got {getattr(self, name)}")


__all__ = ["LOG_FORMATS", "SOURCE_GROUP", "DataSource", "LogFilters"]
