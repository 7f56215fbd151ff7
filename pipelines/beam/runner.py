"""Running a Beam pipeline here: Beam's portable `FnApiRunner` with worker processes.

Always ``direct_running_mode="multi_processing"`` with ``direct_num_workers``
worker processes (default 2): Beam's default runner (Prism) downloads a binary,
which these machines cannot; the Dask runner is not used.

The code a worker runs (the DoFns of `example_gen` and `statistics`, the parsers
and split functions of `tfrs_logq.pipelines`) is shipped to the workers *by value*
(cloudpickle's ``register_pickle_by_value``), not as references to import, so a
worker imports only numpy, protobuf and Beam whatever the package's modules
import at the top (`item_statistics` imports `tfrs_logq.frequency`, hence
TensorFlow: about 10 s per worker process and pipeline on two busy cores, more
than the whole ML-1M job). Worker code must refer to functions, classes and
constants, never to ``tfrs_logq`` module objects (a module is always pickled by
reference).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Callable, Iterator, Optional

RUNNERS = ("FnApiRunner",)
DEFAULT_NUM_WORKERS = 2

# Modules whose functions and classes run in Beam workers (shipped by value).
WORKER_MODULES = (
    "tfrs_logq.pipelines.interactions",
    "tfrs_logq.pipelines.splits",
    "tfrs_logq.pipelines.datasets",
    "tfrs_logq.pipelines.beam.examples",
    "tfrs_logq.pipelines.beam.item_statistics",
    "tfrs_logq.pipelines.beam.example_gen",
    "tfrs_logq.pipelines.beam.statistics",
    "tfrs_logq.pipelines.beam.predictions",
    "tfrs_logq.pipelines.beam.evaluation",
    "tfrs_logq.pipelines.beam.exporter",
    "tfrs_logq.pipelines.beam.bulk_inferrer",
    "tfrs_logq.pipelines.beam.evaluator",
)


@contextlib.contextmanager
def code_by_value() -> Iterator[None]:
    """Within the block, Beam pickles `WORKER_MODULES`' code by value."""
    from apache_beam.internal.cloudpickle import cloudpickle

    registered = []
    try:
        for name in WORKER_MODULES:
            module = importlib.import_module(name)
            if name not in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.register_pickle_by_value(module)
                registered.append(module)
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def pipeline_options(num_workers: int = DEFAULT_NUM_WORKERS):
    """Options of a local run: ``num_workers`` worker processes, workers' logs at
    WARNING (their INFO lines would drown the command's output)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(
        flags=[],  # not sys.argv: the command's own flags are not Beam's
        direct_running_mode="multi_processing",
        direct_num_workers=int(num_workers),
        default_sdk_harness_log_level="WARNING",
    )


@contextlib.contextmanager
def _stderr_to(path: Optional[str]) -> Iterator[None]:
    """Sends this process's file descriptor 2, which the worker processes inherit,
    to ``path`` for the block (their start-up and progress logs)."""
    if path is None:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log_file:
            os.dup2(log_file.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def run(build: Callable, runner: str = "FnApiRunner",
        num_workers: int = DEFAULT_NUM_WORKERS, log_path: Optional[str] = None) -> None:
    """Builds a pipeline with ``build(pipeline)`` and runs it to completion.

    Args:
      build: callable. Adds the transforms to the pipeline it is given.
      runner: str. One of `RUNNERS`. Defaults to ``"FnApiRunner"``.
      num_workers: int. Worker processes. Defaults to 2.
      log_path: str. Where Beam's and the workers' logs go (appended); None leaves
        them on stderr. Defaults to None.

    Raises:
      ValueError: an unknown ``runner``.
    """
    if runner not in RUNNERS:
        raise ValueError(f"--runner must be one of {', '.join(RUNNERS)}, received {runner!r} "
                         "(Beam's default Prism runner downloads a binary; runs here use the "
                         "local FnApiRunner with worker processes).")
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    with _stderr_to(log_path), code_by_value():
        pipeline = beam.Pipeline(runner=FnApiRunner(), options=pipeline_options(num_workers))
        build(pipeline)
        pipeline.run().wait_until_finish()
