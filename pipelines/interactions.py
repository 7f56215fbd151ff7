"""Interaction logs: streamed parsing, the SASRec/gSASRec preprocessing, and a safe cache.

An `Interactions` holds parallel numpy arrays ``user``, ``item`` (contiguous ids,
items ``1..num_items`` with 0 reserved for padding) and ``timestamp`` (or None when
the source has no times), in the order ``(user, time, position in the source
file)``. That order is the documented tie-break: interactions of one user with
the same timestamp keep the order of the source file (a stable sort), which is
what SASRec's preprocessing does. It also says where it came from: the file, the
file's format, the rows read and the malformed lines skipped.

Errors name the file: a malformed line (`DataFormatError`, with its line number),
a truncated or corrupt ``.gz``/``.zip``, a file with no interactions. The cache
(`save_cache`/`load_cache`) is checked against its manifest (checksum, sizes, id
ranges) and a damaged one is reported and rebuilt, never trusted.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import logging
import os
import shutil
import zipfile
import zlib
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from tfrs_logq._util.atomic import publish_directory, staging_directory
from tfrs_logq._util.fingerprint import file_fingerprint

log = logging.getLogger("tfrs_logq.data")


# Epoch times' units, and the smallest magnitude read as each (`epoch_unit`).
EPOCH_UNITS = ("seconds", "milliseconds", "microseconds", "nanoseconds")
_EPOCH_LOWEST = (0, 10**11, 10**14, 10**17)
UNIT_PER_SECOND = {"seconds": 1, "milliseconds": 10**3, "microseconds": 10**6,
                   "nanoseconds": 10**9}


def epoch_unit(values: np.ndarray) -> np.ndarray:
    """`[n]` int8: the unit (an index into `EPOCH_UNITS`) each epoch time is written
    in, by its magnitude: seconds below 10^11 (the year 5138), milliseconds below 10^14,
    microseconds below 10^17, else nanoseconds. Times of one unit fall in one band
    unless they reach back before 1973 (10^11 ms), which a log of milliseconds rarely
    does."""
    magnitude = np.abs(np.asarray(values, np.int64))
    return (np.searchsorted(np.asarray(_EPOCH_LOWEST[1:], np.int64), magnitude,
                            side="right")).astype(np.int8)


class DataFormatError(ValueError):
    """A malformed or damaged input file (the message names the file, and the line
    where there is one)."""


# What reading a damaged compressed file raises, line by line.
_DAMAGED = (EOFError, zlib.error, gzip.BadGzipFile, zipfile.BadZipFile, UnicodeDecodeError)


@dataclasses.dataclass
class ParseReport:
    """What a reader saw: lines read, rows parsed and lines skipped as malformed."""

    lines: int = 0
    rows: int = 0
    skipped: int = 0
    first_errors: list = dataclasses.field(default_factory=list)


def open_text(path: str, member: Optional[str] = None, encoding: str = "latin-1") -> io.TextIOBase:
    """Opens a plain, ``.gz`` or ``.zip`` (with ``member``) file as text, streamed.

    A plain file is recognised by content (gzip's magic bytes), but a ``.gz`` name
    without them is a `DataFormatError`: its bytes are not text."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    if path.endswith(".zip"):
        try:
            archive = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise DataFormatError(f"{path} is not a readable zip archive ({exc}); download or "
                                  "copy it again.") from None
        names = archive.namelist()
        if member is None or member not in names:
            raise FileNotFoundError(f"{path} has no member {member!r} (it has {names[:10]})")
        return io.TextIOWrapper(archive.open(member), encoding=encoding)
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding=encoding)
    if path.endswith(".gz"):  # read as text, its bytes would surface in a parse error
        raise DataFormatError(f"{path} is not a gzip file (it does not start with gzip's magic "
                              f"bytes 1f 8b but {magic.hex(' ') or 'nothing'}); download or "
                              "copy it again.")
    return open(path, encoding=encoding)


def parse_lines(
    lines: Iterable[str],
    parse: Callable[[str], Optional[tuple]],
    source: str,
    skip_bad_lines: bool = False,
    report: Optional[ParseReport] = None,
    first_line: int = 1,
) -> Iterator[tuple]:
    """Applies ``parse`` to every line; a malformed line raises `DataFormatError`
    naming ``source`` and the 1-based line number, or is skipped and counted when
    ``skip_bad_lines``. ``parse`` returns None for lines to ignore (blank lines).
    A file that ends early or does not decompress (truncated or corrupt ``.gz``)
    raises `DataFormatError` naming ``source`` too. ``first_line`` is the number
    of the first of ``lines`` in the file (a part of a file read on its own)."""
    report = report if report is not None else ParseReport()
    iterator = iter(lines)
    number = first_line - 1
    while True:
        try:
            line = next(iterator)
        except StopIteration:
            return
        except _DAMAGED as exc:
            raise DataFormatError(
                f"{source}: the file is truncated or corrupt (after line {number}: "
                f"{type(exc).__name__}: {exc}); download or copy it again.") from None
        number += 1
        report.lines += 1
        try:
            row = parse(line)
        except (ValueError, SyntaxError, KeyError, TypeError) as exc:
            message = f"{source}, line {number}: {exc}: {line.strip()[:200]!r}"
            if not skip_bad_lines:
                raise DataFormatError(
                    f"{message} (--skip-bad-lines, or skip_bad_lines=True, skips and counts "
                    "malformed lines)") from None
            report.skipped += 1
            if len(report.first_errors) < 5:
                report.first_errors.append(message)
            continue
        if row is not None:
            report.rows += 1
            yield row


@dataclasses.dataclass
class Interactions:
    """A preprocessed interaction log (see the module docstring for the order).

    Attributes:
      user: `[n]` int32 contiguous user index ``0..num_users-1``.
      item: `[n]` int32 item id ``1..num_items`` (0 is padding).
      timestamp: `[n]` int64 times since 1970 in ``time_unit``, or None.
      raw_users: `[num_users]` the source's user ids (index = user).
      raw_items: `[num_items]` the source's item ids (item ``d`` is ``raw_items[d - 1]``).
      name: str. Dataset name.
      source: str. The file read (empty when built in memory).
      data_format: str. The file's format (``"ratings"``, ``"sasrec"``, ...).
      num_rows: int. Rows read from the file, before any filtering.
      skipped_lines: int. Malformed lines skipped (``skip_bad_lines``).
      weight: `[n]` float64 per-interaction weight (a user log's weight column), or None.
      time_unit: str. The unit of ``timestamp``, one of `EPOCH_UNITS`: ``"seconds"``
        (the built-in datasets, ISO 8601 text, Parquet timestamps), or the one a log's
        epoch integers are written in (`epoch_unit`).
    """

    user: np.ndarray
    item: np.ndarray
    timestamp: Optional[np.ndarray]
    raw_users: np.ndarray
    raw_items: np.ndarray
    name: str = ""
    source: str = ""
    data_format: str = ""
    num_rows: int = 0
    skipped_lines: int = 0
    weight: Optional[np.ndarray] = None
    time_unit: str = "seconds"

    @property
    def num_users(self) -> int:
        return int(len(self.raw_users))

    @property
    def num_items(self) -> int:
        return int(len(self.raw_items))

    def __len__(self) -> int:
        return int(len(self.user))

    def user_offsets(self) -> np.ndarray:
        """`[num_users + 1]`: user ``u``'s interactions are ``[offsets[u], offsets[u+1])``."""
        return np.concatenate([[0], np.cumsum(np.bincount(self.user, minlength=self.num_users))])

    def sequences(self) -> list[np.ndarray]:
        offsets = self.user_offsets()
        return [self.item[offsets[u]:offsets[u + 1]] for u in range(self.num_users)]

    def item_counts(self, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """`[num_items + 1]` interaction counts (entry 0, padding, is 0)."""
        items = self.item if mask is None else self.item[mask]
        return np.bincount(items, minlength=self.num_items + 1)

    def time_range(self) -> Optional[list[int]]:
        if self.timestamp is None or len(self.timestamp) == 0:
            return None
        return [int(self.timestamp.min()), int(self.timestamp.max())]

    def provenance(self) -> dict:
        """Where the interactions came from, as ``tfrs-logq data stats`` reports it:
        ``source``, ``data_format``, ``rows`` (read, before filtering) and
        ``skipped_lines``."""
        return {"source": self.source, "data_format": self.data_format,
                "rows": self.num_rows, "skipped_lines": self.skipped_lines}


def build_interactions(
    raw_user: np.ndarray,
    raw_item: np.ndarray,
    timestamp: Optional[np.ndarray],
    *,
    min_item_interactions: int = 5,
    min_user_interactions: int = 0,
    reindex: bool = True,
    name: str = "",
    deduplicate: bool = False,
    weight: Optional[np.ndarray] = None,
) -> Interactions:
    """The SASRec/gSASRec preprocessing: implicit feedback (every row counts),
    items with fewer than ``min_item_interactions`` removed (one pass, counted
    on the whole log, as SASRec does), then users with fewer than
    ``min_user_interactions`` removed; ids made contiguous (users by first
    appearance in the source, items by first appearance too, starting at 1);
    each user's interactions ordered by time, ties kept in source order.

    With ``deduplicate`` a (user, item) pair that occurs more than once keeps only
    its first occurrence (the earliest in time, ties by source order), before the
    minimum counts are taken. ``weight`` (`[n]`, optional) is carried along: filtered
    and ordered with the rows.

    With ``reindex=False`` the source ids are kept (users ``1..U`` become
    indices ``0..U-1``, items stay ``1..N``): for already-preprocessed files such
    as SASRec's ``ml-1m.txt``, whose ids the published splits refer to."""
    raw_user = np.asarray(raw_user)
    raw_item = np.asarray(raw_item)
    n = len(raw_user)
    if len(raw_item) != n or any(c is not None and len(c) != n for c in (timestamp, weight)):
        raise ValueError("user, item, timestamp and weight columns must have equal lengths.")
    if timestamp is not None:
        timestamp = np.asarray(timestamp, np.int64)
    keep = _first_of_each_pair(raw_user, raw_item, timestamp) if deduplicate else None
    if min_item_interactions > 1:
        keep = _at_least(raw_item, keep, min_item_interactions)
    if min_user_interactions > 1:
        keep = _at_least(raw_user, keep, min_user_interactions)
    if keep is not None:
        raw_user, raw_item = raw_user[keep], raw_item[keep]
        if timestamp is not None:
            timestamp = timestamp[keep]
        if weight is not None:
            weight = np.asarray(weight)[keep]
    if reindex:
        users, user_first = _first_appearance_ids(raw_user)
        items, item_first = _first_appearance_ids(raw_item)
    else:
        users, items = raw_user.astype(np.int64) - 1, raw_item.astype(np.int64) - 1
        if len(users) and (users.min() < 0 or items.min() < 0):
            raise ValueError("with reindex=False user and item ids must start at 1; found "
                             f"user {users.min() + 1} and item {items.min() + 1}.")
        user_first = np.arange(1, users.max() + 2 if len(users) else 1)
        item_first = np.arange(1, items.max() + 2 if len(items) else 1)
    position = np.arange(len(users))
    keys = (position, users) if timestamp is None else (position, timestamp, users)
    order = np.lexsort(keys)  # by user, then time, then source position
    return Interactions(
        user=users[order].astype(np.int32),
        item=(items[order] + 1).astype(np.int32),
        timestamp=None if timestamp is None else timestamp[order],
        raw_users=user_first,
        raw_items=item_first,
        name=name,
        weight=None if weight is None else np.asarray(weight, np.float64)[order],
    )


def _at_least(values: np.ndarray, keep: Optional[np.ndarray], minimum: int) -> np.ndarray:
    """``keep`` (None: every row) less the rows whose value occurs fewer than
    ``minimum`` times among the kept rows."""
    if keep is None:
        _, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
        return counts[inv] >= minimum
    rows = np.flatnonzero(keep)
    _, inv, counts = np.unique(values[rows], return_inverse=True, return_counts=True)
    out = np.zeros(len(values), bool)
    out[rows[counts[inv] >= minimum]] = True
    return out


def _first_of_each_pair(users: np.ndarray, items: np.ndarray,
                        timestamp: Optional[np.ndarray]) -> np.ndarray:
    """`[n]` bool: the first occurrence of each (user, item) pair, earliest in time
    (ties, and a log without times: in source order)."""
    _, u = np.unique(users, return_inverse=True)
    _, i = np.unique(items, return_inverse=True)
    key = u.astype(np.int64) * (int(i.max()) + 1 if len(i) else 1) + i
    if timestamp is None:
        _, first = np.unique(key, return_index=True)  # first occurrence in source order
    else:
        order = np.lexsort((timestamp, key))  # stable: ties in time keep source order
        sorted_key = key[order]
        first = order[np.concatenate([[True], sorted_key[1:] != sorted_key[:-1]])]
    keep = np.zeros(len(key), bool)
    keep[first] = True
    return keep


def _first_appearance_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous ids 0.. in order of first appearance, and the value of each id."""
    uniq, first_index, inverse = np.unique(values, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(len(uniq))
    return rank[inverse], uniq[np.argsort(first_index, kind="stable")]


# ---------------------------------------------------------------------------- cache


CACHE_VERSION = 2
_PROVENANCE = ("name", "source", "data_format", "num_rows", "skipped_lines")


def cache_key(source: str, params: dict) -> str:
    stat = os.stat(source)
    blob = json.dumps(
        {"v": CACHE_VERSION, "source": os.path.abspath(source), "size": stat.st_size,
         "mtime_ns": stat.st_mtime_ns, "params": params},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def check_interactions(interactions: Interactions) -> None:
    """Raises ValueError unless the arrays are consistent: equal lengths, users in
    ``0..num_users-1`` and in order, items in ``1..num_items``."""
    n = len(interactions.user)
    if len(interactions.item) != n or any(
            c is not None and len(c) != n for c in (interactions.timestamp, interactions.weight)):
        raise ValueError("user, item, timestamp and weight columns differ in length")
    if n == 0:
        return
    if interactions.user.min() < 0 or interactions.user.max() >= interactions.num_users:
        raise ValueError(f"user ids outside 0..{interactions.num_users - 1}")
    if interactions.item.min() < 1 or interactions.item.max() > interactions.num_items:
        raise ValueError(f"item ids outside 1..{interactions.num_items}")
    if np.any(np.diff(interactions.user) < 0):
        raise ValueError("interactions are not grouped by user")


def save_cache(interactions: Interactions, directory: str, manifest: dict) -> None:
    """Writes arrays + ``manifest.json`` into a temporary sibling, then renames it
    into place: a reader sees a complete cache or none. ``manifest.json`` is
    written last inside it and is what marks the cache complete; it records the
    checksum of ``interactions.npz``, the sizes and the provenance."""
    parent = os.path.dirname(os.path.abspath(directory))
    with staging_directory(parent, ".tmp-") as tmp:
        arrays = {"user": interactions.user, "item": interactions.item,
                  "raw_users": interactions.raw_users, "raw_items": interactions.raw_items}
        if interactions.timestamp is not None:
            arrays["timestamp"] = interactions.timestamp
        if interactions.weight is not None:
            arrays["weight"] = interactions.weight
        npz = os.path.join(tmp, "interactions.npz")
        np.savez(npz, **arrays)
        record = {
            **manifest, "cache_version": CACHE_VERSION, "npz_sha256": file_fingerprint(npz),
            "num_interactions": len(interactions), "num_users": interactions.num_users,
            "num_items": interactions.num_items,
            "has_timestamps": interactions.timestamp is not None,
            **{k: getattr(interactions, k) for k in _PROVENANCE},
        }
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(record, f)
        publish_directory(tmp, directory)  # an old entry is replaced whole


class CacheError(ValueError):
    """A cache entry that does not match its manifest."""


def _read_cache(directory: str) -> Interactions:
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    if not isinstance(manifest, dict) or manifest.get("cache_version") != CACHE_VERSION:
        raise CacheError("written by another version")
    npz = os.path.join(directory, "interactions.npz")
    if file_fingerprint(npz) != manifest.get("npz_sha256"):
        raise CacheError("interactions.npz does not match the checksum in manifest.json")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    has_timestamps = "timestamp" in arrays
    interactions = Interactions(
        user=arrays["user"], item=arrays["item"],
        timestamp=arrays["timestamp"] if has_timestamps else None,
        raw_users=arrays["raw_users"], raw_items=arrays["raw_items"],
        weight=arrays.get("weight"), **{k: manifest[k] for k in _PROVENANCE},
    )
    expected = (manifest["num_interactions"], manifest["num_users"], manifest["num_items"],
                manifest["has_timestamps"])
    found = (len(interactions), interactions.num_users, interactions.num_items, has_timestamps)
    if found != expected:
        raise CacheError(f"sizes {found} differ from the manifest's {expected}")
    try:
        check_interactions(interactions)
    except ValueError as exc:
        raise CacheError(str(exc)) from None
    return interactions


def load_cache(directory: str) -> Optional[Interactions]:
    """The cached interactions, or None when there is no complete cache entry. An
    entry that fails its checks (unreadable, checksum or sizes differ from the
    manifest, ids out of range) is logged, removed and reported as None, so the
    caller rebuilds it."""
    if not os.path.exists(os.path.join(directory, "manifest.json")):
        return None
    try:
        return _read_cache(directory)
    except (CacheError, OSError, ValueError, KeyError, TypeError, EOFError,
            zipfile.BadZipFile, zlib.error) as exc:
        log.warning("the cache %s is damaged (%s: %s); rebuilding it", directory,
                    type(exc).__name__, exc)
        shutil.rmtree(directory, ignore_errors=True)
        return None
