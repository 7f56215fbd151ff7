"""tfrs_logq._util.run_directory: the run-directory rules SASRec's train, the two-tower run
and the drivers share, each refusal one line."""

import os

import pytest

from tfrs_logq._util import run_directory as rd


def test_a_directory_without_config_is_new_if_it_holds_only_what_a_killed_creation_leaves(
        tmp_path):
    (tmp_path / ".lock").write_text("")
    (tmp_path / ".config.json.123.tmp").write_text("{")
    (tmp_path / "vocabulary.json").write_text("[]")
    rd.check_new(str(tmp_path), lambda name: name == "vocabulary.json")
    with pytest.raises(rd.RunDirectoryError, match="not empty and holds no tfrs-logq run"):
        rd.check_new(str(tmp_path))
    rd.check_new(str(tmp_path / "absent"))


def test_clear_keeps_the_lock_and_what_the_caller_keeps(tmp_path):
    for name in (".lock", "config.json", "worker-1"):
        (tmp_path / name).write_text("x")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events").write_text("x")
    os.symlink(tmp_path / "logs", tmp_path / "link")
    rd.clear(str(tmp_path), keep=lambda name: name.startswith("worker-"))
    assert sorted(os.listdir(tmp_path)) == [".lock", "worker-1"]
    (tmp_path / "config.json").write_text("x")
    rd.clear(str(tmp_path), ["config.json", "missing"])
    assert sorted(os.listdir(tmp_path)) == [".lock", "worker-1"]


def test_refusals_name_the_directory_and_the_way_out(tmp_path):
    with pytest.raises(rd.RunDirectoryError, match=f"{tmp_path} holds a SASRec run .*--overwrite"):
        rd.refuse_other_run(str(tmp_path), "a SASRec run")
    rd.refuse_finished(str(tmp_path))  # not finished: nothing to refuse
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(rd.RunDirectoryError, match="finished \\(metrics.json\\).*--overwrite"):
        rd.refuse_finished(str(tmp_path))
    with pytest.raises(rd.RunDirectoryError, match="is a file, not a directory"):
        rd.check_not_a_file(str(tmp_path / "metrics.json"))


def test_a_held_run_lock_is_refused_naming_the_flag_and_the_holder(tmp_path):
    with rd.RunLock(str(tmp_path), "--output-dir"):
        with pytest.raises(rd.RunDirectoryError) as e:
            rd.RunLock(str(tmp_path), "--output-dir").__enter__()
    assert str(e.value).startswith(f"--output-dir {tmp_path} is in use by another training "
                                   f"process (process {os.getpid()})")
    assert "\n" not in str(e.value)
    with rd.RunLock(str(tmp_path)):  # released
        pass
