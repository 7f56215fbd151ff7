"""`StepCheckpoint`: a custom training loop's state every few minutes, for an exact resume.

`EpochCheckpoint` (`tfrs_logq.sasrec.callbacks`) does this for `model.fit` at epoch ends;
a loop that runs thousands of steps with no epochs (the two-tower trainer's) needs it by
time instead. One `tf.train.CheckpointManager` checkpoint (the last only) holds
the objects given (a model, an optimizer: anything trackable) and the number of
finished steps. TensorFlow writes the data and index files first and the
``checkpoint`` state file last, so a process killed while saving leaves the
previous checkpoint in force.

The loop must be a function of the state and the step index (stateless batches
and random ops keyed by the step, as the two-tower loop's are): then a run resumed from
step ``s`` ends bit for bit as the uninterrupted run would.

``key`` names what the directory's state belongs to (``key.txt``, written before
the first save): the run's configuration and the code that trains it
(`source_fingerprint`). A directory whose key.txt names another key is refused
both ways: restoring from it and saving into it raise.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from typing import Optional

import tensorflow as tf

from tfrs_logq._util.atomic import write_text
from tfrs_logq._util.fingerprint import file_fingerprint


@functools.lru_cache(maxsize=None)
def source_fingerprint(*directories: str) -> str:
    """A digest of every ``.py`` and ``.cc`` file under ``directories`` (paths and
    contents): a state saved by other code does not resume."""
    digest = hashlib.sha256()
    for directory in directories:
        for parent, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            for name in sorted(files):
                if name.endswith((".py", ".cc")):
                    path = os.path.join(parent, name)
                    digest.update(f"{os.path.relpath(path, directory)}\0"
                                  f"{file_fingerprint(path)}\0".encode())
    return digest.hexdigest()[:16]


def key_difference(saved: str, expected: str) -> str:
    """The first ``|``-separated field where two keys differ, for an error message."""
    for a, b in zip(saved.split("|"), expected.split("|")):
        if a != b:
            return f"{a!r} where this run has {b!r}"
    return f"{saved[:60]!r}... where this run has {expected[:60]!r}..."


class StepCheckpoint:
    """Saves ``objects`` and the step count at most every ``every_seconds``.

    Args:
      directory: str. Where the checkpoint goes (created on the first save).
      key: str. What the state belongs to (see the module docstring).
      every_seconds: float. The least time between two saves; 0 saves after every
        step. Defaults to 120.
      **objects: the trackable objects to save (their variables must exist before
        `restore`, e.g. an optimizer already built).

    ``seconds_saving`` adds up the time spent saving, for a loop that times its steps.
    """

    KEY_FILE = "key.txt"

    def __init__(self, directory: str, key: str, every_seconds: float = 120.0,
                 **objects) -> None:
        if not every_seconds >= 0:
            raise ValueError(f"`every_seconds` must be >= 0, received {every_seconds!r}.")
        self.directory, self.key, self.every_seconds = directory, key, float(every_seconds)
        self.steps_done = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")
        self._checkpoint = tf.train.Checkpoint(steps_done=self.steps_done, **objects)
        self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=1)
        self._last_save = time.monotonic()
        self.seconds_saving = 0.0

    def _check_key(self, missing_ok: bool, directory: Optional[str] = None) -> None:
        directory = self.directory if directory is None else directory
        path = os.path.join(directory, self.KEY_FILE)
        if not os.path.exists(path):
            if missing_ok:
                return
            raise ValueError(f"{directory} holds a checkpoint but no {self.KEY_FILE}, so "
                             "whose state it is is unknown; remove the directory to start "
                             "the run from step 0.")
        with open(path) as f:
            saved = f.read()
        if saved != self.key:
            raise ValueError(f"{directory} belongs to another run or code: its "
                             f"{self.KEY_FILE} has {key_difference(saved, self.key)}; remove "
                             "the directory to start this run from step 0.")

    def restore(self, directory: Optional[str] = None) -> int:
        """Loads the latest checkpoint, if any; returns the finished steps it holds (0 when
        there is none). ``directory``: read it from there instead (a multi-worker run's
        workers read the chief's; they save beside it). Defaults to this one's.

        Raises:
          ValueError: the directory holds another key's state, or a state with no key.
        """
        directory = self.directory if directory is None else directory
        path = (self._manager.latest_checkpoint if directory == self.directory
                else tf.train.latest_checkpoint(directory))
        if path is None:
            return 0
        self._check_key(missing_ok=False, directory=directory)
        self._checkpoint.restore(path).assert_existing_objects_matched()
        self._last_save = time.monotonic()
        return int(self.steps_done.numpy())

    def due(self) -> bool:
        """Whether ``every_seconds`` have passed since the last save."""
        return time.monotonic() - self._last_save >= self.every_seconds

    def step_done(self, steps_done: int) -> bool:
        """Call after every step with the number of finished steps; saves when
        ``every_seconds`` have passed since the last save. Returns whether it saved."""
        if not self.due():
            return False
        self.save(steps_done)
        return True

    def save(self, steps_done: int) -> None:
        """Saves now.

        Raises:
          ValueError: the directory's key.txt names another key.
        """
        start = time.monotonic()
        os.makedirs(self.directory, exist_ok=True)
        self._check_key(missing_ok=True)
        key_path = os.path.join(self.directory, self.KEY_FILE)
        if not os.path.exists(key_path):
            write_text(key_path, self.key)
        self.steps_done.assign(steps_done)
        self._manager.save(checkpoint_number=steps_done)
        self._last_save = time.monotonic()
        self.seconds_saving += self._last_save - start


__all__ = ["StepCheckpoint", "key_difference", "source_fingerprint"]
