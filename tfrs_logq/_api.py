"""The public API, in one table: each package a user imports from, the names it exports and
the module each is imported from (the public module that defines or re-exports it).

A user imports these names from their package (``from tfrs_logq import CorrectedRetrieval``,
``from tfrs_logq.pipelines import load_user_log_split``); the modules behind them, and
every name this table does not list, are the implementation and may change in any release.
Each package's ``__init__`` takes its ``__all__`` and its lazy ``__getattr__`` from here
(`exports`), so ``import tfrs_logq`` and the command line's ``--help`` import no TensorFlow;
docs/api.md lists the same table (tests/test_public_api.py checks both).
"""

from __future__ import annotations

import importlib

PUBLIC: dict[str, dict[str, str]] = {
    "tfrs_logq": {
        # The task and the losses.
        "CorrectedRetrieval": "tfrs_logq.tasks",
        "CORRECTIONS": "tfrs_logq.corrections",
        "sampled_softmax_loss": "tfrs_logq.losses",
        "in_batch_softmax_loss": "tfrs_logq.losses",
        "hard_negative_softmax_loss": "tfrs_logq.losses",
        "full_softmax_loss": "tfrs_logq.losses",
        "gbce_loss": "tfrs_logq.losses",
        "corrected_weight": "tfrs_logq.losses",
        # The proposal: log Q, log Q', inclusion probabilities.
        "excluded_log_q": "tfrs_logq.proposal",
        "inclusion_log_q": "tfrs_logq.proposal",
        "mixture_probability": "tfrs_logq.proposal",
        "log_q_from_probability": "tfrs_logq.proposal",
        # Negatives and frequency estimates.
        "InBatchSampler": "tfrs_logq.sampling",
        "UniformSampler": "tfrs_logq.sampling",
        "MixedSampler": "tfrs_logq.sampling",
        "SampledNegatives": "tfrs_logq.sampling",
        "ExactFrequency": "tfrs_logq.frequency",
        "CountMinSketch": "tfrs_logq.frequency",
        "StreamingFrequency": "tfrs_logq.frequency",
        # The model pieces, the optimizer, metrics and paired statistics.
        "HistoryQueryTower": "tfrs_logq.two_tower",
        "TwoTowerModel": "tfrs_logq.two_tower",
        "LazyAdam": "tfrs_logq.lazy_adam",
        "ranks_from_scores": "tfrs_logq.metrics",
        "recall_ndcg_from_ranks": "tfrs_logq.metrics",
        "popularity_bands": "tfrs_logq.metrics",
        "paired_difference": "tfrs_logq.studies.compare.stats",
        "classify": "tfrs_logq.studies.compare.stats",
        # Your own tfrs.Model, trained with each loss and compared (tfrs-logq compare's).
        "compare_model": "tfrs_logq.studies.compare.model_fn",
    },
    "tfrs_logq.pipelines": {
        "load_user_log": "tfrs_logq.pipelines.user_log",
        "load_user_log_split": "tfrs_logq.pipelines.user_log",
        "UserLogSource": "tfrs_logq.pipelines.user_log",
        "load_dataset": "tfrs_logq.pipelines.datasets",
        "load_split": "tfrs_logq.pipelines.datasets",
        "Split": "tfrs_logq.pipelines.splits",
        "leave_one_out": "tfrs_logq.pipelines.splits",
        "gsasrec_split": "tfrs_logq.pipelines.splits",
        "temporal_split": "tfrs_logq.pipelines.splits",
        "data_stats": "tfrs_logq.pipelines.splits",
        "training_dataset": "tfrs_logq.pipelines.sequential",
        "evaluation_arrays": "tfrs_logq.pipelines.sequential",
        "SyntheticConfig": "tfrs_logq.pipelines.synthetic",
        "SyntheticStream": "tfrs_logq.pipelines.synthetic",
        "Vocabulary": "tfrs_logq.pipelines.vocabulary",
        "save_vocabularies": "tfrs_logq.pipelines.vocabulary",
        "load_vocabularies": "tfrs_logq.pipelines.vocabulary",
        "normalize_id": "tfrs_logq.pipelines.ids",
    },
    "tfrs_logq.pipelines.beam": {
        "ArtifactError": "tfrs_logq.pipelines.beam.artifacts",
        "BulkInferrer": "tfrs_logq.pipelines.beam.bulk_inferrer",
        "COMPONENTS": "tfrs_logq.pipelines.beam.pipeline",
        "ComponentResult": "tfrs_logq.pipelines.beam.pipeline",
        "Evaluator": "tfrs_logq.pipelines.beam.evaluator",
        "ExampleGen": "tfrs_logq.pipelines.beam.example_gen",
        "Exporter": "tfrs_logq.pipelines.beam.exporter",
        "ItemStatistics": "tfrs_logq.pipelines.item_statistics",
        "METRICS": "tfrs_logq.pipelines.beam.evaluation",
        "Pusher": "tfrs_logq.pipelines.beam.pusher",
        "Statistics": "tfrs_logq.pipelines.beam.statistics",
        "TopKModelHandler": "tfrs_logq.pipelines.beam.bulk_inferrer",
        "Trainer": "tfrs_logq.pipelines.beam.trainer",
        "load_evaluation": "tfrs_logq.pipelines.beam.evaluation",
        "load_item_statistics": "tfrs_logq.pipelines.item_statistics",
        "load_log_q": "tfrs_logq.pipelines.item_statistics",
        "push_version": "tfrs_logq.pipelines.beam.pusher",
        "read_predictions": "tfrs_logq.pipelines.beam.predictions",
        "read_split": "tfrs_logq.pipelines.examples",
        "run_components": "tfrs_logq.pipelines.beam.pipeline",
        "run_pipeline": "tfrs_logq.pipelines.beam.pipeline",
        "UserLogExampleGen": "tfrs_logq.pipelines.beam.user_log_source",
    },
    "tfrs_logq.sasrec": {
        "TrainConfig": "tfrs_logq.sasrec.config",
        "resolve_config": "tfrs_logq.sasrec.config",
        "train": "tfrs_logq.sasrec.training",
        "SASRecEncoder": "tfrs_logq.sasrec.models",
        "SequentialRetrievalModel": "tfrs_logq.sasrec.models",
    },
    "tfrs_logq.towers": {
        "TwoTowerConfig": "tfrs_logq.towers.config",
        "train_run": "tfrs_logq.towers.run",
        "load_run": "tfrs_logq.towers.run",
    },
    "tfrs_logq.serving": {
        "export_version": "tfrs_logq.serving.export",
        "load_trained": "tfrs_logq.serving.export",
        "load_run_split": "tfrs_logq.serving.export",
        "ModelServer": "tfrs_logq.serving.server",
        "ServerOptions": "tfrs_logq.serving.options",
        "make_request": "tfrs_logq.serving.client",
        "ranks_through_server": "tfrs_logq.serving.client",
        "evaluate_through_server": "tfrs_logq.serving.evaluation",
    },
    "tfrs_logq.studies": {
        "run_compare": "tfrs_logq.studies.compare.builtin",
        "Plan": "tfrs_logq.studies.compare.plan",
        "load_plan": "tfrs_logq.studies.compare.plan",
        "run_demo": "tfrs_logq.studies.demo",
        "DemoConfig": "tfrs_logq.studies.demo",
    },
}


def exports(package: str, extra: tuple = ()):
    """``(__all__, __getattr__, __dir__)`` for ``package``: its names of `PUBLIC`, each
    imported from its module on first use (PEP 562); ``extra``: names the package defines
    itself (``__version__``)."""
    table = PUBLIC[package]

    def __getattr__(name: str):
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        if not name.startswith("__"):  # a submodule, as after ``import package.name``
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(table) | set(extra))

    return sorted([*table, *extra]), __getattr__, __dir__


__all__ = ["PUBLIC", "exports"]
