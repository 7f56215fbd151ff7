"""The Statistics artifact: training item counts, exact and as a count-min sketch, and log Q.

``Statistics/item_counts.npz`` holds ``counts`` (`[num_items + 1]` int64, exact
counts over the training split; entry 0, padding, is 0), ``sketch`` (`[depth,
width]` int64 count-min counters over the same ids) and the sketch's ``depth``,
``width`` and ``seed``. The sketch hashes with `tfrs_logq.frequency.CountMinSketch`'s
hashes (`tfrs_logq._util.universal_hash`, numpy, no TensorFlow), so its counters equal
that class's after ``update`` with the same ids and the same depth, width and
seed (tested), and `ItemStatistics.count_min_sketch` loads them into one. A
count-min only artifact (``--statistics count-min``, synthetic data) has no
``counts``; it holds ``total`` and ``num_items`` instead.

Training code reads it with `load_log_q` (the `[num_items + 1]` log Q, equal to
``Split.train_log_q()``) or `load_item_statistics` (counts, sketch, and the
`tfrs_logq` estimators built from them). Both verify the artifact against its
manifest first and refuse a damaged one. Nothing here imports Beam.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np

from tfrs_logq._util.universal_hash import flat_cells, hash_coefficients
from tfrs_logq.pipelines.manifest import verified_manifest

FILENAME = "item_counts.npz"
COMPONENT = "Statistics"
ESTIMATORS = ("exact", "count-min")


@dataclasses.dataclass
class ItemStatistics:
    """Training item counts of one split.

    Attributes:
      counts: `[num_items + 1]` int64 exact counts (``Split.train_item_counts()``).
      sketch: `[depth, width]` int64 count-min counters of the same ids.
      depth, width, seed: int. The sketch's shape and hash seed.
    """

    counts: Optional[np.ndarray]
    sketch: np.ndarray
    depth: int
    width: int
    seed: int
    stored_total: Optional[int] = None  # a count-min only artifact's (counts None)
    stored_num_items: Optional[int] = None

    @property
    def num_items(self) -> int:
        if self.counts is None:
            return int(self.stored_num_items)
        return int(len(self.counts) - 1)

    @property
    def total(self) -> int:
        if self.counts is None:
            return int(self.stored_total)
        return int(self.counts.sum())

    def _exact_counts(self) -> np.ndarray:
        if self.counts is None:
            raise ValueError("this Statistics artifact holds only the count-min sketch "
                             "(--statistics count-min); use the count-min estimator.")
        return self.counts

    def log_q(self) -> np.ndarray:
        """`[num_items + 1]` exact ``log Q(d) = log(#d / N)`` (-inf for unseen items)."""
        counts = self._exact_counts().astype(np.float64)
        with np.errstate(divide="ignore"):
            return np.log(counts) - np.log(max(counts.sum(), 1.0))

    def sketch_counts(self, ids=None) -> np.ndarray:
        """Count-min estimates (``min`` over rows; never below the exact count) of
        ``ids`` (default: every id ``0..num_items``)."""
        ids = np.arange(self.num_items + 1) if ids is None else ids
        ids = np.asarray(ids, np.int64).reshape(-1)
        a, b = hash_coefficients(self.depth, self.seed)
        cells = flat_cells(ids, a, b, self.width)
        return self.sketch.reshape(-1)[cells].min(axis=0)

    def sketch_log_q(self, ids=None) -> np.ndarray:
        """``log Q`` from the sketch, as `CountMinSketch.log_q` (an unseen id counts 1)."""
        counts = np.maximum(self.sketch_counts(ids).astype(np.float64), 1.0)
        return np.log(counts) - np.log(max(float(self.total), 1.0))

    def exact_frequency(self, min_count: float = 1.0):
        """A `tfrs_logq.ExactFrequency` over ids ``0..num_items`` from the counts."""
        from tfrs_logq.frequency import ExactFrequency

        return ExactFrequency.from_counts(self._exact_counts(), min_count=min_count)

    def count_min_sketch(self, name: str = "cms"):
        """A `tfrs_logq.CountMinSketch` holding these counters (merge or update it further)."""
        from tfrs_logq.frequency import CountMinSketch

        cms = CountMinSketch(depth=self.depth, width=self.width, seed=self.seed, name=name)
        cms.counters.assign(self.sketch.reshape(-1).astype(np.float64))
        cms.total.assign(float(self.total))
        return cms


def load_item_statistics(artifact_dir: str) -> ItemStatistics:
    """The Statistics artifact in ``artifact_dir`` (``PIPELINE_ROOT/Statistics``).

    Raises:
      ArtifactError: no finished artifact, or its files do not match its manifest.
    """
    verified_manifest(artifact_dir, COMPONENT)
    with np.load(os.path.join(artifact_dir, FILENAME), allow_pickle=False) as z:
        stored = {"stored_total": int(z["total"]), "stored_num_items": int(z["num_items"])} \
            if "total" in z.files else {}
        return ItemStatistics(counts=z["counts"] if "counts" in z.files else None,
                              sketch=z["sketch"], depth=int(z["depth"]),
                              width=int(z["width"]), seed=int(z["seed"]), **stored)


def load_log_q(artifact_dir: str, estimator: str = "exact") -> np.ndarray:
    """`[num_items + 1]` float64 ``log Q(d)`` of the training split, for ids ``0..num_items``.

    Args:
      artifact_dir: str. The Statistics artifact (``PIPELINE_ROOT/Statistics``).
      estimator: str. ``"exact"`` (``log(#d / N)``, -inf for unseen ids, equal to
        ``Split.train_log_q()``) or ``"count-min"`` (the sketch's estimate, as
        `CountMinSketch.log_q`). Defaults to ``"exact"``.

    Raises:
      ValueError: an unknown ``estimator``.
      ArtifactError: no finished artifact, or a damaged one.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"`estimator` must be one of {ESTIMATORS}, received {estimator!r}.")
    stats = load_item_statistics(artifact_dir)
    return stats.log_q() if estimator == "exact" else stats.sketch_log_q()
