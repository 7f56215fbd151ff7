"""A training run's directory: which run it holds, whether it may resume, its lock.

``train`` writes ``config.json`` last when it creates a run, so a directory with
one holds a run; `prepare_run_directory` decides whether ``train`` starts it,
resumes it or refuses (another config, a finished run). `RunLock` keeps a second process out, and
`worker_directory` gives each non-chief worker of a multi-worker cluster its own
state. Free of TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Optional

from tfrs_logq._util import run_directory as _run_directory
from tfrs_logq._util.run_directory import (
    WORKER_PREFIX,
    RunDirectoryError,
    RunLock,
    worker_directory,
)
from tfrs_logq.sasrec.config import TrainConfig

log = logging.getLogger("tfrs_logq.sasrec.training")


# Options that change how fast a run trains, not what it computes.
SPEED_ONLY_FIELDS = ("length_buckets",)
# Options that only check a config before the run (`TrainConfig.validate`): not the run's.
CHECK_ONLY_FIELDS = ("max_tensor_gib",)
# What a run writes once it has trained something: the epochs' record, the best weights,
# the metrics, and anything in ``backup/`` (an epoch's checkpoint, a staged best epoch).
# A directory with a config.json and none of these holds a run that
# stopped before its first epoch ended (a bad flag, an out-of-memory): nothing a retry
# could lose.
PROGRESS_FILES = ("epochs.json", "metrics.json", "best.weights.index", "backup")
# What such a run leaves: replaced or removed when a retry starts in its place.
_UNTRAINED_RUN_FILES = ("config.json", "vocabulary.json", "logs", "backup")


def saved_config(config: TrainConfig, num_items: Optional[int] = None,
                 skipped_lines: int = 0) -> dict:
    """``config.json`` of a run: the config (data_dir made absolute), the catalog size,
    and, when the data file had malformed lines skipped (``--skip-bad-lines``), how many:
    what reloads the run's split skips them again
    (`tfrs_logq.sasrec.training.load_recorded_split`)."""
    saved = config.to_dict()
    for name in ("data_dir", "examples", "log_q", "interactions"):
        if saved[name]:
            saved[name] = os.path.abspath(saved[name])
    if num_items is not None:
        saved["num_items"] = int(num_items)
    if skipped_lines:
        saved["skipped_lines"] = int(skipped_lines)
    return saved



def same_run(config: TrainConfig, model_dir: str) -> Optional[bool]:
    """None if ``model_dir`` holds no run; else whether its ``config.json`` is ``config``."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            existing = json.load(f)
    except (OSError, json.JSONDecodeError):
        return False
    try:
        existing = saved_config(TrainConfig.from_dict(existing))
    except ValueError:
        return False
    requested = saved_config(config)
    for name in SPEED_ONLY_FIELDS + CHECK_ONLY_FIELDS:  # the same run whatever their values
        existing.pop(name, None)
        requested.pop(name, None)
    return existing == requested


def has_progress(model_dir: str) -> bool:
    """Whether the run in ``model_dir`` trained anything (`PROGRESS_FILES`; an empty
    directory among them does not count)."""
    for name in PROGRESS_FILES:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path)):
            return True
    return False


def prepare_run_directory(config: TrainConfig, model_dir: str, overwrite: bool = False) -> str:
    """Decides what ``train`` does with ``model_dir``: ``"new"``, ``"resume"`` (the same
    config, interrupted after at least one epoch) or, with ``overwrite``, clears it first.
    A run that stopped before its first epoch ended (a ``config.json`` and no
    `PROGRESS_FILES`) is cleared and started again, whatever its config.

    Raises:
      RunDirectoryError: the directory holds another run, or this run finished
        (its ``metrics.json`` exists), and ``overwrite`` is False.
    """
    _run_directory.check_not_a_file(model_dir)
    other_workers = (lambda name: name.startswith(WORKER_PREFIX))
    if overwrite:
        # Not other workers' directories: each worker of a multi-worker run clears its own.
        _run_directory.clear(model_dir, keep=other_workers)
    same = same_run(config, model_dir)
    if same is not None and not has_progress(model_dir):
        # Stopped before its first epoch ended: started again, with this config.
        log.info("%s holds a run that stopped before finishing an epoch; starting %s in "
                 "its place", model_dir, "it again" if same else "this config")
        _run_directory.clear(model_dir, _UNTRAINED_RUN_FILES)
        return "new"
    if same is None:
        # A run killed while it was being created holds at most its vocabulary: new.
        _run_directory.check_new(
            model_dir, lambda name: name == "vocabulary.json" or other_workers(name))
        return "new"
    if not same:
        _run_directory.refuse_other_run(model_dir)
    _run_directory.refuse_finished(model_dir)
    return "resume"


def _resumed_speed_fields(config: TrainConfig, model_dir: str) -> TrainConfig:
    """``config`` with the saved run's values of `SPEED_ONLY_FIELDS`: they do not
    change the model, but they change which random draws each step makes (dropout
    is called once per length bucket), so an exact resume keeps the saved ones."""
    with open(os.path.join(model_dir, "config.json")) as f:
        saved = json.load(f)
    changes = {name: saved[name] for name in SPEED_ONLY_FIELDS
               if name in saved and saved[name] != getattr(config, name)}
    for name, value in changes.items():
        log.info("resuming with the run's %s=%s (requested %s), so it resumes exactly",
                 name, value, getattr(config, name))
    return dataclasses.replace(config, **changes) if changes else config


__all__ = ["CHECK_ONLY_FIELDS", "PROGRESS_FILES", "RunDirectoryError", "RunLock",
           "SPEED_ONLY_FIELDS", "WORKER_PREFIX", "has_progress", "prepare_run_directory",
           "same_run", "saved_config", "worker_directory"]
