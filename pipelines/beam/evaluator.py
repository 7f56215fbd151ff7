"""Evaluator: Recall@k and NDCG@k of the BulkInferrer's lists, overall and sliced, and a blessing.

::

    Evaluator/
      manifest.json         ... and ``blessed`` (true/false) with ``blessing`` (the checks)
      metrics.json          overall and per slice: num_targets, recall@10/100/1000, ndcg@20

The formulas, slices and readers are in `tfrs_logq.pipelines.beam.evaluation`.
Beam steps::

    prediction records --TargetRanks--> ((slice, value), rank of the target) for the
          overall slice, its popularity decile, its history-length bucket and whether
          the user had seen it
      --CombinePerKey(RankMetricsFn)--> the figures per slice: a histogram of ranks
          as the accumulator, summed across workers
      --collect--> metrics.json

**Blessing**: ``blessed`` is true when every overall figure named in
``thresholds`` is at least its threshold, and, given a ``baseline`` Evaluator
artifact of the same test targets, no overall figure is below the baseline's by
more than ``baseline_tolerance``; with neither, the model is blessed (as TFX's
Evaluator without thresholds). Pusher pushes only a blessed model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

import apache_beam as beam
import numpy as np

from tfrs_logq.pipelines.beam.artifacts import ArtifactError, artifact_input, verified_manifest
from tfrs_logq.pipelines.beam.evaluation import (
    HISTORY_BUCKETS,  # noqa: F401  (re-exported)
    METRICS,
    METRICS_FILE,
    NDCG_CUTOFFS,
    RECALL_CUTOFFS,
    SLICES,
    bless,
    describe_blessing,  # noqa: F401  (re-exported)
    history_bucket,
    load_evaluation,
    metrics_from_histogram,
    popularity_deciles,
)
from tfrs_logq.pipelines.beam.predictions import PREDICTIONS_DIR, decode_features
from tfrs_logq.pipelines.examples import example_class
from tfrs_logq.pipelines.item_statistics import FILENAME as STATISTICS_FILE

NAME = "Evaluator"
VERSION = 1


class RankMetricsFn(beam.CombineFn):
    """Ranks (ints; ``>= max_cutoff`` is a miss) -> the `metrics_from_histogram` dict.

    The accumulator is a `[max_cutoff + 1]` int64 histogram; merging sums them."""

    def __init__(self, max_cutoff: int = max(RECALL_CUTOFFS + NDCG_CUTOFFS)):
        if int(max_cutoff) < max(RECALL_CUTOFFS + NDCG_CUTOFFS):
            raise ValueError(f"`max_cutoff` must be at least the largest cut-off "
                             f"({max(RECALL_CUTOFFS + NDCG_CUTOFFS)}), received {max_cutoff}.")
        self.max_cutoff = int(max_cutoff)

    def create_accumulator(self):
        return np.zeros(self.max_cutoff + 1, np.int64)

    def add_input(self, histogram, rank):
        histogram[min(int(rank), self.max_cutoff)] += 1
        return histogram

    def merge_accumulators(self, accumulators):
        return np.sum(list(accumulators), axis=0)

    def extract_output(self, histogram):
        return metrics_from_histogram(histogram)


class TargetRanks(beam.DoFn):
    """A prediction record -> ``((slice, value), rank)`` for every slice it is in."""

    def __init__(self, deciles: np.ndarray, miss: int):
        self.deciles, self.miss = deciles, int(miss)

    def setup(self):
        self._example = example_class()

    def process(self, data: bytes):
        record = decode_features(self._example, data)
        hits = np.flatnonzero(record.get("item_ids", np.zeros(0)) == record["target_id"][0])
        rank = int(hits[0]) if hits.size else self.miss
        yield ("overall", ""), rank
        yield ("popularity_decile", str(int(self.deciles[int(record["target"][0])]))), rank
        yield ("history_length", history_bucket(int(record["history_length"][0]))), rank
        yield ("target_in_history", "yes" if record["target_in_history"][0] else "no"), rank


def write_metrics(results: list, staging: str, miss: int, k: int) -> None:
    """The per-slice figures as ``metrics.json`` (slices in a fixed order)."""
    by_key = dict(results)
    slices = {}
    for name in SLICES:
        values = [v for (kind, v) in by_key if kind == name]
        order = (sorted(values, key=int) if name == "popularity_decile" else
                 sorted(values, key=lambda v: int(v.split("-")[0].rstrip("+")))
                 if name == "history_length" else sorted(values))
        slices[name] = [{"slice": v, **by_key[(name, v)]} for v in order]
    document = {"k": k, "metrics": list(METRICS), "overall": by_key.get(
        ("overall", ""), metrics_from_histogram(np.zeros(miss + 1, np.int64))),
        "slices": slices}
    with open(os.path.join(staging, METRICS_FILE), "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


@dataclasses.dataclass
class Evaluator:
    """Evaluates the BulkInferrer's lists; blesses the model or not.

    Args:
      predictions_dir: str. The BulkInferrer artifact.
      statistics_dir: str. The Statistics artifact (the targets' popularity).
      examples_dir: str. The ExampleGen artifact (which test targets there are).
      thresholds: dict. ``{figure: minimum}`` over `METRICS`, overall. Defaults to none.
      baseline: str. Another Evaluator artifact of the same ExampleGen artifact to
        compare with (say, the pushed model's). Defaults to None.
      baseline_tolerance: float. How far below the baseline a figure may be.
        Defaults to 0.
    """

    predictions_dir: str
    statistics_dir: str
    examples_dir: str
    thresholds: dict = dataclasses.field(default_factory=dict)
    baseline: Optional[str] = None
    baseline_tolerance: float = 0.0

    name = NAME
    version = VERSION
    # Build results that go to the manifest's top level, not its counts.
    OUTCOME_FIELDS = ("blessed", "blessing")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.thresholds) - set(METRICS))
        if unknown:
            raise ValueError(f"thresholds name {unknown}; the figures are {', '.join(METRICS)}.")
        for metric, value in self.thresholds.items():
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"the threshold of {metric} must be in [0, 1], received "
                                 f"{value!r}.")
        if not (math.isfinite(self.baseline_tolerance) and self.baseline_tolerance >= 0):
            raise ValueError(f"`baseline_tolerance` must be >= 0, received "
                             f"{self.baseline_tolerance}.")

    def inputs(self, root: str) -> dict:
        found = {"predictions": artifact_input(self.predictions_dir, "BulkInferrer"),
                 "statistics": artifact_input(self.statistics_dir, "Statistics"),
                 "examples": artifact_input(self.examples_dir, "ExampleGen")}
        if self.baseline:
            found["baseline"] = artifact_input(self.baseline, NAME)
        return found

    def parameters(self) -> dict:
        return {"thresholds": dict(sorted(self.thresholds.items())),
                "baseline_tolerance": self.baseline_tolerance if self.baseline else None,
                "recall_cutoffs": list(RECALL_CUTOFFS), "ndcg_cutoffs": list(NDCG_CUTOFFS)}

    def _baseline_overall(self, examples: dict) -> Optional[dict]:
        if not self.baseline:
            return None
        manifest = verified_manifest(self.baseline, NAME)
        if manifest["inputs"].get("examples") != examples:
            raise ArtifactError(f"the baseline {self.baseline} evaluated other test targets "
                                f"(another ExampleGen artifact than {self.examples_dir}); "
                                "compare evaluations of the same data only.")
        return load_evaluation(self.baseline)["overall"]

    def build(self, root: str, staging: str, run) -> dict:
        predictions = verified_manifest(self.predictions_dir, "BulkInferrer")
        examples = verified_manifest(self.examples_dir, "ExampleGen")
        if predictions["inputs"]["examples"]["sha256"] != examples["outputs"]:
            raise ArtifactError(f"{self.predictions_dir} holds predictions for another "
                                f"ExampleGen artifact than {self.examples_dir}; rerun the "
                                "pipeline.")
        baseline = self._baseline_overall(artifact_input(self.examples_dir, "ExampleGen"))
        k = int(predictions["parameters"]["k"])
        if k < max(RECALL_CUTOFFS + NDCG_CUTOFFS) and k < int(predictions["counts"]["num_items"]):
            raise ValueError(f"the BulkInferrer's lists hold {k} items, fewer than the largest "
                             f"cut-off ({max(RECALL_CUTOFFS + NDCG_CUTOFFS)}); rerun it with a "
                             "larger k.")
        verified_manifest(self.statistics_dir, "Statistics")
        with np.load(os.path.join(self.statistics_dir, STATISTICS_FILE)) as z:
            deciles = popularity_deciles(z["counts"])
        directory = os.path.abspath(self.predictions_dir)
        files = [os.path.join(directory, rel) for rel in predictions["outputs"]
                 if rel.startswith(PREDICTIONS_DIR + "/")]
        miss = max(RECALL_CUTOFFS + NDCG_CUTOFFS)

        def pipeline(p):
            (p
             | "Files" >> beam.Create(files)
             | "Read" >> beam.io.ReadAllFromTFRecord()
             | "Ranks" >> beam.ParDo(TargetRanks(deciles, miss))
             | "Metrics" >> beam.CombinePerKey(RankMetricsFn(miss))
             | "Collect" >> beam.combiners.ToList()
             | "Write" >> beam.Map(write_metrics, staging, miss, k))

        run(pipeline)
        with open(os.path.join(staging, METRICS_FILE)) as f:
            overall = json.load(f)["overall"]
        expected = int(examples["counts"]["test"]["num_targets"])
        if overall["num_targets"] != expected:
            raise ArtifactError(f"{NAME}: {overall['num_targets']} predictions evaluated for "
                                f"{expected} test targets")
        blessing = bless(overall, self.thresholds, baseline, self.baseline_tolerance)
        return {**{m: overall[m] for m in ("num_targets", *METRICS)},
                "blessed": blessing["blessed"], "blessing": blessing}
