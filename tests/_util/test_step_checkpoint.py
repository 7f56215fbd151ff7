"""Exact resume of a custom training loop (`tfrs_logq._util.step_checkpoint.StepCheckpoint`),
on the study's loop: a run killed after a step and started again ends bit for bit as the
uninterrupted run, with every optimizer (`LazyAdam`'s moments are checkpointed)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from lab import study, study_grid
from tfrs_logq._util.step_checkpoint import StepCheckpoint
from tfrs_logq.lazy_adam import LazyAdam

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


def test_other_code_resumes_nothing(tmp_path, world, monkeypatch):
    run = study.Run(**TINY)
    out = str(tmp_path)
    before = study_grid.checkpoint_directory(out, run)
    assert study.checkpoint_key(run).startswith(run.run_id + "|code=")
    from tfrs_logq.towers import loop

    monkeypatch.setattr(loop, "source_fingerprint", lambda *dirs: "other-code")
    assert study.checkpoint_key(run) == run.run_id + "|code=other-code"
    other_package = study_grid.checkpoint_directory(out, run)
    assert other_package != before
    # The lab's code (lab/, not installed) is the study's too.
    monkeypatch.setattr(study_grid, "source_fingerprint", lambda *dirs: "other-lab")
    assert study_grid.checkpoint_directory(out, run) not in (before, other_package)


def test_a_run_killed_while_evaluating_does_not_train_again(tmp_path, world):
    run = study.Run(**TINY)
    table = study.proposal_log_q_table(run, world.log_q)
    directory = str(tmp_path / "ckpt")
    model, timing = study.train(run, world.stream, table, checkpoint_dir=directory,
                                checkpoint_seconds=3600)
    assert timing["resumed_from_step"] == 0 and timing["seconds_per_step"] > 0
    record: list = []
    again, timing = study.train(run, world.stream, table, record, checkpoint_dir=directory)
    assert timing["resumed_from_step"] == run.steps and record == []
    assert np.isnan(timing["seconds_per_step"])
    for x, y in zip(_state(model), _state(again)):
        np.testing.assert_array_equal(x, y)


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
    directory = study_grid.checkpoint_directory(out, run)
    assert directory.startswith(os.path.join(out, "runs") + os.sep)
    table = study.proposal_log_q_table(run, world.log_q)
    with pytest.raises(Killed):
        study.train(run, world.stream, table, checkpoint_dir=directory, checkpoint_seconds=0,
                    on_step=lambda i: (_ for _ in ()).throw(Killed) if i == 2 else None)
    said: list = []
    rows = study_grid.run_grid([run], out, say=said.append)
    assert rows[0]["resumed_from_step"] == "3"
    assert "  resumed from step 3" in said
    assert not os.path.exists(directory)


def test_the_grid_removes_checkpoints_no_unfinished_run_resumes(tmp_path):
    runs = [study.Run(**TINY), study.Run(**{**TINY, "correction": "logq-tfrs"})]
    out = str(tmp_path)
    keep = study_grid.checkpoint_directory(out, runs[1])
    finished = study_grid.checkpoint_directory(out, runs[0])
    stale = os.path.join(out, "runs", "0123456789abcdef")
    not_ours = os.path.join(out, "runs", "notes")
    for path in (keep, finished, stale, not_ours):
        os.makedirs(path)
    for path in (keep, finished, stale):
        open(os.path.join(path, "key.txt"), "w").write("k")
    said: list = []
    study_grid.remove_stale_checkpoints(out, runs[1:], say=said.append)
    assert os.path.isdir(keep) and os.path.isdir(not_ours)
    assert not os.path.exists(finished) and not os.path.exists(stale)
    assert len(said) == 2


def test_a_second_driver_on_the_same_directory_is_refused(tmp_path):
    from tfrs_logq.sasrec.run_directory import RunDirectoryError, RunLock

    with RunLock(str(tmp_path)):
        with pytest.raises(RunDirectoryError, match="^--output-dir .* is in use by another"):
            study_grid.run_grid([study.Run(**TINY)], str(tmp_path), say=lambda m: None)


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
