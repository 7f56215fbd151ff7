"""Specification of `tfrs_logq._util.atomic`: a reader sees the old file or the new one, never a
part; a failure leaves the old file and no temporary."""

import json
import os

import pytest

from tfrs_logq._util import atomic
from tfrs_logq._util.atomic import atomic_write, write_bytes, write_json, write_text


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


# --- a writer that takes a file name -----------------------------------------------------

def test_atomic_path_renames_what_a_named_writer_wrote(tmp_path):
    path = tmp_path / "lib.so"
    path.write_text("old\n")
    with atomic.atomic_path(path) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and tmp.endswith(".tmp")
        assert path.read_text() == "old\n"  # not yet
        with open(tmp, "w") as f:  # e.g. a compiler's -o, np.savez
            f.write("new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["lib.so"]


def test_atomic_path_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "lib.so"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="compiler failed"):
        with atomic.atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write("partial")
            raise RuntimeError("compiler failed")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["lib.so"]


def test_stale_temporaries_are_those_of_the_path_only(tmp_path):
    path = tmp_path / "k.so"
    mine = tmp_path / ".k.so.0123456789ab.tmp"
    for name in (mine.name, ".k.so.lock", ".other.so.0123456789ab.tmp", "k.so",
                 ".k.so.x.tmp"):
        (tmp_path / name).write_text("")
    assert atomic.stale_temporaries(path) == [str(mine)]
    assert atomic.stale_temporaries(tmp_path / "missing" / "x") == []


# --- CSV and figures -----------------------------------------------------------------------

def test_write_csv_writes_what_csv_dictwriter_wrote(tmp_path):
    import csv
    import io

    rows = [{"method": "a, quoted", "recall@10": 0.25}, {"method": "b"}]
    expected = io.StringIO(newline="")
    writer = csv.DictWriter(expected, fieldnames=["method", "recall@10"], restval="")
    writer.writeheader()
    writer.writerows(rows)
    atomic.write_csv(tmp_path / "r.csv", rows, ["method", "recall@10"])
    with open(tmp_path / "r.csv", newline="") as f:
        assert f.read() == expected.getvalue()
    assert expected.getvalue().startswith("method,recall@10\r\n")


def test_write_csv_with_an_unknown_field_leaves_the_old_file(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("old\n")
    with pytest.raises(ValueError, match="not in fieldnames"):
        atomic.write_csv(path, [{"x": 1, "y": 2}], ["x"])
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["r.csv"]


def test_write_csv_without_fieldnames_writes_every_field_in_first_seen_order(tmp_path):
    rows = [{"run_id": "a", "recall@10": 0.5}, {"run_id": "b", "steps": 4, "recall@10": 1}]
    atomic.write_csv(tmp_path / "r.csv", iter(rows), lineterminator="\n")
    with open(tmp_path / "r.csv", newline="") as f:
        assert f.read() == "run_id,recall@10,steps\na,0.5,\nb,1,4\n"


def test_save_figure_writes_what_savefig_wrote(tmp_path):
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    expected = io.BytesIO()
    fig.savefig(expected, format="png", dpi=50)
    atomic.save_figure(fig, tmp_path / "f.png", dpi=50)  # the format from the extension
    plt.close(fig)
    assert (tmp_path / "f.png").read_bytes() == expected.getvalue()
    assert os.listdir(tmp_path) == ["f.png"]


# --- directories ---------------------------------------------------------------------------

def test_a_staged_directory_is_published_with_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic.staging_directory(tmp_path / "parent", ".tmp-C-1-") as staging:
            assert os.path.basename(staging).startswith(".tmp-C-1-")
            with open(os.path.join(staging, "a.txt"), "w") as f:
                f.write("a")
    finally:
        os.umask(old)
    assert os.stat(staging).st_mode & 0o777 == 0o755  # not mkdtemp's 0o700
    atomic.publish_directory(staging, tmp_path / "parent" / "C")
    assert os.listdir(tmp_path / "parent") == ["C"]
    assert (tmp_path / "parent" / "C" / "a.txt").read_text() == "a"


def test_a_failure_while_staging_removes_the_staging_directory(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic.staging_directory(tmp_path, ".tmp-", mode=0o750) as staging:
            assert os.stat(staging).st_mode & 0o777 == 0o750
            open(os.path.join(staging, "half"), "w").close()
            raise RuntimeError
    assert os.listdir(tmp_path) == []


def test_publishing_replaces_an_existing_directory_and_leaves_nothing_aside(tmp_path):
    (tmp_path / "C").mkdir()
    (tmp_path / "C" / "old.txt").write_text("old")
    with atomic.staging_directory(tmp_path, ".tmp-") as staging:
        (tmp_path / staging / "new.txt").write_text("new")
    atomic.publish_directory(staging, tmp_path / "C")
    assert os.listdir(tmp_path) == ["C"] and os.listdir(tmp_path / "C") == ["new.txt"]


def test_publishing_without_replace_refuses_an_existing_directory(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_text("v1")
    with atomic.staging_directory(tmp_path, ".tmp-1-") as staging:
        (tmp_path / staging / "saved_model.pb").write_text("v2")
    with pytest.raises(FileExistsError):
        atomic.publish_directory(staging, tmp_path / "1", replace=False)
    assert (tmp_path / "1" / "saved_model.pb").read_text() == "v1"
    assert os.listdir(staging) == ["saved_model.pb"]  # left for the caller to retry or remove
    atomic.publish_directory(staging, tmp_path / "2", replace=False)
    assert sorted(os.listdir(tmp_path)) == ["1", "2"]


def _dead_pid():
    import subprocess
    import sys

    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)


def test_stale_staging_of_dead_writers_is_removed_the_rest_kept(tmp_path):
    dead, me = _dead_pid(), os.getpid()
    names = {f".tmp-C-{dead}-abc": False, f".tmp-3-{dead}-x_1": False,  # dead: removed
             f".old-C-{dead}-q1w2": False, f".tmp-C-{me}-abc": True,  # this process: kept
             ".tmp-C-abc": True,  # no PID: kept
             "C": True, f".cache-{dead}-abc": True}  # not staging
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
    (tmp_path / f".tmp-file-{dead}-zz").write_text("a stray file")
    removed = atomic.remove_stale_staging(tmp_path)
    assert removed == sorted([n for n, kept in names.items() if not kept]
                             + [f".tmp-file-{dead}-zz"])
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, kept in names.items() if kept)
    assert atomic.remove_stale_staging(tmp_path / "absent") == []


def test_stale_staging_of_a_live_process_is_kept(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f".tmp-C-{child.pid}-abc").mkdir()
        assert atomic.remove_stale_staging(tmp_path, (".tmp-",)) == []
    finally:
        child.kill()
        child.wait()
    assert atomic.remove_stale_staging(tmp_path, (".tmp-",)) == [f".tmp-C-{child.pid}-abc"]
