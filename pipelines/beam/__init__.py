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

from typing import TYPE_CHECKING

from tfrs_logq import _api

# The raw files ExampleGen reads (`example_gen.FORMATS`): MovieLens's ratings.dat,
# SASRec's "user item" files, a user,item,timestamp CSV, and Steam's reviews.
SOURCE_FORMATS = ("ratings", "sasrec", "csv", "steam")

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.pipelines.beam",
                                             extra=("SOURCE_FORMATS",))

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.pipelines.beam.artifacts import ArtifactError as ArtifactError
    from tfrs_logq.pipelines.beam.bulk_inferrer import BulkInferrer as BulkInferrer
    from tfrs_logq.pipelines.beam.bulk_inferrer import TopKModelHandler as TopKModelHandler
    from tfrs_logq.pipelines.beam.evaluation import METRICS as METRICS
    from tfrs_logq.pipelines.beam.evaluation import load_evaluation as load_evaluation
    from tfrs_logq.pipelines.beam.evaluator import Evaluator as Evaluator
    from tfrs_logq.pipelines.beam.example_gen import ExampleGen as ExampleGen
    from tfrs_logq.pipelines.beam.exporter import Exporter as Exporter
    from tfrs_logq.pipelines.beam.pipeline import COMPONENTS as COMPONENTS
    from tfrs_logq.pipelines.beam.pipeline import ComponentResult as ComponentResult
    from tfrs_logq.pipelines.beam.pipeline import run_components as run_components
    from tfrs_logq.pipelines.beam.pipeline import run_pipeline as run_pipeline
    from tfrs_logq.pipelines.beam.predictions import read_predictions as read_predictions
    from tfrs_logq.pipelines.beam.pusher import Pusher as Pusher
    from tfrs_logq.pipelines.beam.pusher import push_version as push_version
    from tfrs_logq.pipelines.beam.statistics import Statistics as Statistics
    from tfrs_logq.pipelines.beam.trainer import Trainer as Trainer
    from tfrs_logq.pipelines.beam.user_log_source import UserLogExampleGen as UserLogExampleGen
    from tfrs_logq.pipelines.examples import read_split as read_split
    from tfrs_logq.pipelines.item_statistics import ItemStatistics as ItemStatistics
    from tfrs_logq.pipelines.item_statistics import load_item_statistics as load_item_statistics
    from tfrs_logq.pipelines.item_statistics import load_log_q as load_log_q
