"""Id vocabularies: a log's own user and item ids <-> the contiguous ids of `Interactions`.

Two halves:

- `IdEncoder` turns a streamed column of raw ids (integers or strings, in pyarrow
  batches) into codes ``0, 1, ...`` in order of first appearance, holding only the
  distinct ids (in a pyarrow array), never a Python object per row. Codes in order
  of first appearance are what `build_interactions` needs to give the same ids as it
  would on the raw values.
- `Vocabulary` is the finished mapping of one kind (``users``: internal id ``u`` at
  position ``u``; ``items``: internal id ``d`` at position ``d - 1``, 0 being padding),
  saved as one JSON file per kind beside a run (`save_vocabularies`, written
  atomically) and loaded back (`load_vocabularies`) so that export and serving
  answer in the log's own ids (`Vocabulary.to_raw`, `Vocabulary.to_internal`).

    >>> import numpy as np
    >>> items = Vocabulary("items", np.array(["tt01", "tt07", "tt03"]))
    >>> items.to_raw([2, 1]).tolist()
    ['tt07', 'tt01']
    >>> items.to_internal(["tt03"]).tolist()
    [3]
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrs_logq._util.atomic import write_json
from tfrs_logq.pipelines.ids import normalize_id

__all__ = ["IdEncoder", "Vocabulary", "vocabularies", "save_vocabularies",
           "load_vocabularies", "VOCABULARY_FILES", "RUN_ITEMS_FILE", "write_run_items",
           "read_run_items"]

KINDS = ("users", "items")
VOCABULARY_FILES = {"users": "users.json", "items": "items.json"}
_FIRST_ID = {"users": 0, "items": 1}  # items start at 1: 0 is padding
# A training run's item vocabulary (SASRec and two-tower alike): what export reads.
RUN_ITEMS_FILE = "vocabulary.json"


def _normalise(column: pa.Array) -> pa.Array:
    """Integer ids as int64, text ids as string; ``TypeError`` for any other type."""
    kind = column.type
    if pa.types.is_integer(kind):
        return column.cast(pa.int64())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.cast(pa.string())
    if pa.types.is_floating(kind):  # whole numbers written as floats (a NaN upcast them)
        whole = pc.all(pc.equal(pc.floor(column), column)).as_py()
        if whole is not False:
            return column.cast(pa.int64())
        raise TypeError(f"{kind} with fractional values")
    raise TypeError(str(kind))


class IdEncoder:
    """Codes ``0..n-1`` for a stream of raw ids, in order of first appearance.

    A column of integers stays integer; one of strings stays text; a stream that
    mixes both (a JSON Lines file with ``"user": 7`` and ``"user": "u7"``) is read as
    text from then on, so 7 and "7" are then one id. Each batch costs a hash of its
    distinct values against the distinct values seen so far, in Arrow.
    """

    def __init__(self) -> None:
        self._values: Optional[pa.Array] = None

    def __len__(self) -> int:
        return 0 if self._values is None else len(self._values)

    def encode(self, column: pa.Array) -> np.ndarray:
        """`[len(column)]` int64 codes of a batch without nulls.

        Raises:
          TypeError: the ids are neither integers nor text (message: the type).
        """
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            local, indices = _normalise(column.dictionary), column.indices
        else:
            encoded = pc.dictionary_encode(_normalise(column))
            local, indices = encoded.dictionary, encoded.indices
        if self._values is None:
            self._values = local.slice(0, 0)
        if local.type != self._values.type:  # integers met text: both become text
            self._values = self._values.cast(pa.string())
            local = local.cast(pa.string())
        found = pc.index_in(local, value_set=self._values)
        new = pc.is_null(found)
        mapping = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        fresh = np.flatnonzero(new.to_numpy(zero_copy_only=False))
        if len(fresh):
            mapping[fresh] = len(self._values) + np.arange(len(fresh))
            self._values = pa.concat_arrays([self._values, local.filter(new)])
        return mapping[indices.to_numpy(zero_copy_only=False)]

    def arrow_values(self) -> pa.Array:
        """The distinct ids, code ``k`` at position ``k``."""
        return self._values if self._values is not None else pa.array([], pa.int64())

    def values(self, parse_integers: bool = False) -> np.ndarray:
        """The distinct ids as numpy (int64, or str), code ``k`` at position ``k``.

        Args:
          parse_integers: bool. Text ids that are all integers in canonical form
            (``"42"``, not ``"042"`` or ``"+42"``) come back as int64: a CSV has no
            types, so its ``user_id`` column of numbers is read as numbers. Defaults to
            False (a typed source keeps its types).
        """
        values = self.arrow_values()
        if pa.types.is_string(values.type):
            if parse_integers and len(values):
                try:
                    numbers = values.cast(pa.int64())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    numbers = None
                if numbers is not None and pc.all(pc.equal(numbers.cast(pa.string()),
                                                           values)).as_py():
                    return numbers.to_numpy().astype(np.int64)
            return np.asarray(values.to_pylist(), dtype=str)
        return values.to_numpy(zero_copy_only=False).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The raw id of every internal id of one kind.

    Args:
      kind: str. ``"users"`` (internal ids ``0..U-1``) or ``"items"`` (``1..N``;
        0 is padding and has no raw id).
      ids: `[U]` or `[N]` array (int64 or str). The raw id of internal id
        ``first_id + k`` at position ``k``.
    """

    kind: str
    ids: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be one of {KINDS}, received {self.kind!r}.")

    @property
    def first_id(self) -> int:
        return _FIRST_ID[self.kind]

    def __len__(self) -> int:
        return int(len(self.ids))

    def to_raw(self, internal) -> np.ndarray:
        """The raw ids of internal ids (any shape).

        Raises:
          ValueError: an id outside ``first_id..first_id + len - 1`` (for items, 0
            is padding).
        """
        internal = np.asarray(internal, np.int64)
        position = internal - self.first_id
        bad = (position < 0) | (position >= len(self.ids))
        if bad.any():
            raise ValueError(f"internal {self.kind[:-1]} id {int(internal[bad].flat[0])} is "
                             f"outside {self.first_id}..{self.first_id + len(self.ids) - 1}.")
        return self.ids[position]

    def to_internal(self, raw, missing: Optional[int] = None) -> np.ndarray:
        """The internal ids of raw ids (any shape).

        Args:
          raw: array-like of raw ids (numbers given as text are matched to integer
            vocabularies; text goes through `tfrs_logq.pipelines.ids.normalize_id`,
            as the log's ids did).
          missing: int. The id given to a raw id not in the vocabulary. Defaults to
            None: an unknown id raises ValueError.
        """
        given = np.asarray(raw)
        raw, valid = given, np.ones(given.shape, bool)
        if self.ids.dtype.kind == "U":
            raw = np.asarray([normalize_id(str(x)) for x in given.flat], str).reshape(given.shape)
        elif given.dtype.kind == "f":
            valid = np.isfinite(given) & (np.floor(given) == given)
            raw = np.where(valid, given, 0).astype(np.int64)
        elif given.dtype.kind not in "iu":
            try:
                raw = given.astype(np.int64)  # numbers given as text
            except (ValueError, TypeError, OverflowError):
                raw, valid = np.zeros(given.shape, np.int64), np.zeros(given.shape, bool)
        if len(self.ids):
            sorter = np.argsort(self.ids, kind="stable")
            position = sorter[np.searchsorted(self.ids, raw, sorter=sorter)
                              .clip(max=len(self.ids) - 1)]
            found = valid & (self.ids[position] == raw)
        else:
            position, found = np.zeros(given.shape, np.int64), np.zeros(given.shape, bool)
        if missing is None and not found.all():
            unknown = given[~found].flat[0].tolist()
            raise ValueError(f"unknown {self.kind[:-1]} id {unknown!r} (not in the "
                             f"{len(self.ids)}-id vocabulary).")
        return np.where(found, position + self.first_id, missing if missing is not None else 0)

    def to_json(self) -> dict:
        id_type = "int" if self.ids.dtype.kind in "iu" else "str"
        return {"kind": self.kind, "first_id": self.first_id, "id_type": id_type,
                "ids": self.ids.tolist()}

    @classmethod
    def from_json(cls, record: dict, source: str = "") -> "Vocabulary":
        try:
            kind, id_type, ids = record["kind"], record["id_type"], record["ids"]
        except (KeyError, TypeError):
            raise ValueError(f"{source}: not a vocabulary file (it needs kind, id_type and "
                             "ids).") from None
        dtype = np.int64 if id_type == "int" else str
        return cls(kind, np.asarray(ids, dtype=dtype) if ids else np.zeros(0, dtype))

    def save(self, path: str) -> None:
        """Writes the JSON file atomically (a reader sees the old file or the new one)."""
        write_json(path, self.to_json(), indent=None)

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        with open(path, encoding="utf-8") as f:
            try:
                record = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not valid JSON ({exc}).") from None
        return cls.from_json(record, path)


def vocabularies(interactions) -> tuple[Vocabulary, Vocabulary]:
    """``(users, items)`` of an `Interactions` (its ``raw_users`` and ``raw_items``)."""
    return (Vocabulary("users", np.asarray(interactions.raw_users)),
            Vocabulary("items", np.asarray(interactions.raw_items)))


def save_vocabularies(interactions, directory: str) -> dict:
    """Writes ``users.json`` and ``items.json`` into ``directory`` (created if needed),
    each atomically; returns ``{kind: path}``."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for vocabulary in vocabularies(interactions):
        paths[vocabulary.kind] = os.path.join(directory, VOCABULARY_FILES[vocabulary.kind])
        vocabulary.save(paths[vocabulary.kind])
    return paths


def load_vocabularies(directory: str) -> tuple[Vocabulary, Vocabulary]:
    """``(users, items)`` saved by `save_vocabularies` in ``directory``."""
    loaded = []
    for kind in KINDS:
        vocabulary = Vocabulary.load(os.path.join(directory, VOCABULARY_FILES[kind]))
        if vocabulary.kind != kind:
            raise ValueError(f"{os.path.join(directory, VOCABULARY_FILES[kind])} holds the "
                             f"{vocabulary.kind} vocabulary, not the {kind} one.")
        loaded.append(vocabulary)
    return loaded[0], loaded[1]


def write_run_items(model_dir: str, raw_items) -> None:
    """A training run's ``vocabulary.json``: ``{"raw_items": [...]}``, the raw id (as text)
    of internal item ``i + 1`` at ``i``, written atomically."""
    write_json(os.path.join(model_dir, RUN_ITEMS_FILE),
               {"raw_items": [str(x) for x in raw_items]}, indent=None)


def read_run_items(model_dir: str) -> np.ndarray:
    """A run's item vocabulary (`write_run_items`): int64 when every id is an integer,
    else strings."""
    with open(os.path.join(model_dir, RUN_ITEMS_FILE), encoding="utf-8") as f:
        raw = json.load(f)["raw_items"]
    raw_ids = np.asarray(raw)
    if all(x.lstrip("-").isdigit() for x in raw):
        raw_ids = raw_ids.astype(np.int64)
    return raw_ids
