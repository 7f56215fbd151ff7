"""The batch pipeline: components run in order under one pipeline root, skipped when current.

::

    file, log ──> ExampleGen ──> ROOT/ExampleGen/     examples/*.tfrecord, vocabulary/
                      │
                      ├──> Statistics ──> ROOT/Statistics/     item_counts.npz
                      │         │
                      └─────────┴──> Trainer ──> ROOT/Trainer/     a `tfrs-logq train` model dir
                                                   │
                                  Exporter <───────┘   ROOT/Exporter/serving/1   SavedModel
                                     │
          ExampleGen ──> BulkInferrer (RunInference) ──> ROOT/BulkInferrer/   predictions/*.tfrecord
                                     │
          Statistics ──> Evaluator (CombineFn) ──> ROOT/Evaluator/   metrics.json; blessed
                                     │
                                  Pusher ──> SERVING_BASE/VERSION (blessed only); ROOT/Pusher/

A component is a small object with ``name``, ``version``, ``inputs(root)``,
``parameters()`` and ``build(root, staging, run)`` (and optionally
``stale_reason(manifest)``, ``OUTCOME_FIELDS`` for top-level manifest entries,
``USES_BEAM = False``). `run_component` skips it when its artifact is current
(`artifacts.stale_reason`: same inputs and parameters, every file verifies), and
otherwise builds it into a staging directory, writes the manifest and publishes it
(`artifacts.publish`). Inputs name upstream artifacts by the sha256 of their files,
so a component is rerun exactly when something it reads changed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Optional, Sequence

from tfrs_logq.pipelines.beam import artifacts

log = logging.getLogger("tfrs_logq.pipeline")
LOGS = ".logs"  # ROOT/.logs/COMPONENT.log: Beam's and its workers' logs of the last runs


@dataclasses.dataclass
class ComponentResult:
    """What happened to one component: ``status`` is ``"ran"`` or ``"skipped"``;
    ``reason`` says why it ran (or ``"current"``)."""

    name: str
    status: str
    reason: str
    directory: str
    seconds: float
    manifest: dict

    def line(self) -> str:
        if self.status == "skipped":
            return f"{self.name}: skipped (current: {self.directory})"
        return f"{self.name}: ran in {self.seconds:.1f} s ({self.reason}) -> {self.directory}"


def run_component(component, root: str, runner: str = "FnApiRunner",
                  num_workers: int = 2, force: bool = False,
                  beam_args=()) -> ComponentResult:
    """Builds ``component``'s artifact under ``root`` unless it is current."""
    from tfrs_logq.pipelines.beam.runner import run

    directory = os.path.join(root, component.name)
    start = time.perf_counter()
    inputs, parameters = component.inputs(root), component.parameters()
    reason = "--force" if force else artifacts.stale_reason(
        directory, component.name, component.version, inputs, parameters)
    if reason is None and hasattr(component, "stale_reason"):  # a check of its own
        reason = component.stale_reason(artifacts.read_manifest(directory))
    if reason is None:
        manifest = artifacts.read_manifest(directory)
        return ComponentResult(component.name, "skipped", "current", directory,
                               time.perf_counter() - start, manifest)
    log.info("%s: running (%s)", component.name, reason)
    with artifacts.staging_directory(root, component.name) as staging:
        log_path = os.path.join(root, LOGS, f"{component.name}.log")
        counts = component.build(root, staging, functools.partial(
            run, runner=runner, num_workers=num_workers, log_path=log_path,
            beam_args=tuple(beam_args)))
        seconds = time.perf_counter() - start
        outcome = {name: counts.pop(name) for name in getattr(component, "OUTCOME_FIELDS", ())}
        manifest = artifacts.write_manifest(staging, {
            "component": component.name, "version": component.version, "inputs": inputs,
            "parameters": parameters, **outcome, "counts": counts,
            **({"beam": _beam_entry(runner, num_workers, beam_args)}
               if getattr(component, "USES_BEAM", True) else {}),
            "wall_seconds": round(seconds, 2)})
        artifacts.publish(staging, directory)
    return ComponentResult(component.name, "ran", reason, directory, seconds, manifest)


def _beam_entry(runner: str, num_workers: int, beam_args) -> dict:
    if runner == "FnApiRunner":
        entry = {"runner": runner, "direct_running_mode": "multi_processing",
                 "direct_num_workers": num_workers}
    else:
        entry = {"runner": runner}
    return {**entry, **({"options": list(beam_args)} if beam_args else {})}


def run_components(components: Sequence, root: str, runner: str = "FnApiRunner",
                   num_workers: int = 2, force: bool = False,
                   beam_args=()) -> list[ComponentResult]:
    """Runs components in order (each may read the artifacts of those before it),
    holding the root's lock; stale ``.tmp-*`` directories of dead runs are removed.

    A run that fails before any component finished (bad data refused by the first
    ExampleGen, say) leaves ``root`` as it found it: what it made there (the root itself
    on a first run, ``.lock``, ``.logs``) is removed (`artifacts.locked`'s ``undo``)."""
    results: list[ComponentResult] = []
    with artifacts.locked(root, undo=lambda: not results):
        for name in artifacts.remove_stale(root):
            log.info("removed %s, left by a run that did not finish", os.path.join(root, name))
        for component in components:
            made = component(root) if callable(component) and not hasattr(component, "build") \
                else component
            results.append(run_component(made, root, runner, num_workers, force, beam_args))
    return results


COMPONENTS = ("ExampleGen", "Statistics", "Trainer", "Exporter", "BulkInferrer", "Evaluator",
              "Pusher")


def run_pipeline(root: str, input_path: Optional[str] = None,
                 data_format: Optional[str] = None, *, split: Optional[str] = None,
                 dataset: str = "", skip_bad_lines: bool = False,
                 temporal_fraction: Optional[float] = None, num_shards: int = 4,
                 sketch_depth: int = 4, sketch_width: int = 1 << 20, sketch_seed: int = 0,
                 preset: Optional[str] = "smoke", train_options: Optional[dict] = None,
                 index: str = "auto", top_k: int = 1000, thresholds: Optional[dict] = None,
                 baseline: Optional[str] = None, baseline_tolerance: float = 0.0,
                 serving_base_path: Optional[str] = None, stop_after: str = "Pusher",
                 runner: str = "FnApiRunner", num_workers: int = 2, force: bool = False,
                 train_verbose=0, beam_args=(), force_local_root: bool = False,
                 synthetic=None, user_log=None, statistics_mode: Optional[str] = None,
                 **example_gen_options) -> list[ComponentResult]:
    """The components in order under ``root``, up to and including ``stop_after``;
    Pusher only with a ``serving_base_path``. See each component for its arguments:
    `ExampleGen`, `Statistics` (``sketch_*``), `Trainer` (``preset``,
    ``train_options``: `TrainConfig` fields such as ``loss`` and ``seed``),
    `Exporter` (``index``), `BulkInferrer` (``top_k``), `Evaluator` (``thresholds``,
    ``baseline``, ``baseline_tolerance``), `Pusher`. Returns one `ComponentResult` per
    component run or skipped.

    The data is one of: a file, ``input_path`` in ``data_format`` (`ExampleGen`;
    ``split`` defaults to ``"gsasrec"``); ``user_log``, a `UserLogSource` (a user's
    own log: `UserLogExampleGen`, whose ``skip_bad_lines`` and ``max_bad_share`` are
    the source's; ``dataset`` names the log; ``split`` defaults to ``"temporal"`` with
    the source's ``time_column``, else ``"loo"``); or ``synthetic``, a
    `SyntheticSpec` (`SyntheticExampleGen` and `SyntheticStatistics`, whose
    ``statistics_mode`` defaults to ``"count-min"``; such runs stop after Statistics;
    the split is leave-one-out). ``statistics_mode`` ``"count-min"`` needs
    ``synthetic``. ``example_gen_options`` go to the ExampleGen (say,
    ``min_item_interactions``, or a log's ``min_user_interactions`` and
    ``deduplicate``).

    ``runner`` and ``beam_args`` (Beam's flags) are checked first (`runner.check_runner`;
    ``force_local_root`` accepts a local root with a non-local runner).

    Raises:
      ValueError: an unknown ``stop_after``, no data or two, a runner missing an
        option, ...
      ImportError: ``index`` ``"scann"`` or ``"faiss"`` where it cannot load (one line,
        before any component runs).
    """
    from tfrs_logq.pipelines.beam.example_gen import ExampleGen, SyntheticExampleGen
    from tfrs_logq.pipelines.beam.runner import check_runner

    if stop_after not in COMPONENTS:
        raise ValueError(f"`stop_after` must be one of {COMPONENTS}, received {stop_after!r}.")
    if synthetic is not None and user_log is not None:
        raise ValueError("`synthetic` draws the data and `user_log` reads it: give one.")
    if user_log is not None and (input_path or data_format):
        raise ValueError("`user_log` and `input_path` both name the data: give one.")
    if synthetic is None and user_log is None and not (input_path and data_format):
        raise ValueError("no data: give `input_path` and `data_format`, `user_log` or "
                         "`synthetic`.")
    if user_log is not None:
        data_path = ("--interactions", str(user_log.path))
    else:
        data_path = ("the data file", None if synthetic else input_path)
    check_runner(runner, beam_args, {"--pipeline-root": root, data_path[0]: data_path[1]},
                 force_local_root=force_local_root)
    if statistics_mode not in (None, "exact") and synthetic is None:
        raise ValueError("--statistics count-min counts synthetic chunks; a file's "
                         "Statistics are exact (with the sketch beside them).")
    if synthetic is not None:
        if COMPONENTS.index(stop_after) > COMPONENTS.index("Statistics"):
            raise ValueError("--dataset synthetic runs ExampleGen and Statistics; add "
                             "--stop-after Statistics (or ExampleGen).")
        example_gen = SyntheticExampleGen(synthetic, num_shards=num_shards)
    elif user_log is not None:
        from tfrs_logq.pipelines.beam.user_log_source import UserLogExampleGen

        if skip_bad_lines and not user_log.skip_bad_lines:
            raise ValueError("`skip_bad_lines` of a user's log is the `UserLogSource`'s: "
                             "give UserLogSource(..., skip_bad_lines=True).")
        example_gen = UserLogExampleGen(
            user_log, split or ("temporal" if user_log.time_column else "loo"),
            dataset=dataset, temporal_fraction=temporal_fraction, num_shards=num_shards,
            **example_gen_options)
    else:
        example_gen = ExampleGen(input_path, data_format, split=split or "gsasrec",
                                 dataset=dataset, skip_bad_lines=skip_bad_lines,
                                 temporal_fraction=temporal_fraction, num_shards=num_shards,
                                 **example_gen_options)
    at = lambda root, name: os.path.join(root, name)  # noqa: E731

    # Each later component reads the artifacts before it, so it is made once they exist.
    def statistics(root):
        from tfrs_logq.pipelines.beam.statistics import Statistics, SyntheticStatistics

        if synthetic is not None:
            return SyntheticStatistics(synthetic, depth=sketch_depth, width=sketch_width,
                                       seed=sketch_seed, mode=statistics_mode or "count-min")
        return Statistics(at(root, "ExampleGen"), depth=sketch_depth, width=sketch_width,
                          seed=sketch_seed)

    def trainer(root):
        from tfrs_logq.pipelines.beam.trainer import Trainer

        return Trainer(at(root, "ExampleGen"), at(root, "Statistics"), preset=preset,
                       overrides=dict(train_options or {}), verbose=train_verbose)

    def exporter(root):
        from tfrs_logq.pipelines.beam.exporter import Exporter

        return Exporter(at(root, "Trainer"), index=index)

    def bulk_inferrer(root):
        from tfrs_logq.pipelines.beam.bulk_inferrer import BulkInferrer

        return BulkInferrer(at(root, "ExampleGen"), at(root, "Exporter"), k=top_k)

    def evaluator(root):
        from tfrs_logq.pipelines.beam.evaluator import Evaluator

        return Evaluator(at(root, "BulkInferrer"), at(root, "Statistics"),
                         at(root, "ExampleGen"), thresholds=dict(thresholds or {}),
                         baseline=baseline, baseline_tolerance=baseline_tolerance)

    def pusher(root):
        from tfrs_logq.pipelines.beam.pusher import Pusher

        return Pusher(at(root, "Exporter"), at(root, "Evaluator"), serving_base_path)

    # Arguments are checked before any component runs (a typo fails in a second, not
    # after training).
    if thresholds or baseline:
        from tfrs_logq.pipelines.beam.evaluator import Evaluator

        Evaluator("", "", "", thresholds=dict(thresholds or {}), baseline=baseline,
                  baseline_tolerance=baseline_tolerance)
    from tfrs_logq.pipelines.beam.exporter import Exporter
    from tfrs_logq.sasrec.config import resolve_config

    resolve_config(preset, **dict(train_options or {}))
    Exporter("", index=index)
    if COMPONENTS.index(stop_after) >= COMPONENTS.index("Exporter"):
        from tfrs_logq.serving.indexes import check_index_loads

        check_index_loads(index)
    components = [example_gen, statistics, trainer, exporter, bulk_inferrer, evaluator]
    if serving_base_path:
        components.append(pusher)
    components = components[:COMPONENTS.index(stop_after) + 1]
    return run_components(components, root, runner, num_workers, force, beam_args)
