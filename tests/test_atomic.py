"""Specification of `tfrs_logq.atomic`: a reader sees the old file or the new one, never a
part; a failure leaves the old file and no temporary."""

import json
import os

import pytest

from tfrs_logq import atomic
from tfrs_logq.atomic import atomic_write, write_bytes, write_json, write_text


def _siblings(path):
    return sorted(os.listdir(os.path.dirname(path)))


def test_writes_text_json_and_bytes(tmp_path):
    write_text(tmp_path / "a.md", "| x |\n")
    write_json(tmp_path / "b.json", {"recall@10": 0.25}, indent=1)
    write_bytes(tmp_path / "c.bin", b"\x00\xff")
    assert (tmp_path / "a.md").read_text() == "| x |\n"
    assert (tmp_path / "b.json").read_text() == json.dumps({"recall@10": 0.25}, indent=1) + "\n"
    assert (tmp_path / "c.bin").read_bytes() == b"\x00\xff"
    assert _siblings(str(tmp_path / "a.md")) == ["a.md", "b.json", "c.bin"]


def test_replaces_an_existing_file(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("old\n")
    write_text(path, "new\n")
    assert path.read_text() == "new\n"


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("old complete file\n")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_write(path) as f:
            f.write("new, half")
            f.flush()
            # The temporary is in the destination's directory while it is written.
            assert len(_siblings(str(path))) == 2
            raise RuntimeError("disk on fire")
    assert path.read_text() == "old complete file\n"
    assert _siblings(str(path)) == ["results.csv"]


def test_an_interrupt_mid_write_leaves_no_file_when_there_was_none(tmp_path):
    path = tmp_path / "model.bin"
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path, "wb") as f:
            f.write(b"partial")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_unserialisable_json_leaves_the_old_file(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{}\n")
    with pytest.raises(TypeError):
        write_json(path, {"x": object()})
    assert path.read_text() == "{}\n" and os.listdir(tmp_path) == ["m.json"]


def test_a_failed_rename_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "t.txt"
    path.write_text("old\n")

    def fail(src, dst):
        raise OSError("rename refused")

    monkeypatch.setattr(atomic.os, "replace", fail)
    with pytest.raises(OSError, match="rename refused"):
        write_text(path, "new\n")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["t.txt"]


def test_data_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(atomic.os, "replace",
                        lambda a, b: (events.append("replace"), real_replace(a, b)))
    write_text(tmp_path / "f.txt", "x")
    assert events[:2] == ["fsync", "replace"]


def test_permissions_follow_the_umask_not_mkstemp(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "p.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "p.txt").stat().st_mode & 0o777 == 0o644


def test_bad_mode_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="`mode`"):
        with atomic_write(tmp_path / "x", "a"):
            pass


def test_module_docstring_example_runs():
    import doctest

    assert doctest.testmod(atomic).failed == 0
