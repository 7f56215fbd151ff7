"""Exact resume of a custom training loop (`tfrs_logq.step_checkpoint.StepCheckpoint`),
on the study's loop: a run killed after a step and started again ends bit for bit as the
uninterrupted run, with every optimizer (`LazyAdam`'s moments are checkpointed)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq import study
from tfrs_logq.lazy_adam import LazyAdam
from tfrs_logq.step_checkpoint import StepCheckpoint

TINY = dict(num_items=1500, num_users=600, num_topics=20, topic_sharpness=3.0,
            history_length=5, steps=7, batch_size=32, num_in_batch=32, num_uniform=16,
            embedding_dim=8, num_eval_users=64, sampler="mixed")


class Killed(Exception):
    pass


def _state(model):
    return [w.numpy() for w in model.weights]


@pytest.fixture(scope="module")
def world():
    return study.World(study.Run(**TINY))


@pytest.mark.parametrize("optimizer", ["lazy-adam", "adam"])
def test_a_killed_run_resumes_to_the_uninterrupted_runs_weights(tmp_path, world, optimizer):
    run = study.Run(**{**TINY, "optimizer": optimizer})
    table = study.proposal_log_q_table(run, world.log_q)
    straight, straight_record = [], []
    model, timing = study.train(run, world.stream, table, straight_record)
    straight = _state(model)
    assert timing["resumed_from_step"] == 0

    directory = str(tmp_path / "ckpt")

    def kill_after_step_3(i):
        if i == 3:
            raise Killed

    with pytest.raises(Killed):
        study.train(run, world.stream, table, checkpoint_dir=directory, checkpoint_seconds=0,
                    on_step=kill_after_step_3)
    resumed_record: list = []
    model, timing = study.train(run, world.stream, table, resumed_record,
                                checkpoint_dir=directory, checkpoint_seconds=0)
    assert timing["resumed_from_step"] == 4
    # The resumed process saw the uninterrupted run's batches and negatives from step 4 on.
    assert len(resumed_record) == run.steps - 4
    for (batch_a, ids_a, _), (batch_b, ids_b, _) in zip(straight_record[4:], resumed_record):
        np.testing.assert_array_equal(batch_a["target"], batch_b["target"])
        np.testing.assert_array_equal(ids_a, ids_b)
    for x, y in zip(straight, _state(model)):
        np.testing.assert_array_equal(x, y)
    # An interrupted state is not the end state: the comparison above could fail.
    early = study.train(study.Run(**{**TINY, "optimizer": optimizer, "steps": 4}),
                        world.stream, table)[0]
    assert not np.array_equal(_state(early)[0], straight[0])


def test_without_a_save_the_run_starts_from_step_0(tmp_path, world):
    run = study.Run(**TINY)
    table = study.proposal_log_q_table(run, world.log_q)
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Killed):
        study.train(run, world.stream, table, checkpoint_dir=directory,
                    checkpoint_seconds=3600, on_step=lambda i: (_ for _ in ()).throw(Killed))
    assert not os.path.exists(directory)
    _, timing = study.train(run, world.stream, table, checkpoint_dir=directory)
    assert timing["resumed_from_step"] == 0


def test_a_checkpoint_of_another_run_is_refused(tmp_path, world):
    run = study.Run(**TINY)
    table = study.proposal_log_q_table(run, world.log_q)
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Killed):
        study.train(run, world.stream, table, checkpoint_dir=directory, checkpoint_seconds=0,
                    on_step=lambda i: (_ for _ in ()).throw(Killed))
    other = study.Run(**{**TINY, "correction": "logq-paper"})
    with pytest.raises(ValueError, match="holds a checkpoint of another run"):
        study.train(other, world.stream, table, checkpoint_dir=directory)


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


def test_the_grid_goes_on_from_a_killed_runs_checkpoint_and_removes_it(tmp_path, world):
    run = study.Run(**TINY)
    out = str(tmp_path / "study")
    directory = study.checkpoint_directory(out, run)
    assert directory.startswith(os.path.join(out, "runs") + os.sep)
    table = study.proposal_log_q_table(run, world.log_q)
    with pytest.raises(Killed):
        study.train(run, world.stream, table, checkpoint_dir=directory, checkpoint_seconds=0,
                    on_step=lambda i: (_ for _ in ()).throw(Killed) if i == 2 else None)
    said: list = []
    rows = study.run_grid([run], out, say=said.append)
    assert rows[0]["resumed_from_step"] == "3"
    assert "  resumed from step 3" in said
    assert not os.path.exists(directory)
