"""SASRec training stopped and resumed: an interruption, SIGKILL mid-epoch and after the
last epoch, the early-stopping state across a resume, and a resume on the other kernel path
(the rest of training: test_training.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from smoke_config import smoke_config

from tfrs_logq.sasrec.training import train


def test_interrupted_training_resumes_from_its_backup(data_dir, tmp_path, caplog):
    import logging

    import tensorflow as tf

    class Interrupt(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt

    seen = []

    class Record(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append(epoch)

    # No early stop (patience 10): the epochs run are the resume's alone.
    config = smoke_config(loss="inbatch-corrected", data_dir=data_dir, max_epochs=4,
                          patience=10, steps_per_epoch=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, str(tmp_path / "m"), verbose=0, extra_callbacks=[Interrupt()])
    assert (tmp_path / "m" / "backup").exists()
    with caplog.at_level(logging.WARNING, logger="tfrs_logq.sasrec.training"):
        result = train(config, str(tmp_path / "m"), verbose=0, extra_callbacks=[Record()])
    # Epoch 0 finished and is not run again; epoch 1 was interrupted before its end
    # was recorded, so it is the one epoch lost.
    assert seen == [1, 2, 3]
    # Resumed on the kernel path it trained on: no warning, nothing recorded about it
    # (test_a_resume_on_the_other_kernel_path_says_it_cannot_be_exact has the other).
    assert not [r for r in caplog.records if "kernels" in r.getMessage()]
    assert "native_kernels_changed_on_resume" not in result


class _ScriptedValidation:
    """Replaces val_ndcg@10 with a scripted sequence (so the best epoch is known)."""

    def __new__(cls, values, interrupt_after=None):
        import tensorflow as tf

        class Scripted(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                logs["val_ndcg@10"] = values[epoch]
                if interrupt_after is not None and epoch == interrupt_after:
                    raise KeyboardInterrupt

        return Scripted()


def test_resume_keeps_best_epoch_patience_and_counts(data_dir, tmp_path):
    """kill -> resume gives the same best epoch, stop epoch and epoch count as an
    uninterrupted run (Keras' EarlyStopping/ModelCheckpoint would restart their
    best value and patience on resume and save epoch 3 as the best)."""
    values = [0.1, 0.5, 0.2, 0.3, 0.25, 0.9, 0.95]  # best: epoch 2; patience 3 stops after 5
    config = smoke_config(loss="inbatch-none", data_dir=data_dir,
                          max_epochs=7, patience=3, steps_per_epoch=2)
    whole = train(config, str(tmp_path / "whole"), verbose=0,
                  extra_callbacks=[_ScriptedValidation(values)])
    assert whole["best_epoch"] == 2 and whole["epochs"] == 5  # 1-based, as Keras prints
    # Killed at the end of the 4th epoch (Keras index 3), before it was recorded, then resumed.
    interrupted = str(tmp_path / "interrupted")
    with pytest.raises(KeyboardInterrupt):
        train(config, interrupted, verbose=0,
              extra_callbacks=[_ScriptedValidation(values, interrupt_after=3)])
    resumed = train(config, interrupted, verbose=0,
                    extra_callbacks=[_ScriptedValidation(values)])
    for key in ("best_epoch", "epochs", "steps", "validation_curve"):
        assert resumed[key] == whole[key], key
    assert resumed["validation_curve"] == values[:5]
    saved = json.loads((tmp_path / "interrupted" / "metrics.json").read_text())
    assert saved["epochs"] == 5


KILLED_RUN = r"""
import os, signal, sys
import tfrs_logq
import tensorflow as tf
from tfrs_logq.sasrec.training import TrainConfig, train

class Kill(tf.keras.callbacks.Callback):
    # SIGKILL in the middle of epoch 2 (0-based), after epochs 0 and 1 were saved.
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 2 and batch == 1:
            os.kill(os.getpid(), signal.SIGKILL)

config = TrainConfig(**__import__("json").loads(sys.argv[1]))
train(config, sys.argv[2], verbose=0, extra_callbacks=[Kill()])
"""


def _checkpoint_values(prefix):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    # Every saved tensor but the object graph (a proto that names the layers, which
    # differ between processes).
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def test_run_killed_mid_epoch_resumes_exactly_as_the_uninterrupted_run(data_dir, tmp_path,
                                                                       caplog):
    """Real training, every random source on (shuffled batches that cross epoch
    boundaries, dropout, uniform and in-batch negatives): SIGKILL in epoch 2, resume,
    and the validation curve, training losses, best epoch, test metrics and every
    weight and optimizer slot equal the uninterrupted run's, to the bit."""
    import dataclasses
    import logging

    config = smoke_config(loss="mns-corrected", data_dir=data_dir,
                          max_epochs=4, patience=10, steps_per_epoch=3, batch_size=8,
                          dropout=0.3, test_window=2)
    whole = train(config, str(tmp_path / "whole"), verbose=0)
    killed = str(tmp_path / "killed")
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN,
                           json.dumps(dataclasses.asdict(config)), killed],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-3000:]
    saved = json.loads((tmp_path / "killed" / "epochs.json").read_text())["epochs"]
    assert [e["epoch"] for e in saved] == [1, 2]
    with caplog.at_level(logging.INFO, logger="tfrs_logq.sasrec.training"):
        resumed = train(config, killed, verbose=0)
    assert any("resuming" in r.getMessage() and "from epoch 3 of 4" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    for key in ("validation_curve", "best_epoch", "epochs", "steps", "validation", "test",
                "test_window"):
        assert resumed[key] == whole[key], key
    # Training losses of every epoch (Keras' logs), not only the validation metric.
    histories = [[{k: v for k, v in e.items() if k != "seconds"} for e in
                  json.loads((tmp_path / d / "epochs.json").read_text())["epochs"]]
                 for d in ("whole", "killed")]
    assert histories[0] == histories[1]
    # Every weight, optimizer slot and random counter of the last checkpoint.
    final = [_checkpoint_values(str(tmp_path / d / "backup" / "ckpt-4"))
             for d in ("whole", "killed")]
    assert final[0].keys() == final[1].keys()
    assert any("calls" in name for name in final[0])  # the dropout and sampling counters
    for name in final[0]:
        np.testing.assert_array_equal(final[0][name], final[1][name], err_msg=name)


def test_a_run_killed_after_its_last_epoch_says_it_has_nothing_left_to_train(data_dir, tmp_path,
                                                                              caplog):
    # It read "resuming runs/B from epoch 5 of 4".
    import logging

    config = smoke_config(loss="inbatch-none", data_dir=data_dir,
                          max_epochs=2, steps_per_epoch=2)
    whole = train(config, str(tmp_path / "m"), verbose=0)
    (tmp_path / "m" / "metrics.json").unlink()  # killed after the last epoch was saved
    with caplog.at_level(logging.INFO, logger="tfrs_logq.sasrec.training"):
        again = train(config, str(tmp_path / "m"), verbose=0)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("resuming" in m for m in messages), messages
    assert any("trained 2 of 2 epochs before it stopped" in m and "nothing left to train" in m
               for m in messages), messages
    assert again["epochs"] == whole["epochs"] == 2
    assert again["best_epoch"] == whole["best_epoch"]


def test_a_resume_on_the_other_kernel_path_says_it_cannot_be_exact(data_dir, tmp_path,
                                                                   monkeypatch, caplog):
    """The checkpoint records whether the run trained with the native kernels; a run
    resumed on the other path (their dropout masks differ) trains on, warns once and
    says so in its metrics. (One resumed on its own path does neither:
    test_interrupted_training_resumes_from_its_backup.)"""
    import logging

    import tensorflow as tf

    from tfrs_logq.sasrec import native

    if not native.available():
        pytest.skip("the native kernels cannot be built here")

    class Interrupt(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):  # after epoch 1's checkpoint
            if epoch == 1:
                raise KeyboardInterrupt

    config = smoke_config(loss="mns-corrected", data_dir=data_dir,
                          max_epochs=2, steps_per_epoch=2, batch_size=8, dropout=0.3)
    directory = str(tmp_path / "other")
    monkeypatch.setenv("TFRS_LOGQ_NATIVE", "0")
    with pytest.raises(KeyboardInterrupt):
        train(config, directory, verbose=0, extra_callbacks=[Interrupt()])
    monkeypatch.setenv("TFRS_LOGQ_NATIVE", "auto")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfrs_logq.sasrec.training"):
        result = train(config, directory, verbose=0)
    assert any("from epoch 2 of 2" in r.getMessage() for r in caplog.records)
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "kernels" in r.getMessage()]
    assert len(warned) == 1 and "trained without" in warned[0], warned
    assert "TFRS_LOGQ_NATIVE=0" in warned[0]
    assert result["native_kernels"] is True
    assert result["native_kernels_changed_on_resume"] is True
