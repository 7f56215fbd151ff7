"""`StepCheckpoint`: a custom training loop's state every few minutes, for an exact resume.

`EpochCheckpoint` (`tfrs_logq.callbacks`) does this for `model.fit` at epoch ends;
a loop that runs thousands of steps with no epochs (`tfrs-logq study`) needs it by
time instead. One `tf.train.CheckpointManager` checkpoint (the last only) holds
the objects given (a model, an optimizer: anything trackable) and the number of
finished steps. TensorFlow writes the data and index files first and the
``checkpoint`` state file last, so a process killed while saving leaves the
previous checkpoint in force.

The loop must be a function of the state and the step index (stateless batches
and random ops keyed by the step, as the study's are): then a run resumed from
step ``s`` ends bit for bit as the uninterrupted run would.

``key`` names the run the directory belongs to (``key.txt``, written before the
first save); restoring a directory written for another key raises, so a changed
configuration never resumes from a stale state.
"""

from __future__ import annotations

import os
import time

import tensorflow as tf

from tfrs_logq.atomic import write_text


class StepCheckpoint:
    """Saves ``objects`` and the step count at most every ``every_seconds``.

    Args:
      directory: str. Where the checkpoint goes (created on the first save).
      key: str. What run this is (see the module docstring).
      every_seconds: float. The least time between two saves; 0 saves after every
        step. Defaults to 120.
      **objects: the trackable objects to save (their variables must exist before
        `restore`, e.g. an optimizer already built).
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

    def restore(self) -> int:
        """Loads the latest checkpoint, if any; returns the finished steps it holds (0 when
        there is none).

        Raises:
          ValueError: the directory holds another run's checkpoint.
        """
        path = self._manager.latest_checkpoint
        if path is None:
            return 0
        key_path = os.path.join(self.directory, self.KEY_FILE)
        saved = open(key_path).read() if os.path.exists(key_path) else None
        if saved != self.key:
            raise ValueError(f"{self.directory} holds a checkpoint of another run "
                             f"(key.txt {saved!r:.80}, expected {self.key!r:.80}); remove it "
                             "to start this run from step 0.")
        self._checkpoint.restore(path).assert_existing_objects_matched()
        self._last_save = time.monotonic()
        return int(self.steps_done.numpy())

    def step_done(self, steps_done: int) -> bool:
        """Call after every step with the number of finished steps; saves when
        ``every_seconds`` have passed since the last save. Returns whether it saved."""
        if time.monotonic() - self._last_save < self.every_seconds:
            return False
        self.save(steps_done)
        return True

    def save(self, steps_done: int) -> None:
        os.makedirs(self.directory, exist_ok=True)
        key_path = os.path.join(self.directory, self.KEY_FILE)
        if not os.path.exists(key_path):
            write_text(key_path, self.key)
        self.steps_done.assign(steps_done)
        self._manager.save(checkpoint_number=steps_done)
        self._last_save = time.monotonic()


__all__ = ["StepCheckpoint"]
