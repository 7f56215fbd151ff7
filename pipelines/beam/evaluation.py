"""Retrieval figures of ranks, the slices, and the blessing: the Evaluator's formulas, without Beam.

The target's 0-based ``rank`` is its position in its list (``k``, a miss, when it
is not there), and over ``n`` targets

    Recall@k = #{rank < k} / n,    NDCG@k = sum_{rank < k} 1 / log2(rank + 2) / n

(one target per query, so the ideal DCG is 1). Example: ranks ``[0, 3, miss]`` give
Recall@10 = 2/3 and NDCG@20 = (1 + 1/log2 5) / 3 = 0.4769. The figures are computed
from a histogram of the ranks below the largest cut-off (`metrics_from_histogram`,
through `tfrs_logq.metrics.recall_ndcg_from_histogram`, the library's one
implementation), which the Evaluator's ``CombineFn`` builds; integers, so partial
histograms merge exactly in any order.

Slices: ``popularity_decile`` ``0``..``9`` of the target by training count (0 =
the 10% most popular items, ties by item index; as ``tfrs-logq diagnose``),
``history_length`` buckets (`HISTORY_BUCKETS`), and ``target_in_history``.

`load_evaluation` reads an Evaluator artifact: ``metrics.json`` with the
manifest's ``blessed`` and ``blessing``.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from tfrs_logq.metrics import popularity_deciles as item_popularity_deciles
from tfrs_logq.metrics import recall_ndcg_from_histogram
from tfrs_logq.pipelines.beam.artifacts import verified_manifest

COMPONENT = "Evaluator"
METRICS_FILE = "metrics.json"
RECALL_CUTOFFS = (10, 100, 1000)
NDCG_CUTOFFS = (20,)
METRICS = tuple(f"recall@{k}" for k in RECALL_CUTOFFS) + tuple(f"ndcg@{k}" for k in NDCG_CUTOFFS)
# History-length buckets (inclusive upper bounds): 0-5, 6-10, ..., 101-200, 201+.
HISTORY_BUCKETS = (5, 10, 20, 50, 100, 200)
SLICES = ("popularity_decile", "history_length", "target_in_history")


def history_bucket(length: int) -> str:
    """The bucket of a history length: ``"0-5"``, ``"6-10"``, ..., ``"201+"``."""
    low = 0
    for high in HISTORY_BUCKETS:
        if length <= high:
            return f"{low}-{high}"
        low = high + 1
    return f"{low}+"


def popularity_deciles(counts: np.ndarray) -> np.ndarray:
    """`[num_items + 1]` int: the popularity decile of each item by its training count
    (`tfrs_logq.metrics.popularity_deciles`: 0 = the 10% most trained-on items, ties by
    index); entry 0, padding, is -1."""
    return np.concatenate([[-1], item_popularity_deciles(np.asarray(counts[1:], np.int64))])


def metrics_from_histogram(histogram: np.ndarray) -> dict:
    """Figures from a rank histogram (`[max_cutoff + 1]`: bins 0..max_cutoff-1 count
    those ranks, the last bin the misses)."""
    histogram = np.asarray(histogram, np.int64)
    if len(histogram) <= max(RECALL_CUTOFFS + NDCG_CUTOFFS):
        raise ValueError(f"the histogram must have more than {max(RECALL_CUTOFFS + NDCG_CUTOFFS)} "
                         f"bins (ranks below the largest cut-off, then misses), received "
                         f"{len(histogram)}.")
    return recall_ndcg_from_histogram(histogram, RECALL_CUTOFFS, NDCG_CUTOFFS)


def load_evaluation(artifact_dir: str) -> dict:
    """``metrics.json`` of an Evaluator artifact, with ``blessed`` and ``blessing`` from
    its manifest.

    Raises:
      ArtifactError: no finished artifact, or a damaged one.
    """
    manifest = verified_manifest(artifact_dir, COMPONENT)
    with open(os.path.join(artifact_dir, METRICS_FILE)) as f:
        document = json.load(f)
    return {**document, "blessed": manifest["blessed"], "blessing": manifest["blessing"]}


def bless(overall: dict, thresholds: dict, baseline: Optional[dict] = None,
          tolerance: float = 0.0) -> dict:
    """``{"blessed", "checks"}``: each check names a figure, its value, and what it
    was held to (``threshold``, or ``baseline`` minus ``tolerance``)."""
    checks = []
    for metric, threshold in sorted(thresholds.items()):
        checks.append({"metric": metric, "value": overall[metric], "threshold": threshold,
                       "passed": bool(overall[metric] >= threshold)})
    if baseline is not None:
        for metric in METRICS:
            floor = baseline[metric] - tolerance
            checks.append({"metric": metric, "value": overall[metric],
                           "baseline": baseline[metric], "tolerance": tolerance,
                           "passed": bool(overall[metric] >= floor - 1e-12)})
    return {"blessed": all(c["passed"] for c in checks), "checks": checks}


def describe_blessing(blessing: dict) -> str:
    """One line: why a model is blessed or not."""
    failed = [c for c in blessing["checks"] if not c["passed"]]
    if not blessing["checks"]:
        return "blessed (no thresholds or baseline given)"
    if not failed:
        return f"blessed ({len(blessing['checks'])} checks passed)"
    parts = [f"{c['metric']} {c['value']:.4f} < "
             + (f"threshold {c['threshold']:g}" if "threshold" in c else
                f"baseline {c['baseline']:.4f} - {c['tolerance']:g}") for c in failed]
    return "not blessed: " + ", ".join(parts)
