"""A two-tower training run in a directory (``tfrs-logq train two-tower``).

One run of `tfrs_logq.towers.training.train` on a split, its state and results in
``model_dir``, laid out as a SASRec run's where export and evaluation read it:

- ``config.json``: ``{"model": "two-tower", "two_tower": {TwoTowerConfig fields},
  "num_items", "max_length"}`` and the data fields the caller gives (which data, which
  split: what reloads the split), written last when a run is created;
- ``vocabulary.json``: ``{"raw_items": [...]}``, the log's own id of internal item
  ``i + 1`` at ``i``, so an export answers in the log's ids;
- ``checkpoint/``: the step checkpoint (a killed run goes on from it and ends exactly
  as an uninterrupted one); ``evaluations.json``: the test evaluations so far;
- ``final.weights.*``: the trained towers, and ``metrics.json``: the last evaluation,
  both written when the run has finished (``metrics.json`` last);
- ``logs/``: TensorBoard's event files, as SASRec's run writes them: ``logs/train`` the
  training loss, steps per second and learning rate at each evaluation's step,
  ``logs/test`` the test metrics (``recall@k``, ``ndcg@k``, by popularity band too); a
  resumed run appends the evaluations it makes, so no step is written twice
  (``tensorboard --logdir MODEL_DIR``).

A directory holding another run, or this run finished, is refused unless
``overwrite``; a second process training into it is refused at once (its lock).

On a multi-worker cluster (``strategy="multi-worker"``, ``TF_CONFIG``) every worker is
given the same ``model_dir`` (a filesystem they share): the chief writes the run there, as
one process would; every other worker locks ``model_dir/worker-TYPE-INDEX``, restores
from the chief's checkpoint, saves its own beside it while training and removes its folder
when the run has finished, so the directory holds one model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tfrs_logq._util import run_directory as _run_directory
from tfrs_logq._util.atomic import write_json
from tfrs_logq._util.board import EventBoard
from tfrs_logq._util.run_directory import WORKER_PREFIX, RunDirectoryError, RunLock
from tfrs_logq._util.strategy import check_tf_config, is_chief
from tfrs_logq._util.tracking import Tracking
from tfrs_logq.pipelines.splits import Split
from tfrs_logq.pipelines.vocabulary import RUN_ITEMS_FILE, read_run_items, write_run_items
from tfrs_logq.towers import training
from tfrs_logq.towers.config import TwoTowerConfig
from tfrs_logq.towers.loop import build_model
from tfrs_logq.two_tower import TwoTowerModel

MODEL_KIND = "two-tower"
WEIGHTS = "final.weights"


def is_two_tower_run(model_dir: str) -> bool:
    """Whether ``model_dir``'s ``config.json`` is a two-tower run's."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            return json.load(f).get("model") == MODEL_KIND
    except (OSError, ValueError, AttributeError):
        return False


def run_record(config: TwoTowerConfig, num_items: int, data: dict) -> dict:
    """``config.json`` of a run of ``config`` on a catalog of ``num_items`` items."""
    return {**data, "model": MODEL_KIND, "two_tower": dataclasses.asdict(config),
            "num_items": int(num_items), "max_length": int(config.history_length)}


def _prepare(model_dir: str, record: dict, overwrite: bool) -> str:
    """``"new"`` or ``"resume"`` (see the module docstring), clearing the directory
    first with ``overwrite``."""
    if overwrite:  # a cluster's other workers keep their folders
        _run_directory.clear(model_dir, keep=lambda name: name.startswith(WORKER_PREFIX))
    config_path = os.path.join(model_dir, _run_directory.CONFIG)
    if not os.path.exists(config_path):
        # config.json is written last: without it, at most a vocabulary and temporaries.
        _run_directory.check_new(model_dir, lambda name: name == RUN_ITEMS_FILE
                                 or name.startswith(WORKER_PREFIX))
        return "new"
    try:
        with open(config_path) as f:
            existing = json.load(f)
    except (OSError, ValueError):
        existing = None
    if existing != json.loads(json.dumps(record)):
        _run_directory.refuse_other_run(
            model_dir, "a SASRec run" if isinstance(existing, dict) and "model" not in existing
            else "a run with another config")
    _run_directory.refuse_finished(model_dir)
    return "resume"


def train_run(config: TwoTowerConfig, split: Split, model_dir: str, data: dict,
              overwrite: bool = False, on_eval: Optional[Callable[[dict], None]] = None,
              on_step: Optional[Callable[[int], None]] = None,
              checkpoint_seconds: float = 120.0,
              examples: Optional[training.Examples] = None,
              tracking: Optional[Tracking] = None) -> dict:
    """Trains (or resumes) the run of ``config`` on ``split`` in ``model_dir``; returns
    its last evaluation (`tfrs_logq.towers.training.train`) with ``"evaluations"``, every
    evaluation of the run, added. ``data``: the data fields recorded in ``config.json``
    (``"weight_column"`` among them when ``split`` has weights). ``examples``: the split's
    `tfrs_logq.towers.training.Examples`, when the caller built them (and so checked the
    weights) before the directory is touched. ``tracking``: the run is also an MLflow run
    (`tfrs_logq._util.tracking`): its config as params, every evaluation's metrics, its
    config.json and metrics.json as artifacts.

    Raises:
      RunDirectoryError: the directory holds another run or this one finished (and not
        ``overwrite``), or another process is training into it.
    """
    _run_directory.check_not_a_file(model_dir)
    if config.strategy == "multi-worker":
        check_tf_config()  # one line before any work
    if examples is None:
        examples = training.Examples(split, config.history_length)
    training.check_trainable(config, split, examples)  # before the directory is made
    if config.strategy == "multi-worker" and not is_chief():
        return _train_worker(config, split, model_dir, on_step, checkpoint_seconds, examples)
    os.makedirs(model_dir, exist_ok=True)
    with RunLock(model_dir):
        record = run_record(config, split.num_items, data)
        if _prepare(model_dir, record, overwrite) == "new":
            write_run_items(model_dir, split.interactions.raw_items)
            write_json(os.path.join(model_dir, "config.json"), record)  # last: a run
        evaluations_path = os.path.join(model_dir, "evaluations.json")
        evaluations = []
        if os.path.exists(evaluations_path):
            with open(evaluations_path) as f:
                evaluations = json.load(f)

        board = EventBoard(os.path.join(model_dir, "logs"), config.learning_rate)
        tracked = None if tracking is None else tracking.start(
            os.path.basename(os.path.abspath(model_dir)), record,
            tags={"tfrs_logq.model_dir": os.path.abspath(model_dir)})

        def evaluated(row: dict) -> None:
            evaluations[:] = [r for r in evaluations if r["steps"] != row["steps"]] + [row]
            write_json(evaluations_path, evaluations)
            board.write(row)  # after evaluations.json: a kill between loses, never repeats
            if tracked is not None:
                tracking.evaluation(tracked, row)
            if on_eval is not None:
                on_eval(row)

        def save(model: TwoTowerModel) -> None:
            tf.train.Checkpoint(query_tower=model.query_tower,
                                item_tower=model.item_tower).write(
                os.path.join(model_dir, WEIGHTS))

        try:
            last = training.train(config, split,
                                  checkpoint_dir=os.path.join(model_dir, "checkpoint"),
                                  on_eval=evaluated, done=tuple(r["steps"] for r in evaluations),
                                  on_step=on_step, on_trained=save, examples=examples,
                                  checkpoint_seconds=checkpoint_seconds)
        except BaseException as exc:
            if tracked is not None:
                tracking.end(tracked, "KILLED" if isinstance(exc, KeyboardInterrupt)
                             else "FAILED")
            raise
        write_json(os.path.join(model_dir, "metrics.json"), last)  # last: finished
        if tracked is not None:
            tracking.artifacts(tracked, [os.path.join(model_dir, name)
                                         for name in ("config.json", "metrics.json")])
            tracking.end(tracked)
        return {**last, "evaluations": evaluations}


def _train_worker(config, split, model_dir, on_step, checkpoint_seconds, examples) -> dict:
    """A non-chief worker's share of a multi-worker run (the module docstring)."""
    own = _run_directory.worker_directory(model_dir, "multi-worker")
    os.makedirs(own, exist_ok=True)
    with RunLock(own):
        # Its saves are never read (it restores from the chief's): a folder left by another
        # run or code would refuse them.
        _run_directory.clear(own)
        last = training.train(config, split, checkpoint_dir=os.path.join(model_dir, "checkpoint"),
                              on_step=on_step, examples=examples,
                              checkpoint_seconds=checkpoint_seconds,
                              worker_checkpoint_dir=os.path.join(own, "checkpoint"))
    shutil.rmtree(own, ignore_errors=True)  # its state: the chief's holds the run
    return {**last, "evaluations": []}


class TowerEncoder(tf.Module):
    """A trained two-tower model as export and evaluation read an encoder:
    ``max_length``, ``last_query(history)`` (``[batch, max_length]`` internal ids,
    right-aligned, 0 padding) and ``item_embeddings()`` (``[V + 1, d]``, row 0 padding)."""

    def __init__(self, model: TwoTowerModel, history_length: int) -> None:
        super().__init__(name="two_tower")
        self.model = model
        self.max_length = int(history_length)

    def last_query(self, history, training: bool = False) -> tf.Tensor:
        del training  # no dropout
        return self.model.query_tower(tf.cast(history, tf.int64))

    def item_embeddings(self) -> tf.Tensor:
        return self.model.item_embeddings()


def load_run(model_dir: str) -> tuple[TowerEncoder, dict, np.ndarray]:
    """The trained towers of a finished run, its ``config.json`` and its item vocabulary
    (the raw id of internal item ``i + 1`` at ``i``: int64 when every id is an integer).

    Raises:
      FileNotFoundError: the run has not finished (no ``final.weights``).
    """
    with open(os.path.join(model_dir, "config.json")) as f:
        record = json.load(f)
    config = TwoTowerConfig(**record["two_tower"])
    weights = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(weights + ".index"):
        raise FileNotFoundError(f"{model_dir} has no {WEIGHTS}: the run has not finished; "
                                "run the same `tfrs-logq train` again to finish it.")
    model = build_model(training.run_spec(config, int(record["num_items"])))
    tf.train.Checkpoint(query_tower=model.query_tower, item_tower=model.item_tower).read(
        weights).assert_existing_objects_matched().expect_partial()
    return TowerEncoder(model, config.history_length), record, read_run_items(model_dir)


__all__ = ["MODEL_KIND", "RunDirectoryError", "TowerEncoder", "is_two_tower_run", "load_run",
           "run_record", "train_run"]
