"""Statistics: training item counts of the ExampleGen artifact, exact and as a count-min sketch.

One Beam ``CombineFn`` (`ItemCountsFn`) reads every user's training prefix
(``item_ids[:train_length]``) and keeps, per worker, the exact counts (a
`[num_items + 1]` vector) and a count-min sketch of the same ids; workers'
accumulators merge by summing both. The sketch is stored sparsely while it is
built (the counters it has touched, at most ``depth * width``) so that a
worker's partial sketch of a 2^20-wide default costs what it holds, not 32 MB;
the artifact stores it dense. The artifact and its loaders (`load_log_q`,
`load_item_statistics`) are described in `item_statistics`.
"""

from __future__ import annotations

import dataclasses
import os

import apache_beam as beam
import numpy as np

from tfrs_logq._util.universal_hash import flat_cells, hash_coefficients
from tfrs_logq.pipelines.beam.artifacts import verified_manifest
from tfrs_logq.pipelines.beam.synthetic_source import ItemTable, chunk_training_ids
from tfrs_logq.pipelines.examples import decode_user, example_class
from tfrs_logq.pipelines.item_statistics import COMPONENT, FILENAME

NAME = COMPONENT
VERSION = 1
_COMPACT_AT = 1 << 16  # pending ids that trigger folding them into the counts


class ItemCountsFn(beam.CombineFn):
    """Exact counts and a count-min sketch of item ids (`[n]` int arrays in).

    The accumulator is a plain list (Beam encodes it between workers):
    ``[counts [num_items + 1] int64, cells [m] int64 sorted flat counter indices,
    values [m] int64 their counts, pending: list of id arrays not yet folded in]``.
    Merging sums the counts and the sketch's counters. The output is a dict of
    ``counts`` and the dense `[depth, width]` ``sketch``.

    Args:
      num_items: int. Ids are ``0..num_items``.
      depth, width, seed: int. The sketch, as `tfrs_logq.frequency.CountMinSketch`.
    """

    def __init__(self, num_items: int, depth: int, width: int, seed: int):
        self.num_items, self.depth, self.width, self.seed = num_items, depth, width, seed

    def setup(self):
        self._a, self._b = hash_coefficients(self.depth, self.seed)

    def create_accumulator(self):
        return [np.zeros(self.num_items + 1, np.int64), np.zeros(0, np.int64),
                np.zeros(0, np.int64), []]

    def _fold(self, acc):
        if not acc[3]:
            return acc
        if not hasattr(self, "_a"):
            self.setup()
        ids = np.concatenate(acc[3])
        acc[3] = []
        if len(ids) and (ids.min() < 0 or ids.max() > self.num_items):
            raise ValueError(f"item ids outside 0..{self.num_items}")
        counts = np.bincount(ids, minlength=self.num_items + 1)
        acc[0] = acc[0] + counts
        seen = np.flatnonzero(counts)
        cells = flat_cells(seen, self._a, self._b, self.width).reshape(-1)
        weights = np.tile(counts[seen], self.depth)
        acc[1], acc[2] = _sum_cells(np.concatenate([acc[1], cells]),
                                    np.concatenate([acc[2], weights]))
        return acc

    def add_input(self, acc, ids):
        acc[3].append(np.asarray(ids, np.int64).reshape(-1))
        if sum(len(x) for x in acc[3]) >= _COMPACT_AT:
            self._fold(acc)
        return acc

    def merge_accumulators(self, accumulators):
        accumulators = [self._fold(acc) for acc in accumulators]
        counts = sum(acc[0] for acc in accumulators)
        cells, values = _sum_cells(np.concatenate([acc[1] for acc in accumulators]),
                                   np.concatenate([acc[2] for acc in accumulators]))
        return [counts, cells, values, []]

    def compact(self, acc):
        return self._fold(acc)

    def extract_output(self, acc):
        acc = self._fold(acc)
        sketch = np.zeros(self.depth * self.width, np.int64)
        sketch[acc[1]] = acc[2]
        return {"counts": acc[0], "sketch": sketch.reshape(self.depth, self.width)}


def _sum_cells(cells: np.ndarray, values: np.ndarray):
    """Sums ``values`` of equal ``cells``: sorted unique cells and their totals."""
    if len(cells) == 0:
        return cells.astype(np.int64), values.astype(np.int64)
    unique, inverse = np.unique(cells, return_inverse=True)
    totals = np.zeros(len(unique), np.int64)
    np.add.at(totals, inverse, values)
    return unique, totals


class TrainingItems(beam.DoFn):
    """A record's training prefix ``item_ids[:train_length]``."""

    def setup(self):
        self._example = example_class()

    def process(self, data: bytes):
        record = decode_user(self._example, data)
        yield record["item_ids"][:int(record["train_length"][0])]


def write_statistics(result: dict, staging: str, depth: int, width: int, seed: int) -> None:
    np.savez_compressed(os.path.join(staging, FILENAME), counts=result["counts"],
                        sketch=result["sketch"], depth=depth, width=width, seed=seed)


def _check_sketch_shape(depth: int, width: int) -> None:
    if int(depth) < 1 or int(width) < 1:
        raise ValueError(f"the sketch's depth and width must be positive, received "
                         f"{depth}, {width}.")


@dataclasses.dataclass
class Statistics:
    """Builds the Statistics artifact from the ExampleGen artifact.

    Args:
      examples_dir: str. The ExampleGen artifact (``PIPELINE_ROOT/ExampleGen``).
      depth, width, seed: int. The count-min sketch, as `CountMinSketch`'s arguments.
        Default to 4, 2**20 and 0 (that class's defaults).
    """

    examples_dir: str
    depth: int = 4
    width: int = 1 << 20
    seed: int = 0

    name = NAME
    version = VERSION

    def __post_init__(self) -> None:
        _check_sketch_shape(self.depth, self.width)

    def inputs(self, root: str) -> dict:
        manifest = verified_manifest(self.examples_dir, "ExampleGen")
        # The artifact's files by content; where the pipeline root lies does not matter.
        return {"examples": {"component": manifest["component"],
                             "sha256": manifest["outputs"]}}

    def parameters(self) -> dict:
        return {"depth": self.depth, "width": self.width, "seed": self.seed}

    def build(self, root: str, staging: str, run) -> dict:
        manifest = verified_manifest(self.examples_dir, "ExampleGen")
        files = [os.path.join(os.path.abspath(self.examples_dir), rel)
                 for rel in manifest["outputs"] if rel.startswith("examples/")]
        num_items = int(manifest["counts"]["num_items"])
        depth, width, seed = self.depth, self.width, self.seed

        def pipeline(p):
            (p
             | "Files" >> beam.Create(files)
             | "Read" >> beam.io.ReadAllFromTFRecord()
             | "TrainingItems" >> beam.ParDo(TrainingItems())
             | "Count" >> beam.CombineGlobally(ItemCountsFn(num_items, depth, width, seed))
             | "Write" >> beam.Map(write_statistics, staging, depth, width, seed))

        run(pipeline)
        with np.load(os.path.join(staging, FILENAME), allow_pickle=False) as z:
            counts = z["counts"]
        return {"num_items": num_items, "train_interactions": int(counts.sum()),
                "items_seen": int((counts > 0).sum())}


# ------------------------------------------------- synthetic data, counted by chunk

STATISTICS_MODES = ("exact", "count-min")


class ChunkCountsFn(beam.CombineFn):
    """Item counts of synthetic chunks: each input is a chunk index, never one id.

    A chunk's training ids (`synthetic_source.chunk_training_ids`) are counted with
    one ``numpy.bincount``; the items it holds go into the sketch with their counts
    (``depth`` cells each), so a chunk of a million interactions costs a few
    thousand counter updates. The accumulator ``[counts or None, cells, values,
    total]`` keeps the sketch sparse (sorted flat cells and their counts, at most
    ``depth * min(width, num_items + 1)``) and, with ``exact``, the `[num_items + 1]`
    exact counts; merging sums them. ``exact=False`` (count-min only) keeps no
    vector of the catalog's size.
    """

    def __init__(self, spec, depth: int, width: int, seed: int, exact: bool):
        self.spec, self.depth, self.width, self.seed, self.exact = (
            spec, depth, width, seed, exact)

    def setup(self):
        self._a, self._b = hash_coefficients(self.depth, self.seed)
        self._table = ItemTable(self.spec)

    def create_accumulator(self):
        counts = np.zeros(self.spec.num_items + 1, np.int64) if self.exact else None
        return [counts, np.zeros(0, np.int64), np.zeros(0, np.int64), 0]

    def add_input(self, acc, chunk):
        if not hasattr(self, "_table"):
            self.setup()
        ids = chunk_training_ids(self.spec, int(chunk), self._table).reshape(-1)
        counts = np.bincount(ids, minlength=self.spec.num_items + 1)
        seen = np.flatnonzero(counts)
        cells = flat_cells(seen, self._a, self._b, self.width).reshape(-1)
        acc[1], acc[2] = _sum_cells(np.concatenate([acc[1], cells]),
                                    np.concatenate([acc[2], np.tile(counts[seen], self.depth)]))
        if self.exact:
            acc[0] = acc[0] + counts
        acc[3] += len(ids)
        return acc

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        counts = sum(acc[0] for acc in accumulators) if self.exact else None
        cells, values = _sum_cells(np.concatenate([acc[1] for acc in accumulators]),
                                   np.concatenate([acc[2] for acc in accumulators]))
        return [counts, cells, values, sum(acc[3] for acc in accumulators)]

    def extract_output(self, acc):
        sketch = np.zeros(self.depth * self.width, np.int64)
        sketch[acc[1]] = acc[2]
        return {"counts": acc[0], "sketch": sketch.reshape(self.depth, self.width),
                "total": acc[3], "num_items": self.spec.num_items}


def write_chunk_statistics(result: dict, staging: str, depth: int, width: int,
                           seed: int) -> None:
    arrays = {"counts": result["counts"]} if result["counts"] is not None else {}
    np.savez_compressed(os.path.join(staging, FILENAME), sketch=result["sketch"], depth=depth,
                        width=width, seed=seed, total=result["total"],
                        num_items=result["num_items"], **arrays)


@dataclasses.dataclass
class SyntheticStatistics:
    """The Statistics artifact of ``--dataset synthetic``, counted from the spec.

    The chunks are drawn again from the seed (the same ids ExampleGen's records
    hold: `synthetic_source` is a pure function of ``(spec, chunk)``), so the
    elements are chunk indices and no per-interaction element or record exists:
    10^8 interactions cost what drawing them does. ``mode`` ``"count-min"`` (the
    default here) stores only the sketch and the total (`load_log_q` with
    ``estimator="count-min"``); ``"exact"`` also stores the `[num_items + 1]` counts.

    Args:
      spec: `SyntheticSpec`.
      depth, width, seed: int. The sketch, as `Statistics`.
      mode: str. One of `STATISTICS_MODES`. Defaults to ``"count-min"``.
    """

    spec: object
    depth: int = 4
    width: int = 1 << 20
    seed: int = 0
    mode: str = "count-min"

    name = NAME
    version = VERSION

    def __post_init__(self) -> None:
        _check_sketch_shape(self.depth, self.width)
        if self.mode not in STATISTICS_MODES:
            raise ValueError(f"`mode` must be one of {STATISTICS_MODES}, received "
                             f"{self.mode!r}.")

    def inputs(self, root: str) -> dict:
        return {"synthetic": self.spec.as_dict()}

    def parameters(self) -> dict:
        return {"depth": self.depth, "width": self.width, "seed": self.seed, "mode": self.mode}

    def build(self, root: str, staging: str, run) -> dict:
        spec, depth, width, seed = self.spec, self.depth, self.width, self.seed
        exact = self.mode == "exact"

        def pipeline(p):
            (p
             | "Chunks" >> beam.Create(list(range(spec.num_chunks)))
             | "SpreadChunks" >> beam.Reshuffle()
             | "Count" >> beam.CombineGlobally(ChunkCountsFn(spec, depth, width, seed, exact))
             | "Write" >> beam.Map(write_chunk_statistics, staging, depth, width, seed))

        run(pipeline)
        with np.load(os.path.join(staging, FILENAME), allow_pickle=False) as z:
            total = int(z["total"])
            seen = int((z["counts"] > 0).sum()) if "counts" in z.files else None
        return {"num_items": spec.num_items, "train_interactions": total,
                **({"items_seen": seen} if seen is not None else {})}
