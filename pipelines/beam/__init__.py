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
first use, so importing this package needs no Beam. The names are listed in
`tfrs_logq._api` (docs/api.md).
"""

from __future__ import annotations

from tfrs_logq import _api

# The raw files ExampleGen reads (`example_gen.FORMATS`): MovieLens's ratings.dat,
# SASRec's "user item" files, a user,item,timestamp CSV, and Steam's reviews.
SOURCE_FORMATS = ("ratings", "sasrec", "csv", "steam")

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.pipelines.beam",
                                             extra=("SOURCE_FORMATS",))
