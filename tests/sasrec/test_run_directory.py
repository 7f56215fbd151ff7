"""tfrs_logq.sasrec.run: which run a model directory holds, whether it resumes or is
refused, its lock, and each worker's directory."""

import json
import subprocess
import sys

import pytest
from smoke_config import smoke_config

from tfrs_logq.sasrec.training import train


def test_two_processes_cannot_train_into_one_model_dir(data_dir, tmp_path):
    from tfrs_logq.sasrec.run import RunDirectoryError, RunLock

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
         str(model_dir / RunLock.NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        config = smoke_config(loss="inbatch-none", data_dir=data_dir,
                              max_epochs=1, steps_per_epoch=2)
        with pytest.raises(RunDirectoryError, match="in use by another training process") as e:
            train(config, str(model_dir), verbose=0)
        if sys.platform.startswith("linux"):  # the holder, from /proc/locks
            assert f"(process {holder.pid})" in str(e.value)
        assert "\n" not in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    assert not (model_dir / "config.json").exists()  # refused before touching the run
    # Released with the process: the same directory trains now.
    assert train(config, str(model_dir), verbose=0)["epochs"] == 1


def test_worker_directory_is_the_model_dir_on_the_chief_only(monkeypatch, tmp_path):
    from tfrs_logq.sasrec.run import worker_directory

    cluster = {"worker": ["a:1", "b:2"]}
    for task, expected in (({"type": "worker", "index": 0}, "m"),
                           ({"type": "worker", "index": 1}, "m/worker-worker-1")):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
        assert worker_directory("m") == expected
        assert worker_directory("m", "default") == "m"  # not a multi-worker run
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"chief": ["c:0"], **cluster}, "task": {"type": "worker", "index": 0}}))
    assert worker_directory("m") == "m/worker-worker-0"  # an explicit chief exists
    monkeypatch.delenv("TF_CONFIG")
    assert worker_directory("m") == "m"


def test_a_run_killed_before_its_config_was_written_starts_again(data_dir, tmp_path):
    from tfrs_logq.sasrec.run import RunDirectoryError, prepare_run_directory

    config = smoke_config(loss="inbatch-none", data_dir=data_dir)
    run = tmp_path / "m"
    run.mkdir()
    for name in (".lock", "vocabulary.json", ".config.json.x1y2.tmp"):
        (run / name).write_text("{}")
    assert prepare_run_directory(config, str(run)) == "new"
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError, match="not empty"):
        prepare_run_directory(config, str(run))


def test_a_run_that_stopped_before_its_first_epoch_does_not_block_a_retry(data_dir, tmp_path,
                                                                          caplog):
    # A run that failed before training anything left a config.json that
    # refused every retry with other flags ("holds a run with another config").
    import logging

    from tfrs_logq.sasrec.run import (
        RunDirectoryError,
        has_progress,
        prepare_run_directory,
        saved_config,
    )

    failed = smoke_config(loss="inbatch-none", data_dir=data_dir,
                          max_length=50)
    retry = smoke_config(loss="inbatch-none", data_dir=data_dir)
    run = tmp_path / "m"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "events.out.tfevents.1").write_text("x")
    (run / "vocabulary.json").write_text("{}")
    (run / "config.json").write_text(json.dumps(saved_config(failed, 40)))
    assert not has_progress(str(run))
    with caplog.at_level(logging.INFO, logger="tfrs_logq.sasrec.training"):
        assert prepare_run_directory(retry, str(run)) == "new"
    assert sorted(p.name for p in run.iterdir()) == []  # the untrained run's files cleared
    assert any("stopped before finishing an epoch" in r.getMessage() for r in caplog.records)
    # Once an epoch is saved the run is kept: another config is refused, the same resumes.
    (run / "config.json").write_text(json.dumps(saved_config(failed, 40)))
    (run / "epochs.json").write_text(json.dumps({"epochs": []}))
    assert has_progress(str(run))
    with pytest.raises(RunDirectoryError, match="another config"):
        prepare_run_directory(retry, str(run))
    assert prepare_run_directory(failed, str(run)) == "resume"
    # And a budget of the check only is not the run's: the same run resumes.
    import dataclasses

    assert prepare_run_directory(dataclasses.replace(failed, max_tensor_gib=64.0),
                                 str(run)) == "resume"


def test_train_retries_in_the_directory_of_a_run_that_failed_at_its_start(data_dir, tmp_path):
    import tensorflow as tf

    class Fail(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            raise RuntimeError("out of memory")

    first = smoke_config(loss="inbatch-none", data_dir=data_dir,
                         max_epochs=1, steps_per_epoch=2, max_length=40)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(first, str(tmp_path / "m"), verbose=0, extra_callbacks=[Fail()])
    assert (tmp_path / "m" / "config.json").exists()
    retry = smoke_config(loss="inbatch-none", data_dir=data_dir,
                         max_epochs=1, steps_per_epoch=2)
    assert train(retry, str(tmp_path / "m"), verbose=0)["epochs"] == 1
    assert json.loads((tmp_path / "m" / "config.json").read_text())["max_length"] == 30


def test_a_resume_keeps_the_runs_speed_only_fields(data_dir, tmp_path, caplog):
    import dataclasses
    import logging

    from tfrs_logq.sasrec.run import _resumed_speed_fields, saved_config

    config = smoke_config(loss="inbatch-none", data_dir=data_dir,
                          length_buckets=8)
    (tmp_path / "config.json").write_text(json.dumps(saved_config(config, 40)))
    with caplog.at_level(logging.INFO, logger="tfrs_logq.sasrec.training"):
        resumed = _resumed_speed_fields(dataclasses.replace(config, length_buckets=2),
                                        str(tmp_path))
    assert resumed.length_buckets == 8
    assert any("length_buckets=8" in r.getMessage() for r in caplog.records)


def test_a_filesystem_without_flock_warns_and_trains(tmp_path, monkeypatch, caplog):
    import errno
    import fcntl
    import logging

    from tfrs_logq.sasrec.run import RunLock

    def no_flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING, logger="tfrs_logq.sasrec.training"):
        with RunLock(str(tmp_path)):
            pass
    assert any("no flock" in r.getMessage() for r in caplog.records)


def test_run_directory_refuses_other_or_finished_runs(data_dir, tmp_path):
    from tfrs_logq.sasrec.run import RunDirectoryError

    config = smoke_config(loss="inbatch-none", data_dir=data_dir,
                          max_epochs=1, steps_per_epoch=2)
    model_dir = str(tmp_path / "m")
    train(config, model_dir, verbose=0)
    other = smoke_config(loss="mns-none", data_dir=data_dir,
                         max_epochs=1, steps_per_epoch=2)
    with pytest.raises(RunDirectoryError, match="another config"):
        train(other, model_dir, verbose=0)
    with pytest.raises(RunDirectoryError, match="finished"):
        train(config, model_dir, verbose=0)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["loss"] == "inbatch-none"
    result = train(other, model_dir, verbose=0, overwrite=True)
    assert result["loss"] == "mns-none"
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with pytest.raises(RunDirectoryError, match="not empty"):
        train(config, str(tmp_path / "junk"), verbose=0)
    with pytest.raises(RunDirectoryError, match="is a file"):
        train(config, str(tmp_path / "junk" / "notes.txt"), verbose=0)
