"""The batch pipeline: components run in order under one pipeline root, skipped when current.

::

    data file ──> ExampleGen ──> ROOT/ExampleGen/   examples/*.tfrecord, vocabulary/
                                      │
                                      └──> Statistics ──> ROOT/Statistics/   item_counts.npz

A component is a small object with ``name``, ``version``, ``inputs(root)``,
``parameters()`` and ``build(root, staging, run)``. `run_component` skips it
when its artifact is current (`artifacts.stale_reason`: same inputs and
parameters, every file verifies), and otherwise builds it into a staging
directory, writes the manifest and publishes it (`artifacts.publish`).
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
                  num_workers: int = 2, force: bool = False) -> ComponentResult:
    """Builds ``component``'s artifact under ``root`` unless it is current."""
    from tfrs_logq.pipelines.beam.runner import run

    directory = os.path.join(root, component.name)
    start = time.perf_counter()
    inputs, parameters = component.inputs(root), component.parameters()
    reason = "--force" if force else artifacts.stale_reason(
        directory, component.name, component.version, inputs, parameters)
    if reason is None:
        manifest = artifacts.read_manifest(directory)
        return ComponentResult(component.name, "skipped", "current", directory,
                               time.perf_counter() - start, manifest)
    log.info("%s: running (%s)", component.name, reason)
    with artifacts.staging_directory(root, component.name) as staging:
        log_path = os.path.join(root, LOGS, f"{component.name}.log")
        counts = component.build(root, staging, functools.partial(
            run, runner=runner, num_workers=num_workers, log_path=log_path))
        seconds = time.perf_counter() - start
        manifest = artifacts.write_manifest(staging, {
            "component": component.name, "version": component.version, "inputs": inputs,
            "parameters": parameters, "counts": counts,
            "beam": {"runner": runner, "direct_running_mode": "multi_processing",
                     "direct_num_workers": num_workers},
            "wall_seconds": round(seconds, 2)})
        artifacts.publish(staging, directory)
    return ComponentResult(component.name, "ran", reason, directory, seconds, manifest)


def run_components(components: Sequence, root: str, runner: str = "FnApiRunner",
                   num_workers: int = 2, force: bool = False) -> list[ComponentResult]:
    """Runs components in order (each may read the artifacts of those before it),
    holding the root's lock; stale ``.tmp-*`` directories of dead runs are removed."""
    results = []
    with artifacts.locked(root):
        for name in artifacts.remove_stale(root):
            log.info("removed %s, left by a run that did not finish", os.path.join(root, name))
        for component in components:
            made = component(root) if callable(component) and not hasattr(component, "build") \
                else component
            results.append(run_component(made, root, runner, num_workers, force))
    return results


def run_pipeline(root: str, input_path: str, data_format: str, *, split: str = "gsasrec",
                 dataset: str = "", skip_bad_lines: bool = False,
                 temporal_fraction: Optional[float] = None, num_shards: int = 4,
                 sketch_depth: int = 4, sketch_width: int = 1 << 20, sketch_seed: int = 0,
                 runner: str = "FnApiRunner", num_workers: int = 2, force: bool = False,
                 **example_gen_options) -> list[ComponentResult]:
    """ExampleGen then Statistics under ``root``; see `ExampleGen` and `Statistics`
    for the arguments. Returns one `ComponentResult` per component."""
    from tfrs_logq.pipelines.beam.example_gen import ExampleGen
    from tfrs_logq.pipelines.beam.statistics import Statistics

    example_gen = ExampleGen(input_path, data_format, split=split, dataset=dataset,
                             skip_bad_lines=skip_bad_lines, temporal_fraction=temporal_fraction,
                             num_shards=num_shards, **example_gen_options)
    # Statistics reads ExampleGen's artifact, so it is made once that exists.
    statistics = lambda root: Statistics(os.path.join(root, ExampleGen.name),  # noqa: E731
                                         depth=sketch_depth, width=sketch_width,
                                         seed=sketch_seed)
    return run_components([example_gen, statistics], root, runner, num_workers, force)
