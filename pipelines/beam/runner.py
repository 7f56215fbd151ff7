"""Running a Beam pipeline here: Beam's portable `FnApiRunner` with worker processes.

Always ``direct_running_mode="multi_processing"`` with ``direct_num_workers``
worker processes (default 2): Beam's default runner (Prism) downloads a binary,
which these machines cannot; the Dask runner is not used.

The code a worker runs (the DoFns of `example_gen` and `statistics`, the parsers
and split functions of `tfrs_logq.pipelines`) is shipped to the workers *by value*
(cloudpickle's ``register_pickle_by_value``), not as references to import, so a
worker imports only numpy, protobuf and Beam whatever the package's modules
import (importing ``tfrs_logq.frequency``, hence TensorFlow, costs about 10 s per
worker process and pipeline on two busy cores, more than the whole ML-1M job). Worker code
must refer to functions, classes and constants, never to ``tfrs_logq`` module objects (a
module is always pickled by reference).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Callable, Iterator, Optional

RUNNERS = ("FnApiRunner", "PortableRunner", "FlinkRunner", "SparkRunner", "DataflowRunner")
LOCAL_RUNNER = "FnApiRunner"
DEFAULT_NUM_WORKERS = 2
# Filesystems every worker of a cluster can mount at the same path (/proc/mounts types).
SHARED_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "fuse.gcsfuse", "lustre", "gpfs",
                      "ceph", "glusterfs", "fuse.glusterfs", "beegfs", "fuse.juicefs",
                      "fuse.s3fs", "fuse.mountpoint-s3")

# Modules whose functions and classes run in Beam workers (shipped by value).
# The user-log source's modules are not here: its workers emit `user_log.RawLog` elements,
# and a class pickled by value is not the class the runner unpickles them into ("not the
# same object"); a cluster's workers import them from the installed package.
WORKER_MODULES = (
    "tfrs_logq.metrics",  # Recall/NDCG of the Evaluator (its functions use numpy only)
    "tfrs_logq._util.universal_hash",  # the count-min sketch's hashes (numpy)
    "tfrs_logq.pipelines.interactions",
    "tfrs_logq.pipelines.splits",
    "tfrs_logq.pipelines.datasets",
    "tfrs_logq.pipelines.examples",
    "tfrs_logq.pipelines.beam.synthetic_source",
    "tfrs_logq.pipelines.item_statistics",
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


def pipeline_options(num_workers: int = DEFAULT_NUM_WORKERS, runner: str = LOCAL_RUNNER,
                     beam_args=()):
    """The run's `PipelineOptions`: ``beam_args`` (Beam's own flags, the command's
    arguments after ``--``), and for the local runner ``num_workers`` worker
    processes with their logs at WARNING (their INFO lines would drown the
    command's output)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    if runner == LOCAL_RUNNER:
        return PipelineOptions(
            flags=list(beam_args),  # not sys.argv: the command's own flags are not Beam's
            direct_running_mode="multi_processing",
            direct_num_workers=int(num_workers),
            default_sdk_harness_log_level="WARNING")
    return PipelineOptions(flags=list(beam_args), runner=runner)


def _filesystem_type(path: str) -> str:
    """The type (``/proc/mounts``) of the filesystem holding ``path``; ``""`` unknown."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return ""
    return kind


def check_runner(runner: str, beam_args=(), paths: dict = None,
                 force_local_root: bool = False):
    """Checks, before anything runs, that ``runner`` has what it needs; returns the
    `PipelineOptions`. Nothing is contacted (no network).

    - ``PortableRunner``: ``--job_endpoint``;
    - ``FlinkRunner``: ``--flink_master`` (host:port of a Flink cluster) or
      ``--job_endpoint`` (a running Flink job server);
    - ``SparkRunner``: ``--spark_master_url`` (spark://host:port) or ``--job_endpoint``;
    - ``DataflowRunner``: ``--project``, ``--region``, ``--temp_location`` (gs://) and
      ``--sdk_container_image`` (workers need this project's code and TensorFlow);
    - every non-local runner: ``paths`` (``{"--pipeline-root": DIR, "--interactions": PATH}``)
      must lie on a filesystem all workers mount at the same path (NFS, GCS FUSE, ...,
      `SHARED_FILESYSTEMS`), or ``force_local_root`` says they do: components write
      their artifacts with POSIX file operations, from the workers.

    Raises:
      ValueError: an unknown runner, an unknown Beam flag, or a missing option, in
        one line naming it.
    """
    if runner not in RUNNERS:
        raise ValueError(f"--runner must be one of {', '.join(RUNNERS)}, received {runner!r} "
                         "(Beam's default Prism runner downloads a binary).")
    options = pipeline_options(runner=runner, beam_args=beam_args)
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True))
                     - set(options.get_all_options()))
    if unknown:
        raise ValueError(f"unknown Beam pipeline option(s) after --: "
                         f"{', '.join('--' + u for u in unknown)}")
    if runner == LOCAL_RUNNER:
        return options
    given = {k: v for k, v in options.get_all_options(drop_default=True).items()}
    missing = None
    if runner == "PortableRunner" and not given.get("job_endpoint"):
        missing = "--job_endpoint HOST:PORT (a Beam job server)"
    elif runner == "FlinkRunner" and not (given.get("flink_master") or given.get("job_endpoint")):
        missing = ("--flink_master HOST:PORT (a Flink cluster's REST endpoint) or "
                   "--job_endpoint HOST:PORT (a running Flink job server)")
    elif runner == "SparkRunner" and not (given.get("spark_master_url")
                                          or given.get("job_endpoint")):
        missing = ("--spark_master_url spark://HOST:PORT or --job_endpoint HOST:PORT "
                   "(a running Spark job server)")
    elif runner == "DataflowRunner":
        for name, what in (("project", "PROJECT"), ("region", "REGION"),
                           ("temp_location", "gs://BUCKET/tmp"),
                           ("sdk_container_image", "IMAGE (TensorFlow, scann and tfrs-logq "
                                                   "installed)")):
            if not given.get(name):
                missing = f"--{name} {what}"
                break
        temp = given.get("temp_location") or ""
        if missing is None and not temp.startswith("gs://"):
            raise ValueError(f"DataflowRunner: --temp_location must be a gs:// path, received "
                             f"{temp!r}.")
    if missing:
        raise ValueError(f"{runner} needs {missing} after -- (tfrs-logq pipeline run ... "
                         f"--runner {runner} -- {missing.split(' ')[0]} ...).")
    for flag, path in (paths or {}).items():
        if path is None:
            continue
        if "://" in str(path):
            raise ValueError(f"{flag} {path}: artifacts are written with POSIX file "
                             "operations; mount the bucket (GCS FUSE, NFS) at the same path "
                             "on every worker and give that path.")
        kind = _filesystem_type(os.path.dirname(os.path.abspath(path)) or "/")
        if kind not in SHARED_FILESYSTEMS and not force_local_root:
            raise ValueError(f"{flag} {path} is on a local filesystem ({kind or 'unknown'}), "
                             f"which {runner}'s workers cannot reach; use a path every "
                             "worker mounts (NFS, GCS FUSE), or --force-local-root if it is "
                             "mounted at the same path everywhere.")
    return options


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


def run(build: Callable, runner: str = LOCAL_RUNNER,
        num_workers: int = DEFAULT_NUM_WORKERS, log_path: Optional[str] = None,
        beam_args=()) -> None:
    """Builds a pipeline with ``build(pipeline)`` and runs it to completion.

    Args:
      build: callable. Adds the transforms to the pipeline it is given.
      runner: str. One of `RUNNERS`. Defaults to ``"FnApiRunner"`` (local, worker
        processes); the others run where ``beam_args`` point (`check_runner`).
      num_workers: int. Worker processes of the local runner. Defaults to 2.
      log_path: str. Where Beam's and the workers' logs go (appended); None leaves
        them on stderr. Defaults to None.
      beam_args: Beam's own flags (``--project P``, ``--job_endpoint H:P``, ...).

    Raises:
      ValueError: an unknown ``runner``, or one missing an option (`check_runner`).
    """
    import apache_beam as beam

    options = check_runner(runner, beam_args)
    if runner == LOCAL_RUNNER:
        options = pipeline_options(num_workers, runner, beam_args)
    with _stderr_to(log_path), code_by_value():
        if runner == LOCAL_RUNNER:
            from apache_beam.runners.portability.fn_api_runner import FnApiRunner

            pipeline = beam.Pipeline(runner=FnApiRunner(), options=options)
        else:
            pipeline = beam.Pipeline(options=options)
        build(pipeline)
        pipeline.run().wait_until_finish()
