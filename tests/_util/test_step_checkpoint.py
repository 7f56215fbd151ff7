"""`tfrs_logq._util.step_checkpoint.StepCheckpoint`, the exact-resume checkpoint of the
two-tower loop: a state belongs to its run's key, `LazyAdam`'s moments and step round-trip,
saves are spaced, and the code fingerprint follows the sources only. The loop's exact
resume (a killed run ends bit for bit as the uninterrupted one) is tested on the two-tower
run in tests/towers/test_towers_run.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq._util.step_checkpoint import StepCheckpoint
from tfrs_logq.lazy_adam import LazyAdam


def test_a_state_of_another_key_is_refused_both_ways_and_the_message_names_the_field(tmp_path):
    var = tf.Variable(1.0)
    a = "num_items=5|correction=corrected|code=abc"
    b = "num_items=5|correction=logq-tfrs|code=abc"
    StepCheckpoint(str(tmp_path), a, var=var).save(3)
    with pytest.raises(ValueError, match="'correction=corrected' where this run has "
                                         "'correction=logq-tfrs'"):
        StepCheckpoint(str(tmp_path), b, var=var).restore()
    with pytest.raises(ValueError, match="belongs to another run or code"):
        StepCheckpoint(str(tmp_path), b, var=var).save(4)  # saving into it is refused too
    # A key.txt with no checkpoint yet still keeps another key out.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "key.txt").write_text(a)
    with pytest.raises(ValueError, match="belongs to another run or code"):
        StepCheckpoint(str(fresh), b, var=var).save(1)
    # A checkpoint with no key.txt is nobody's.
    os.remove(tmp_path / "key.txt")
    with pytest.raises(ValueError, match="holds a checkpoint but no key.txt"):
        StepCheckpoint(str(tmp_path), a, var=var).restore()


def test_lazy_adam_moments_and_step_round_trip(tmp_path):
    var = tf.Variable(tf.ones([5, 3]))
    optimizer = LazyAdam(0.1)
    optimizer.build([var])
    grad = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([1, 3]), tf.constant([5, 3]))
    optimizer.apply_gradients([(grad, var)])
    saved = StepCheckpoint(str(tmp_path), "k", optimizer=optimizer, var=var)
    saved.save(1)

    fresh_var = tf.Variable(tf.zeros([5, 3]))
    fresh = LazyAdam(0.1)
    fresh.build([fresh_var])
    loaded = StepCheckpoint(str(tmp_path), "k", optimizer=fresh, var=fresh_var)
    assert loaded.restore() == 1
    assert int(fresh.iterations.numpy()) == 1
    for a, b in zip(optimizer.moments, fresh.moments):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert np.abs(fresh.moments[0].numpy()[1]).sum() > 0  # the moments were not zeros
    np.testing.assert_array_equal(fresh_var.numpy(), var.numpy())


def test_every_seconds_spaces_the_saves(tmp_path):
    var = tf.Variable(1.0)
    with pytest.raises(ValueError, match="every_seconds"):
        StepCheckpoint(str(tmp_path), "k", every_seconds=-1, var=var)
    never = StepCheckpoint(str(tmp_path / "a"), "k", every_seconds=3600, var=var)
    assert not never.step_done(1) and never.restore() == 0
    always = StepCheckpoint(str(tmp_path / "b"), "k", every_seconds=0, var=var)
    assert always.step_done(1) and always.step_done(2)
    assert StepCheckpoint(str(tmp_path / "b"), "k", var=var).restore() == 2


def test_source_fingerprint_follows_the_sources_only(tmp_path):
    from tfrs_logq._util.step_checkpoint import source_fingerprint

    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "k.cc").write_text("int f();\n")
    first = source_fingerprint.__wrapped__(str(tmp_path / "pkg"))
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"compiled")
    (tmp_path / "pkg" / "notes.md").write_text("not code")
    assert source_fingerprint.__wrapped__(str(tmp_path / "pkg")) == first
    (tmp_path / "pkg" / "k.cc").write_text("int g();\n")
    assert source_fingerprint.__wrapped__(str(tmp_path / "pkg")) != first
