"""A user's own interaction log: any CSV, TSV, Parquet or JSON Lines, columns named by the user.

    >>> from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
    >>> source = UserLogSource("ratings.csv", user_column="user_id",
    ...                        item_column="movie_id", time_column="timestamp")
    >>> split = load_user_log_split(source, "temporal")       # doctest: +SKIP

The source (`UserLogSource`) is a file, a glob (``logs/*.parquet``) or a directory
(every file in it and below, but names starting with ``.`` or ``_`` such as
``_SUCCESS``), read in sorted path order; each file's format comes from its
extension or from ``format``. Reading streams (`tfrs_logq.pipelines.log_readers`):

- **ids** (integers or text; text trimmed of the white space around it,
  `tfrs_logq.pipelines.ids.normalize_id`, as the export and the server trim a
  request's ids) become codes in order of first appearance through a
  vocabulary of distinct ids (`IdEncoder`); a CSV's ids that are all integers are
  integers. An empty or missing id, or one longer than
  `tfrs_logq.pipelines.ids.MAX_ID_CHARS` characters, makes the row malformed.
- **time** (optional): integers since 1970, or ISO 8601 text (``2000-10-04``,
  ``2000-10-04T12:00:00``, ``...Z``, ``...+02:00``, fractions of a second dropped;
  without an offset: UTC; years 1 to 9999), or a Parquet/JSON timestamp or date. A
  value that is none of these makes the row malformed ("unparseable timestamp"). A
  column has one unit: integers are seconds, milliseconds, microseconds or
  nanoseconds by their magnitude (`interactions.epoch_unit`), dates are seconds; a
  time in another unit than the column's first is refused, naming its row (a log
  that mixes seconds and milliseconds would otherwise sort 1970 before 2025).
- **weight** (optional): a number per interaction, kept in `Interactions.weight`.

A malformed row raises `DataFormatError` naming the file and line (the row of a
Parquet file), or with ``skip_bad_lines`` is skipped and counted; more than
``max_bad_share`` of the lines skipped (1 % by default) is refused. Then the same
preprocessing as the built-in datasets (`build_interactions`: minimum counts per
item and user, optional deduplication, ids from 1, each user's interactions in time
order with ties in file order) and the same splits (`make_split`), so that a log
gives the same `Split`, and the same `data_stats`, as a built-in loader on the same
rows. Everything the data cannot support is a one-line `DataFormatError` (a
`ValueError`): no interactions, too few left after filtering, an empty split part.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import logging
import os
import stat
import unicodedata
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrs_logq._util.hostinfo import available_memory_bytes
from tfrs_logq.pipelines.ids import MAX_ID_CHARS, normalize_id_column, too_long_ids
from tfrs_logq.pipelines.interactions import (
    EPOCH_UNITS,
    DataFormatError,
    Interactions,
    ParseReport,
    build_interactions,
    epoch_unit,
)
from tfrs_logq.pipelines.log_readers import FORMATS, Batch, Piece, format_of, pieces, read_batches
from tfrs_logq.pipelines.log_readers import SKIP_HINT as _SKIP_HINT
from tfrs_logq.pipelines.splits import SPLITS, Split, make_split
from tfrs_logq.pipelines.vocabulary import IdEncoder

__all__ = ["UserLogSource", "RawLog", "FORMATS", "DEFAULT_TEMPORAL_FRACTION",
           "DEFAULT_MAX_BAD_SHARE", "read_user_log",
           "read_piece", "merge_raw_logs", "interactions_from_raw", "split_interactions",
           "load_user_log", "load_user_log_split"]

log = logging.getLogger("tfrs_logq.data")

DEFAULT_TEMPORAL_FRACTION = 0.1  # ML-1M's (and the paper's) test and validation fraction
DEFAULT_MAX_BAD_SHARE = 0.01  # the most of a log's lines skip_bad_lines may skip
_SPLIT_HINTS = {
    "temporal": "raise temporal_fraction (--temporal-fraction), or give a longer log",
    "loo": "leave-one-out validates and tests only users with 3 or more interactions; give "
           "more interactions per user",
    "gsasrec": "gSASRec's split validates its drawn users with 3 or more interactions and "
               "tests users with 2 or more; give more interactions per user",
}


@dataclasses.dataclass(frozen=True)
class UserLogSource:
    """Where a log is and which columns mean what (the CLI's ``--interactions`` and
    column flags).

    Args:
      path: str. A file, a glob (``logs/part-*.csv.gz``) or a directory.
      user_column: str. The column of user ids (integers or text).
      item_column: str. The column of item ids (integers or text).
      time_column: str. Integer seconds or ISO 8601 text. Defaults to None (no
        times: the file order is each user's order; no temporal split).
      weight_column: str. A number per interaction. Defaults to None.
      format: str. One of ``csv``, ``tsv``, ``parquet``, ``jsonl`` for every file.
        Defaults to None: each file's extension.
      skip_bad_lines: bool. Skip and count malformed rows instead of failing.
        Defaults to False.
      max_bad_share: float. With ``skip_bad_lines``, the largest share of the lines
        read that may be skipped; more is refused (a log that lost that much is not
        the log). Defaults to 0.01 (`DEFAULT_MAX_BAD_SHARE`).
    """

    path: str
    user_column: str
    item_column: str
    time_column: Optional[str] = None
    weight_column: Optional[str] = None
    format: Optional[str] = None
    skip_bad_lines: bool = False
    max_bad_share: float = DEFAULT_MAX_BAD_SHARE

    def __post_init__(self) -> None:
        if self.format is not None and self.format not in FORMATS:
            raise ValueError(f"`format` must be one of {FORMATS}, received {self.format!r}.")
        if not 0 <= self.max_bad_share <= 1:
            raise ValueError(f"`max_bad_share` (--max-bad-share) must be in [0, 1], received "
                             f"{self.max_bad_share!r}.")
        for name in ("path", "user_column", "item_column"):
            if not str(getattr(self, name) or "").strip():
                raise ValueError(f"`{name}` is empty.")
        named = [unicodedata.normalize("NFC", c) for c in self.columns()]
        if len(set(named)) != len(named):
            raise ValueError(f"the user, item, time and weight columns must differ, received "
                             f"{named}.")

    def columns(self) -> list:
        return [c for c in (self.user_column, self.item_column, self.time_column,
                            self.weight_column) if c is not None]

    def files(self) -> list:
        """The files read, in order.

        Raises:
          FileNotFoundError: nothing matches.
          DataFormatError: the path is not a regular file (a device such as
            ``/dev/zero``, a FIFO).
        """
        path = os.path.expanduser(str(self.path))
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                found += [os.path.join(root, n) for n in names if not n.startswith((".", "_"))
                          and os.path.isfile(os.path.join(root, n))]
            if not found:
                raise FileNotFoundError(f"the directory {path} holds no data files.")
            return sorted(found)
        if os.path.isfile(path):
            return [path]
        if os.path.exists(path):  # a device, a FIFO, a socket: nothing to read to an end
            raise DataFormatError(f"{path} is not a regular file ({_file_kind(path)}): give a "
                                  "log file, a glob or a directory of them.")
        if glob.has_magic(path):
            found = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
            if not found:
                raise FileNotFoundError(f"no file matches {path}.")
            return found
        raise FileNotFoundError(f"no such file or directory: {path}")

    def pieces(self) -> list:
        """`Piece`s of every file (Parquet by row group), in reading order."""
        return [p for path in self.files() for p in pieces(path, format_of(path, self.format))]

    def name(self) -> str:
        """A name for the log: the file's or directory's base name, extensions off."""
        base = os.path.basename(os.path.normpath(str(self.path))) or "interactions"
        for _ in range(2):
            stem, ext = os.path.splitext(base)
            if ext.lower() in (".gz", ".csv", ".tsv", ".tab", ".parquet", ".pq", ".jsonl",
                               ".ndjson", ".json"):
                base = stem
        return base.replace("*", "").strip("-_.") or "interactions"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _file_kind(path: str) -> str:
    mode = os.stat(path).st_mode
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file or a directory"


@dataclasses.dataclass
class RawLog:
    """Rows as read, before preprocessing: codes into the id vocabularies.

    Attributes:
      user, item: `[n]` int32 codes (`IdEncoder`, first appearance in reading order).
      timestamp: `[n]` int64 times in ``time_unit``, or None. weight: `[n]` float64,
        or None.
      users, items: `IdEncoder`. The distinct ids.
      report: `ParseReport`. Rows read, skipped and the first messages.
      formats: list. The formats read.
      text_ids: bool. Some file is text (CSV/TSV): ids that are all integers are read
        as integers.
      time_unit: str. The unit of ``timestamp`` (one of `EPOCH_UNITS`).
    """

    user: np.ndarray
    item: np.ndarray
    timestamp: Optional[np.ndarray]
    weight: Optional[np.ndarray]
    users: IdEncoder
    items: IdEncoder
    report: ParseReport
    formats: list
    text_ids: bool
    time_unit: str = "seconds"

    def __len__(self) -> int:
        return int(len(self.user))


# ---------------------------------------------------------------------- converting


def _ids(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The ids (text through `ids.normalize_id_column`) and `[n]` bool: missing."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = normalize_id_column(column)
        missing = pc.or_kleene(pc.is_null(column), pc.equal(column, ""))
    else:
        missing = pc.is_null(column)
    return column, np.asarray(missing.to_numpy(zero_copy_only=False), bool)


_UNIT = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}


_DATES = len(EPOCH_UNITS)  # the kind of a time written as a date (ISO text, a timestamp)
_INT64 = 2**63


def _iso_seconds(text: Optional[str]) -> tuple:
    """``(time, is a date)`` of one text: an integer as it is, ISO 8601 text (years 1
    to 9999; UTC without an offset) in seconds; ``(None, False)`` if it is neither."""
    if text is None:
        return None, False
    text = text.strip()
    try:
        if text.lstrip("+-").isdigit():
            value = int(text)
            return (value, False) if -_INT64 < value < _INT64 else (None, False)
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None, False
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(np.floor(moment.timestamp())), True


def _kinds(values: np.ndarray, dates) -> np.ndarray:
    """`[n]` int8: each time's unit (an index into `EPOCH_UNITS`), or `_DATES` where
    ``dates`` (bool, or a `[n]` bool array) says it was written as a date."""
    return np.where(dates, _DATES, epoch_unit(values)).astype(np.int8)


def _seconds(column: pa.Array, name: str, where: str) -> tuple:
    """``(times, valid, kinds)`` of a time column: integers, whole floats, timestamps,
    dates, or text (integers or ISO 8601). Integers are kept as written (their unit,
    `_kinds`, is checked by the caller); dates become seconds.

    Raises:
      DataFormatError: a column type that cannot hold times.
    """
    kind = column.type
    valid = ~np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), bool)
    if pa.types.is_integer(kind):
        values = column.fill_null(0).cast(pa.int64()).to_numpy()
        return values, valid, _kinds(values, False)
    if pa.types.is_floating(kind):
        values = column.fill_null(0).to_numpy()
        valid &= np.isfinite(values) & (np.floor(values) == values) & (np.abs(values) < 2**63)
        values = np.where(valid, values, 0).astype(np.int64)
        return values, valid, _kinds(values, False)
    if pa.types.is_timestamp(kind):
        ticks = column.cast(pa.timestamp(kind.unit)).cast(pa.int64()).fill_null(0).to_numpy()
        values = np.floor_divide(ticks, _UNIT[kind.unit])
        return values, valid, _kinds(values, True)
    if pa.types.is_date32(kind):
        values = column.cast(pa.int32()).fill_null(0).to_numpy().astype(np.int64) * 86400
        return values, valid, _kinds(values, True)
    if pa.types.is_date64(kind):
        values = np.floor_divide(column.cast(pa.int64()).fill_null(0).to_numpy(), 1000)
        return values, valid, _kinds(values, True)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataFormatError(f"{where}: the time column {name!r} holds {kind}; it must be "
                              "integers since 1970 or ISO 8601 text (2000-10-04T12:00:00Z).")
    text = pc.utf8_trim_whitespace(column.cast(pa.string()))
    for target, scale in ((pa.int64(), 1), (pa.timestamp("us"), 1_000_000),
                          (pa.timestamp("us", tz="UTC"), 1_000_000)):
        try:  # the whole batch in one format: Arrow's parsers
            ticks = text.cast(target).cast(pa.int64()).fill_null(0).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        values = np.floor_divide(ticks, scale)
        inside = values[valid]
        if scale > 1 and ((inside < _YEAR_1).any() or (inside >= _YEAR_10000).any()):
            break  # a year Arrow reads and ISO 8601 does not (0, 10000): row by row
        return values, valid, _kinds(values, scale > 1)
    parsed = [_iso_seconds(v) for v in text.to_pylist()]  # mixed, or some unparseable
    valid &= np.array([p is not None for p, _ in parsed], bool)
    values = np.array([p or 0 for p, _ in parsed], np.int64)
    return values, valid, _kinds(values, np.array([d for _, d in parsed], bool))


_YEAR_1 = -62135596800  # 0001-01-01T00:00:00Z in seconds
_YEAR_10000 = 253402300800  # 10000-01-01T00:00:00Z


def _kind_name(kind: int) -> str:
    return "a date (seconds)" if kind == _DATES else f"epoch {EPOCH_UNITS[kind]}"


def _unit(kind: int) -> str:
    return EPOCH_UNITS[0] if kind == _DATES else EPOCH_UNITS[kind]


def _weights(column: pa.Array, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.utf8_trim_whitespace(column.cast(pa.string()))
        try:
            column = text.cast(pa.float64())
        except pa.ArrowInvalid:
            column = pa.array([_float(v) for v in text.to_pylist()], pa.float64())
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)
              or pa.types.is_decimal(kind)):
        raise DataFormatError(f"{where}: the weight column {name!r} holds {kind}; it must hold "
                              "numbers.")
    values = column.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    return values, np.isfinite(values)


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class _Shown(str):
    """A value as an error message shows it (its repr, long ones cut)."""

    def __repr__(self) -> str:
        return str(self)


def _shown(value, limit: int = 60):
    """A value for an error message: long text cut to ``limit`` characters."""
    if isinstance(value, str) and len(value) > limit:
        return _Shown(f"{value[:limit]!r}... ({len(value):,} characters)")
    return value


def _check_one_unit(batch: Batch, column: str, kinds: np.ndarray, keep: np.ndarray,
                    raw: dict) -> None:
    """Refuses a time in another unit than the column's first (`_kinds`), naming its
    row and the first time's; records the first."""
    rows = np.flatnonzero(keep)
    if not len(rows):
        return
    if raw["time_kind"] is None:
        k = int(rows[0])
        raw["time_kind"] = (int(kinds[k]), batch.columns[column][k].as_py(),
                            batch.where(k))  # named now: a batch is not kept
    first_kind, first_value, first_where = raw["time_kind"]
    units = np.array([_unit(int(k)) for k in range(len(EPOCH_UNITS) + 1)])
    other = np.flatnonzero(units[kinds[rows]] != _unit(first_kind))
    if len(other):
        k = int(rows[other[0]])
        value = _shown(batch.columns[column][k].as_py())
        raise DataFormatError(
            f"{batch.where(k)}: the time column {column!r} mixes units: {value!r} is "
            f"{_kind_name(int(kinds[k]))} and the first time, {_shown(first_value)!r} "
            f"({first_where}), is {_kind_name(first_kind)}: write every time of the "
            "column in one unit (all epoch seconds, all epoch milliseconds, or all ISO 8601 "
            "text).")


def _codes(codes: np.ndarray, encoder: IdEncoder, path: str) -> np.ndarray:
    """int32 codes (half the memory of a log's largest columns)."""
    if len(encoder) > np.iinfo(np.int32).max:
        raise DataFormatError(f"{path}: more than 2**31 - 1 distinct ids.")
    return codes.astype(np.int32)


def _convert(batch: Batch, source: UserLogSource, raw: dict, report: ParseReport) -> None:
    """Checks one batch's rows, skips (or raises on) malformed ones, and appends the
    rest to ``raw``'s column lists, ids through its encoders."""
    n, path = len(batch), batch.path
    bad = np.zeros(n, bool)
    reasons = []  # (mask, what is wrong with the value)
    ids = {}
    for role, name in (("user", source.user_column), ("item", source.item_column)):
        ids[role], missing = _ids(batch.columns[name])
        reasons.append((missing, f"no {role} id in column {name!r}"))
        reasons.append((too_long_ids(ids[role]), f"a {role} id longer than "
                        f"{MAX_ID_CHARS:,} characters in column {name!r} (an id is at most "
                        f"{MAX_ID_CHARS:,}: is the column the id?)"))
    times = weights = kinds = None
    if source.time_column is not None:
        times, valid, kinds = _seconds(batch.columns[source.time_column],
                                       source.time_column, path)
        reasons.append((~valid, f"unparseable timestamp in column {source.time_column!r} "
                                "(integers since 1970 or ISO 8601 text such as "
                                "2000-10-04T12:00:00Z, years 1 to 9999)"))
    if source.weight_column is not None:
        weights, valid = _weights(batch.columns[source.weight_column], source.weight_column,
                                  path)
        reasons.append((~valid, f"no number in the weight column {source.weight_column!r}"))
    for mask, _ in reasons:
        bad |= mask
    if bad.any():
        for k in np.flatnonzero(bad)[:5 if source.skip_bad_lines else 1]:
            if source.skip_bad_lines and len(report.first_errors) >= 5:
                break
            what = next(why for mask, why in reasons if mask[k])
            values = {c: _shown(batch.columns[c][int(k)].as_py()) for c in source.columns()}
            message = f"{batch.where(int(k))}: {what}: {values}"
            if not source.skip_bad_lines:
                raise DataFormatError(f"{message} {_SKIP_HINT}")
            report.first_errors.append(message)
        report.skipped += int(bad.sum())
        report.rows -= int(bad.sum())
    keep = ~bad
    if kinds is not None:
        _check_one_unit(batch, source.time_column, kinds, keep, raw)
    for role, name, encoder in (("user", source.user_column, raw["users"]),
                                ("item", source.item_column, raw["items"])):
        column = ids[role].filter(pa.array(keep)) if bad.any() else ids[role]
        if len(column) == 0:
            continue
        try:
            raw[role].append(_codes(encoder.encode(column), encoder, path))
        except TypeError as exc:
            raise DataFormatError(f"{path}: the {role} column {name!r} holds {exc}; ids must be "
                                  "integers or text.") from None
    if keep.any():
        if times is not None:
            raw["timestamp"].append(times[keep])
        if weights is not None:
            raw["weight"].append(weights[keep])


# ------------------------------------------------------------------------- reading


def _read(source: UserLogSource, parts: list, users: IdEncoder, items: IdEncoder) -> RawLog:
    report = ParseReport()
    raw = {"user": [], "item": [], "timestamp": [], "weight": [], "users": users,
           "items": items, "time_kind": None}
    for piece in parts:
        batches: Iterator[Batch] = read_batches(piece, source.columns(),
                                                skip_bad_lines=source.skip_bad_lines,
                                                report=report)
        for batch in batches:
            _convert(batch, source, raw, report)

    def joined(key, dtype):  # one column at a time, its batches freed as it is joined
        chunks = raw.pop(key)
        return np.concatenate(chunks).astype(dtype, copy=False) if chunks else \
            np.zeros(0, dtype)

    formats = sorted({p.fmt for p in parts})
    kind = raw["time_kind"]
    return RawLog(joined("user", np.int32), joined("item", np.int32),
                  joined("timestamp", np.int64) if source.time_column else None,
                  joined("weight", np.float64) if source.weight_column else None,
                  users, items, report, formats, any(f in ("csv", "tsv") for f in formats),
                  _unit(kind[0]) if kind is not None else EPOCH_UNITS[0])


def read_piece(source: UserLogSource, piece: Piece) -> RawLog:
    """One piece with its own vocabularies (a Beam worker's part; `merge_raw_logs`
    puts the pieces together as one reading of the whole log would)."""
    return _read(source, [piece], IdEncoder(), IdEncoder())


def read_user_log(source: UserLogSource) -> RawLog:
    """Every file of the source, streamed, into one `RawLog`.

    Raises:
      FileNotFoundError: no file matches the source.
      DataFormatError: a missing column, a malformed row (unless ``skip_bad_lines``),
        a damaged file.
    """
    return _read(source, source.pieces(), IdEncoder(), IdEncoder())


def merge_raw_logs(parts: list) -> RawLog:
    """Pieces read apart (`read_piece`), in reading order, as one `RawLog`: the codes
    are re-mapped through vocabularies built in that order, so the result equals
    `read_user_log`'s."""
    users, items, report = IdEncoder(), IdEncoder(), ParseReport()
    columns: dict = {"user": [], "item": [], "timestamp": [], "weight": []}
    for part in parts:
        columns["user"].append(users.encode(part.users.arrow_values()).astype(np.int32)
                               [part.user] if len(part) else part.user)
        columns["item"].append(items.encode(part.items.arrow_values()).astype(np.int32)
                               [part.item] if len(part) else part.item)
        for key in ("timestamp", "weight"):
            if getattr(part, key) is not None:
                columns[key].append(getattr(part, key))
        report.rows += part.report.rows
        report.lines += part.report.lines
        report.skipped += part.report.skipped
        report.first_errors += part.report.first_errors[:5 - len(report.first_errors)]
    if not parts:
        raise ValueError("merge_raw_logs needs at least one part.")
    first = parts[0]
    units = sorted({p.time_unit for p in parts if len(p) and p.timestamp is not None})
    if len(units) > 1:
        raise DataFormatError(f"the log's files write times in different units ("
                              f"{' and '.join('epoch ' + u for u in units)}): write every time "
                              "in one unit (all epoch seconds, or all ISO 8601 text).")
    join = lambda key, dtype: np.concatenate(columns[key]).astype(dtype, copy=False)  # noqa: E731
    return RawLog(join("user", np.int32), join("item", np.int32),
                  join("timestamp", np.int64) if first.timestamp is not None else None,
                  join("weight", np.float64) if first.weight is not None else None,
                  users, items, report, sorted({f for p in parts for f in p.formats}),
                  any(p.text_ids for p in parts), units[0] if units else EPOCH_UNITS[0])


# -------------------------------------------------------------------- preprocessing


def interactions_from_raw(raw: RawLog, source: UserLogSource, *, name: Optional[str] = None,
                          min_item_interactions: int = 5, min_user_interactions: int = 0,
                          deduplicate: bool = False) -> Interactions:
    """`build_interactions` on the rows read, with the log's own ids and provenance.

    Raises:
      DataFormatError: no rows, or too few interactions left after the filters (none,
        or a single item).
    """
    where, report = str(source.path), raw.report
    if len(raw) == 0:
        first = f"; first: {report.first_errors[0]}" if report.first_errors else ""
        raise DataFormatError(f"{where}: no interactions ({report.rows} rows read, "
                              f"{report.skipped} skipped as malformed{first}).")
    _check_bad_share(report, source)
    need = _id_table_bytes(raw.users) + _id_table_bytes(raw.items)
    have = available_memory_bytes()
    if need > have:
        raise DataFormatError(
            f"{where}: the log's ids would take {need / 2**30:.1f} GiB as arrays (each text "
            f"id as wide as the longest), and this machine has {have / 2**30:.1f} GiB "
            "available: shorten the ids (integers, or a hash of long ones).")
    interactions = build_interactions(
        raw.user, raw.item, raw.timestamp, weight=raw.weight, deduplicate=deduplicate,
        min_item_interactions=min_item_interactions,
        min_user_interactions=min_user_interactions, name=name or source.name())
    if len(interactions) == 0 or interactions.num_items < 2:
        raise DataFormatError(
            f"{where}: too few interactions left after filtering ({len(interactions)} "
            f"interactions, {interactions.num_items} item(s) from {len(raw)} rows, with "
            f"min_item_interactions={min_item_interactions}, min_user_interactions="
            f"{min_user_interactions}, deduplicate={deduplicate}); a split needs two items "
            "or more: lower --min-item-interactions or --min-user-interactions "
            "(min_item_interactions=, min_user_interactions=), or give a longer log.")
    interactions.raw_users = raw.users.values(raw.text_ids)[interactions.raw_users]
    interactions.raw_items = raw.items.values(raw.text_ids)[interactions.raw_items]
    interactions.source = os.path.abspath(os.path.expanduser(str(source.path)))
    interactions.data_format = ",".join(raw.formats)
    interactions.num_rows = report.rows
    interactions.skipped_lines = report.skipped
    interactions.time_unit = raw.time_unit
    return interactions


def _check_bad_share(report: ParseReport, source: UserLogSource) -> None:
    """Refuses a log whose skipped lines are more than ``source.max_bad_share`` of the
    lines read (rows kept and lines skipped)."""
    total = report.rows + report.skipped
    if not report.skipped or report.skipped <= source.max_bad_share * total:
        return
    first = f"; first: {report.first_errors[0]}" if report.first_errors else ""
    raise DataFormatError(
        f"{source.path}: {report.skipped:,} of {total:,} lines "
        f"({report.skipped / total:.1%}) were skipped as malformed, more than the "
        f"{source.max_bad_share:.1%} --skip-bad-lines may skip (--max-bad-share "
        f"{source.max_bad_share:g}){first}: repair the file, or raise --max-bad-share if "
        "losing them is acceptable.")


def _id_table_bytes(encoder: IdEncoder) -> int:
    """The bytes of `IdEncoder.values`' numpy array: 8 an integer id; text ids as wide
    as the longest (4 bytes a character)."""
    values = encoder.arrow_values()
    if not len(values) or not (pa.types.is_string(values.type)
                               or pa.types.is_large_string(values.type)):
        return 8 * len(values)
    longest = pc.max(pc.utf8_length(values)).as_py() or 1
    return len(values) * 4 * int(longest)


def split_interactions(interactions: Interactions, split: str, *,
                       temporal_fraction: Optional[float] = None,
                       num_validation_users: int = 512, validation_seed: int = 42) -> Split:
    """`make_split` with a log's checks: a temporal split needs the time column,
    gSASRec's draw needs enough users, and no part may be empty.

    Raises:
      DataFormatError: one of those, in one line.
    """
    where = interactions.source or interactions.name
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, received {split!r}.")
    options: dict = {}
    if split == "temporal":
        if interactions.timestamp is None:
            raise DataFormatError(f"{where}: the temporal split needs times; name the time "
                                  "column (time_column, --time-column) or use --split loo or "
                                  "--split gsasrec.")
        options["fraction"] = temporal_fraction or DEFAULT_TEMPORAL_FRACTION
    if split == "gsasrec":
        if num_validation_users > interactions.num_users:
            raise DataFormatError(
                f"{where}: the gsasrec split draws {num_validation_users} validation users and "
                f"the log has {interactions.num_users} after filtering; use --split loo or "
                "--split temporal (from Python: or lower num_validation_users=).")
        options.update(num_validation_users=num_validation_users, seed=validation_seed)
    result = make_split(interactions, split, **options)
    sizes = {"train": int(result.train_lengths.sum()), "validation": len(result.validation),
             "test": len(result.test)}
    empty = [part for part, size in sizes.items() if size == 0]
    if empty:
        raise DataFormatError(
            f"{where}: the {split} split leaves the {' and '.join(empty)} part"
            f"{'s' if len(empty) > 1 else ''} empty ({len(interactions)} interactions, "
            f"{interactions.num_users} users after filtering): {_SPLIT_HINTS[split]}.")
    return result


def load_user_log(source: UserLogSource, *, name: Optional[str] = None,
                  min_item_interactions: int = 5, min_user_interactions: int = 0,
                  deduplicate: bool = False) -> Interactions:
    """The log, read and preprocessed as the built-in datasets are.

    Args:
      source: `UserLogSource`.
      name: str. The log's name (`data_stats`'s ``dataset``). Defaults to the
        source's base name.
      min_item_interactions: int. Items with fewer interactions are removed (counted
        once over the whole log). Defaults to 5, as for ML-1M and Steam.
      min_user_interactions: int. Then users with fewer are removed. Defaults to 0.
      deduplicate: bool. Keep only the first (earliest) of repeated (user, item)
        pairs, before the counts. Defaults to False (every row counts, as SASRec's
        preprocessing does).

    Raises:
      FileNotFoundError: nothing at ``source.path``.
      DataFormatError: see `read_user_log` and `interactions_from_raw`.
    """
    interactions = interactions_from_raw(
        read_user_log(source), source, name=name, min_item_interactions=min_item_interactions,
        min_user_interactions=min_user_interactions, deduplicate=deduplicate)
    skipped = interactions.skipped_lines
    log.info("%s: %s (%s): %s rows%s; %s interactions, %s users, %s items after "
             "preprocessing", interactions.name, interactions.source, interactions.data_format,
             f"{interactions.num_rows:,}", f", {skipped:,} malformed skipped" if skipped else "",
             f"{len(interactions):,}", f"{interactions.num_users:,}",
             f"{interactions.num_items:,}")
    return interactions


def load_user_log_split(source: UserLogSource, split: str = "temporal", *,
                        temporal_fraction: Optional[float] = None,
                        num_validation_users: int = 512, validation_seed: int = 42,
                        **preprocessing) -> Split:
    """`load_user_log` then `split_interactions`: the same `Split` a built-in
    dataset's ``load_split`` gives.

    Args:
      source: `UserLogSource`.
      split: str. ``temporal``, ``loo`` or ``gsasrec``. Defaults to ``"temporal"``.
      temporal_fraction: float. The temporal split's test (and validation) fraction.
        Defaults to 0.1 (`DEFAULT_TEMPORAL_FRACTION`).
      num_validation_users, validation_seed: gSASRec's draw. Default to 512 and 42.
      **preprocessing: ``name``, ``min_item_interactions``, ``min_user_interactions``,
        ``deduplicate``, as in `load_user_log`.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, received {split!r}.")
    if split == "temporal" and source.time_column is None:
        raise DataFormatError(f"{source.path}: the temporal split needs times; name the time "
                              "column (time_column, --time-column) or use --split loo or "
                              "--split gsasrec.")
    return split_interactions(load_user_log(source, **preprocessing), split,
                              temporal_fraction=temporal_fraction,
                              num_validation_users=num_validation_users,
                              validation_seed=validation_seed)
