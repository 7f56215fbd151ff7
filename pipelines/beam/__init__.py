"""A TFX-style batch pipeline on plain Apache Beam (importable as ``tfrs_logq.pipelines.beam``).

Components, each writing one artifact (a directory with a ``manifest.json``) under
a pipeline root, skipped on rerun when current, rebuilt when altered:

- `ExampleGen` (``example_gen``): raw interactions -> per-user ``tf.train.Example``
  records of a split + the id vocabulary;
- `Statistics` (``statistics``): exact training item counts and a count-min sketch;
- `Trainer` (``trainer``): ``tfrs-logq train`` on the ExampleGen records and the
  Statistics counts (log Q); the artifact is the model directory;
- `Exporter` (``exporter``): the model as a TF Serving SavedModel (``serving/1``);
- `BulkInferrer` (``bulk_inferrer``): top-k lists of every test target through
  Beam's ``RunInference`` with our `TopKModelHandler`;
- `Evaluator` (``evaluator``): Recall@10/100/1000 and NDCG@20 as a ``CombineFn``,
  overall and sliced, and a blessing;
- `Pusher` (``pusher``): a blessed export into a serving base path as its next version.

Readers, which need no Beam: `read_split` (``examples``), `load_log_q` and
`load_item_statistics` (``item_statistics``), `read_predictions` (``predictions``)
and `load_evaluation` (``evaluation``). `run_pipeline` (``pipeline``) runs the
components in order; ``tfrs-logq pipeline run`` is its command line. Beam runs
locally on `FnApiRunner` with worker processes (``runner``). Names are imported on
first use, so importing this package needs no Beam.
"""

from __future__ import annotations

import importlib

# The raw files ExampleGen reads (`example_gen.FORMATS`): MovieLens's ratings.dat,
# SASRec's "user item" files, a user,item,timestamp CSV, and Steam's reviews.
SOURCE_FORMATS = ("ratings", "sasrec", "csv", "steam")

_EXPORTS = {
    "ArtifactError": "artifacts",
    "BulkInferrer": "bulk_inferrer",
    "COMPONENTS": "pipeline",
    "ComponentResult": "pipeline",
    "Evaluator": "evaluator",
    "ExampleGen": "example_gen",
    "Exporter": "exporter",
    "ItemStatistics": "tfrs_logq.pipelines.item_statistics",
    "METRICS": "evaluation",
    "Pusher": "pusher",
    "Statistics": "statistics",
    "TopKModelHandler": "bulk_inferrer",
    "Trainer": "trainer",
    "load_evaluation": "evaluation",
    "load_item_statistics": "tfrs_logq.pipelines.item_statistics",
    "load_log_q": "tfrs_logq.pipelines.item_statistics",
    "push_version": "pusher",
    "read_predictions": "predictions",
    "read_split": "tfrs_logq.pipelines.examples",  # the readers need no Beam: data layer
    "run_components": "pipeline",
    "run_pipeline": "pipeline",
    "UserLogExampleGen": "user_log_source",
}

__all__ = sorted([*_EXPORTS, "SOURCE_FORMATS"])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"),
                   name)
