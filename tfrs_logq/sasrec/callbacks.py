"""The callbacks of a training run (`tfrs_logq.sasrec.training.train`): validation and
windowed test metrics in the epoch logs, the best epoch with early stopping that
survive a resume (`BestEpochKeeper`), and the per-epoch run checkpoint behind an
exact resume (`EpochCheckpoint`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq._util.atomic import atomic_write, write_json
from tfrs_logq.metrics import recall_ndcg_by_band
from tfrs_logq.pipelines.sequential import evaluate
from tfrs_logq.sasrec.config import MONITOR

log = logging.getLogger("tfrs_logq.sasrec.training")


class ValidationCallback(tf.keras.callbacks.Callback):
    """Adds ``val_ndcg@10`` and ``val_recall@10`` to the epoch logs."""

    def __init__(self, model_ref, arrays: dict) -> None:
        super().__init__()
        self._model_ref = model_ref
        self.arrays = arrays

    def on_epoch_end(self, epoch, logs=None):
        metrics = evaluate(self._model_ref.query, self._model_ref.encoder.item_embeddings(),
                           self.arrays, ks=(10,))
        if logs is not None:
            logs["val_ndcg@10"] = metrics["ndcg@10"]
            logs["val_recall@10"] = metrics["recall@10"]


class BestEpochKeeper(tf.keras.callbacks.Callback):
    """Early stopping and the best checkpoint, with state that survives a resume.

    After every epoch it appends the epoch's logs to ``state_path`` (JSON) and, when
    ``monitor`` improved, saves the weights under ``staging_dir`` as
    ``best-EPOCH.weights`` (a prefix of its own per epoch, so a save cut short never
    mixes two epochs' files); it stops training after ``patience`` epochs without
    improvement. The state file is the commit point: it names the best epoch, whose
    staged weights are kept while older ones are removed once the epoch's run
    checkpoint is saved. At the end it restores the best epoch's weights and
    publishes them as ``best_path`` (data shards first, the index last, each
    atomically, from the staged copy, so a kill while publishing is repaired by the
    resumed run, which publishes again). Unlike Keras' `EarlyStopping` +
    `ModelCheckpoint`, whose best value and patience restart when
    `BackupAndRestore` resumes a run, the best value, its epoch and the patience
    count are rebuilt from the saved epochs, so an interrupted and resumed run keeps
    the same best epoch as an uninterrupted one, and ``history`` holds every epoch.
    Epochs are numbered from 1, as Keras prints them ("Epoch 1/80"), in
    ``history``, ``best_epoch``, the state file and the staged names.

    Args:
      state_path: str. JSON file of the run's epochs.
      best_path: str. Weights prefix of the published best epoch (TensorFlow format).
      patience: int. Epochs without improvement before stopping.
      monitor: str. Log key to maximise. Defaults to ``val_ndcg@10``.
      staging_dir: str. Where the best epochs' weights wait until the end. Defaults
        to ``backup/best`` beside ``best_path``.
    """

    def __init__(self, state_path: str, best_path: str, patience: int,
                 monitor: str = MONITOR, staging_dir: Optional[str] = None) -> None:
        super().__init__()
        self.state_path, self.best_path = state_path, best_path
        self.patience, self.monitor = int(patience), monitor
        self.staging_dir = staging_dir or os.path.join(
            os.path.dirname(best_path) or ".", "backup", "best")
        self.history: list = []
        self._started = False

    @property
    def best_epoch(self) -> Optional[int]:
        if not self.history:
            return None
        return max(self.history, key=lambda e: (e[self.monitor], -e["epoch"]))["epoch"]

    def staged_path(self, epoch: int) -> str:
        """Weights prefix of 1-based ``epoch`` while the run trains."""
        return os.path.join(self.staging_dir, f"best-{int(epoch)}.weights")

    def on_train_begin(self, logs=None):
        self._started = False
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.history = json.load(f)["epochs"]

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        if not self._started:
            # Resumed at `epoch`: epochs from it on (if saved before the backup was) rerun.
            self.history = [e for e in self.history if e["epoch"] <= epoch]
            self._started = True
        # Every epoch up to `epoch` is in the run checkpoint: only its best is needed.
        self._prune()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.monitor not in logs:
            raise ValueError(f"`{self.monitor}` missing from the epoch logs: the validation "
                             f"callback must run first.")
        previous_best = self.best_epoch
        previous_value = (None if previous_best is None else
                          next(e[self.monitor] for e in self.history
                               if e["epoch"] == previous_best))
        self.history.append({"epoch": int(epoch) + 1,  # 1-based, as Keras prints it
                             "seconds": round(time.perf_counter() - self._epoch_start, 2),
                             **{k: float(v) for k, v in logs.items()}})
        if previous_value is None or logs[self.monitor] > previous_value:
            os.makedirs(self.staging_dir, exist_ok=True)
            self.model.save_weights(self.staged_path(epoch + 1))
        write_json(self.state_path, {"monitor": self.monitor, "best_epoch": self.best_epoch,
                                       "epochs": self.history})
        if epoch + 1 - self.best_epoch >= self.patience:
            self.model.stop_training = True

    def _prune(self) -> None:
        if not os.path.isdir(self.staging_dir):
            return
        keep = os.path.basename(self.staged_path(self.best_epoch or 0)) + "."
        for name in os.listdir(self.staging_dir):
            if name.startswith("best-") and not name.startswith(keep):
                os.remove(os.path.join(self.staging_dir, name))

    def on_train_end(self, logs=None):
        best = self.best_epoch
        staged = self.staged_path(best) if best is not None else None
        if staged is not None and os.path.exists(staged + ".index"):
            self.model.load_weights(staged)
            _publish_weights(staged, self.best_path)
            self._prune()


def _publish_weights(source: str, destination: str) -> None:
    """Copies the TensorFlow weights files of prefix ``source`` to ``destination``:
    each file atomically, the data shards first and the index last (the index is
    what makes a prefix loadable)."""
    directory = os.path.dirname(source) or "."
    base = os.path.basename(source)
    names = sorted(n for n in os.listdir(directory)
                   if n.startswith(base + ".data-") or n == base + ".index")
    names.sort(key=lambda n: n.endswith(".index"))  # data shards first, the index last
    for name in names:
        with open(os.path.join(directory, name), "rb") as src, \
                atomic_write(destination + name[len(base):], "wb") as dst:
            shutil.copyfileobj(src, dst)


def uses_native_kernels(model) -> bool:
    """Whether any layer of ``model`` has trained with `tfrs_logq.sasrec.native`'s kernels."""
    return any(getattr(m, "_native", None) is True for m in model.submodules)


class EpochCheckpoint(tf.keras.callbacks.Callback):
    """The run's state after every epoch, for an exact resume.

    One `tf.train.CheckpointManager` checkpoint (the last only) in ``directory``
    holding the model (weights and every counter variable its layers and
    objective keep: dropout calls, negative-sampling calls), its optimizer (slots
    and step count), the number of finished epochs and whether the run trained
    with `tfrs_logq.sasrec.native`'s kernels. TensorFlow writes the data and index files
    first and the ``checkpoint`` state file last, so a process killed while saving
    leaves the previous checkpoint in force.

    The kernels matter to exactness: the native dropout draws other masks than
    TensorFlow's ops, so a run resumed on the other path (the compiler gone, or
    ``TFRS_LOGQ_NATIVE`` changed) trains on but cannot end as the uninterrupted run
    would; after the first resumed step it logs a warning saying so, and
    ``kernels_changed`` is True.

    Args:
      directory: str. Where the checkpoints go.
      model: a compiled `tf.keras.Model` whose optimizer is built.
    """

    def __init__(self, directory: str, model) -> None:
        super().__init__()
        self.epochs_done = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_done")
        # 1 when the run trained with the native kernels, else 0.
        self.native_kernels = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="native_kernels")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                               epochs_done=self.epochs_done,
                                               native_kernels=self.native_kernels)
        self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=1)
        self._check_kernels = False
        self.kernels_changed = False

    def restore(self) -> int:
        """Loads the latest checkpoint, if any; returns the number of finished epochs
        it holds (0 when there is none)."""
        path = self._manager.latest_checkpoint
        if path is None:
            return 0
        self._checkpoint.restore(path).assert_existing_objects_matched()
        self._check_kernels = True
        return int(self.epochs_done.numpy())

    def on_train_batch_end(self, batch, logs=None):
        if not self._check_kernels:
            return
        self._check_kernels = False
        saved, now = bool(self.native_kernels.numpy()), uses_native_kernels(self.model)
        if saved != now:
            self.kernels_changed = True
            log.warning(
                "this run trained %s tfrs_logq.sasrec.native's kernels and resumed %s them: it "
                "trains on, but its dropout masks differ from the uninterrupted run's, so it will "
                "not end as that run would (set TFRS_LOGQ_NATIVE=%d to resume on the run's path)",
                "with" if saved else "without", "with" if now else "without", int(saved))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done.assign(epoch + 1)
        self.native_kernels.assign(int(uses_native_kernels(self.model)))
        self._manager.save(checkpoint_number=epoch + 1)


class WindowedTestCallback(tf.keras.callbacks.Callback):
    """Adds ``test_recall@k`` and ``test_ndcg@k`` (all test users, full catalog) to
    the logs of the epochs from ``first_epoch`` on, so a fixed-length run can be
    scored by the mean over its last epochs instead of at an early-stopped one.

    Args:
      model_ref: the `SequentialRetrievalModel`.
      arrays: `evaluation_arrays` of the test part.
      first_epoch: int. 0-based first epoch scored.
      ks: cut-offs. Defaults to ``(10, 20)``.
      target_bands: optional `[m]` popularity band of each test target
        (`tfrs_logq.metrics.popularity_bands`): the same metrics by band are added too,
        as ``test_head_recall@10``, ..., ``test_tail_share`` (no ``:`` in a log name).
    """

    def __init__(self, model_ref, arrays: dict, first_epoch: int, ks=(10, 20),
                 target_bands=None) -> None:
        super().__init__()
        self._model_ref, self.arrays = model_ref, arrays
        self.first_epoch, self.ks = int(first_epoch), tuple(ks)
        self.target_bands = target_bands

    def on_epoch_end(self, epoch, logs=None):
        if epoch < self.first_epoch or logs is None:
            return
        ranks: list = []
        metrics = evaluate(self._model_ref.query, self._model_ref.encoder.item_embeddings(),
                           self.arrays, ks=self.ks, per_target=ranks)
        if self.target_bands is not None:
            by_band = recall_ndcg_by_band(ranks, self.target_bands, self.ks)
            metrics.update({name.replace(":", "_", 1): v for name, v in by_band.items()})
        logs.update({f"test_{name}": value for name, value in metrics.items()})


def windowed_test_metrics(history: list, window: int) -> Optional[dict]:
    """Mean of the ``test_*`` logs over the last ``window`` epochs of ``history``
    (`BestEpochKeeper.history`), with the epochs it covers; None without them."""
    scored = [e for e in history if any(k.startswith("test_") for k in e)][-int(window):]
    if not window or not scored:
        return None
    names = sorted({k[len("test_"):] for e in scored for k in e if k.startswith("test_")})
    return {"epochs": [int(e["epoch"]) for e in scored],
            **{n: float(np.mean([e["test_" + n] for e in scored])) for n in names}}


__all__ = ["BestEpochKeeper", "EpochCheckpoint", "ValidationCallback", "WindowedTestCallback",
           "uses_native_kernels", "windowed_test_metrics"]
