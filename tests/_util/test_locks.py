"""tfrs_logq._util.locks: an exclusive file lock that refuses or waits, names its holder,
and tells a filesystem that cannot lock from a lock that is held."""

import errno
import os
import subprocess
import sys
import time

import pytest

from tfrs_logq._util.locks import ExclusiveLock, LockHeld, LockUnsupported, lock_holder

HOLD = ("import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(float(sys.argv[2]))")


def _holder(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_held_lock_is_refused_at_once_and_names_the_holding_process(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path, 60)
    try:
        start = time.monotonic()
        with pytest.raises(LockHeld) as held:
            ExclusiveLock(str(path), wait=False).acquire()
        assert time.monotonic() - start < 5
        if sys.platform.startswith("linux"):
            assert held.value.holder == proc.pid == lock_holder(str(path))
            assert f"process {proc.pid}" in str(held.value)
    finally:
        proc.kill()
        proc.wait()
    # Released by the kernel when the holder dies, however it dies.
    with ExclusiveLock(str(path), wait=False):
        assert lock_holder(str(path)) in (os.getpid(), None)
    assert path.exists()  # the lock file stays, so waiters share one inode
    assert lock_holder(str(path)) is None


def test_a_waiting_lock_blocks_until_the_holder_is_gone(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path, 1.5)
    try:
        start = time.monotonic()
        with ExclusiveLock(str(path), wait=True):
            # Acquired only once the holder let go, at its exit after 1.5 s of holding (the
            # kernel releases the lock before the exit can be seen with poll(): under load
            # the holder may not be reaped yet, so wait for it rather than poll).
            assert time.monotonic() - start >= 1.0
            assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_two_lock_objects_of_one_process_exclude_each_other(tmp_path):
    path = str(tmp_path / ".lock")
    with ExclusiveLock(path, wait=False):
        with pytest.raises(LockHeld):
            ExclusiveLock(path, wait=False).acquire()
    lock = ExclusiveLock(path, wait=False).acquire()
    lock.release()
    lock.release()  # twice is harmless


@pytest.mark.parametrize("wait", [False, True])
@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_filesystem_without_flock_never_waits(tmp_path, monkeypatch, wait, code):
    """NFS without locks (ENOLCK), no flock at all (ENOSYS: no soft marker file instead),
    a FUSE mount (EOPNOTSUPP): `LockUnsupported` at once, never a wait or a held lock."""
    import fcntl
    import threading

    def no_flock(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    outcome = []

    def attempt():
        try:
            ExclusiveLock(str(tmp_path / ".lock"), wait=wait).acquire()
        except Exception as e:  # noqa: BLE001 (the test inspects it)
            outcome.append(e)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "waited on a lock the filesystem cannot take"
    assert len(outcome) == 1 and isinstance(outcome[0], LockUnsupported)
    assert outcome[0].errno == code and not isinstance(outcome[0], LockHeld)
    assert os.listdir(tmp_path) in ([], [".lock"])  # no soft-lock marker beside it
