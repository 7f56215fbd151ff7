"""`tfrs_logq.sasrec.callbacks`: the best epoch survives kills at every point of its saving."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq.sasrec import callbacks
from tfrs_logq.sasrec.callbacks import BestEpochKeeper


class Killed(BaseException):
    """Stands for SIGKILL: nothing after the raise runs."""


def _model():
    model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(2,))])
    model.build((None, 2))
    return model


def _weights_of(epoch):
    return [np.full((2, 3), float(epoch), np.float32), np.full((3,), -float(epoch), np.float32)]


def _keeper(tmp_path, model):
    keeper = BestEpochKeeper(str(tmp_path / "epochs.json"), str(tmp_path / "best.weights"),
                             patience=10)
    keeper.set_model(model)
    return keeper


def _epochs(keeper, model, values, first=0):
    """Runs epochs ``first..`` (0-based) with ``values`` as their monitor; epoch e's
    weights are all ``e + 1`` (1-based), so a loaded model tells which epoch it holds."""
    for offset, value in enumerate(values):
        epoch = first + offset
        keeper.on_epoch_begin(epoch)
        model.set_weights(_weights_of(epoch + 1))
        keeper.on_epoch_end(epoch, {"val_ndcg@10": value})


def _published_epoch(tmp_path):
    fresh = _model()
    fresh.load_weights(str(tmp_path / "best.weights"))
    kernel = fresh.get_weights()[0]
    assert np.all(kernel == kernel.flat[0])
    return int(kernel.flat[0])


def _staged(tmp_path):
    return sorted({n.split(".")[0] for n in os.listdir(tmp_path / "backup" / "best")
                   if n.startswith("best-")})


def test_the_best_epoch_is_staged_per_epoch_and_published_at_the_end(tmp_path):
    model = _model()
    keeper = _keeper(tmp_path, model)
    keeper.on_train_begin()
    _epochs(keeper, model, [0.1, 0.5, 0.3, 0.2])
    assert _staged(tmp_path) == ["best-2"]  # older bests removed once superseded
    assert not (tmp_path / "best.weights.index").exists()  # published only at the end
    keeper.on_train_end()
    assert keeper.best_epoch == 2 and _published_epoch(tmp_path) == 2
    np.testing.assert_array_equal(model.get_weights()[0], _weights_of(2)[0])  # restored
    assert json.loads((tmp_path / "epochs.json").read_text())["best_epoch"] == 2
    # No temporary file is left beside the published weights.
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("best")) == [
        "best.weights.data-00000-of-00001", "best.weights.index"]


def test_a_kill_while_saving_a_new_best_keeps_the_previous_one(tmp_path, monkeypatch):
    """Killed inside the save of epoch 4's weights (half its files written), then
    resumed; the rerun of epoch 4 does not improve (as a non-deterministic GPU
    rerun may not): the best stays epoch 2, intact, and is what gets published."""
    model = _model()
    keeper = _keeper(tmp_path, model)
    keeper.on_train_begin()
    _epochs(keeper, model, [0.1, 0.5, 0.3])
    real_save = model.save_weights

    def save_half(path, *args, **kwargs):
        real_save(path, *args, **kwargs)
        os.remove(path + ".index")  # the data is written, the index is not
        raise Killed

    monkeypatch.setattr(model, "save_weights", save_half)
    with pytest.raises(Killed):
        _epochs(keeper, model, [0.9], first=3)
    monkeypatch.undo()
    resumed = _keeper(tmp_path, model)
    resumed.on_train_begin()
    _epochs(resumed, model, [0.2], first=3)
    assert _staged(tmp_path) == ["best-2"]
    resumed.on_train_end()
    assert resumed.best_epoch == 2 and _published_epoch(tmp_path) == 2


def test_a_kill_after_saving_but_before_the_epoch_was_recorded_reruns_it(tmp_path,
                                                                         monkeypatch):
    model = _model()
    keeper = _keeper(tmp_path, model)
    keeper.on_train_begin()
    _epochs(keeper, model, [0.1, 0.5])

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(callbacks, "write_json", killed)
    with pytest.raises(Killed):
        _epochs(keeper, model, [0.9], first=2)
    monkeypatch.undo()
    assert json.loads((tmp_path / "epochs.json").read_text())["best_epoch"] == 2
    resumed = _keeper(tmp_path, model)
    resumed.on_train_begin()
    _epochs(resumed, model, [0.9, 0.1], first=2)  # the rerun epoch 3 improves again
    resumed.on_train_end()
    assert resumed.best_epoch == 3 and _published_epoch(tmp_path) == 3
    assert [e["epoch"] for e in resumed.history] == [1, 2, 3, 4]


def test_a_kill_while_publishing_is_repaired_by_the_resumed_run(tmp_path, monkeypatch):
    """Killed between publishing the data shard and the index, over an older
    published model: best.weights holds epoch 3's data with a stale index. The
    resumed run (nothing left to train) publishes again from the staged copy."""
    model = _model()
    keeper = _keeper(tmp_path, model)
    keeper.on_train_begin()
    _epochs(keeper, model, [0.1, 0.5])
    keeper.on_train_end()  # as an earlier publish would have left it: epoch 2
    keeper = _keeper(tmp_path, model)
    keeper.on_train_begin()
    _epochs(keeper, model, [0.9], first=2)
    real_copy = callbacks.shutil.copyfileobj

    def copy_then_die(src, dst, *args):
        if src.name.endswith(".index"):
            raise Killed
        return real_copy(src, dst, *args)

    monkeypatch.setattr(callbacks.shutil, "copyfileobj", copy_then_die)
    with pytest.raises(Killed):
        keeper.on_train_end()
    monkeypatch.undo()
    resumed = _keeper(tmp_path, model)
    resumed.on_train_begin()
    resumed.on_train_end()
    assert _published_epoch(tmp_path) == 3
