"""tfrs_logq._util.locks: an exclusive file lock that refuses or waits, names its holder,
and tells a filesystem that cannot lock from a lock that is held."""

import errno
import os
import subprocess
import sys
import threading
import time

import pytest

from tfrs_logq._util.locks import ExclusiveLock, LockHeld, LockUnsupported, lock_holder

# Takes the lock, says so, and holds it until its stdin closes (the test's word, not a clock).
HOLD = ("import fcntl, sys; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); sys.stdin.read()")


def _holder(path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _in_thread(target):
    """Runs ``target`` in a thread; returns the thread and a list that gets its result
    (or the exception it raised)."""
    outcome: list = []

    def run():
        try:
            outcome.append(target())
        except Exception as e:  # noqa: BLE001 (the test inspects it)
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_held_lock_is_refused_at_once_and_names_the_holding_process(tmp_path):
    path = tmp_path / ".lock"
    proc = _holder(path)
    try:
        # Refused while the holder still holds it: a lock that waited would return only
        # once the holder let go, which it does when told, after this check.
        thread, outcome = _in_thread(lambda: ExclusiveLock(str(path), wait=False).acquire())
        thread.join(60)  # a guard against a hang, not a measure
        assert not thread.is_alive() and proc.poll() is None, "waited for the holder"
        assert len(outcome) == 1 and isinstance(outcome[0], LockHeld), outcome
        if sys.platform.startswith("linux"):
            assert outcome[0].holder == proc.pid == lock_holder(str(path))
            assert f"process {proc.pid}" in str(outcome[0])
    finally:
        proc.kill()
        proc.wait()
    # Released by the kernel when the holder dies, however it dies.
    with ExclusiveLock(str(path), wait=False):
        assert lock_holder(str(path)) in (os.getpid(), None)
    assert path.exists()  # the lock file stays, so waiters share one inode
    assert lock_holder(str(path)) is None


def test_a_waiting_lock_blocks_until_the_holder_is_gone(tmp_path, monkeypatch):
    """The order of events, not a duration: the waiter tries the lock while the holder
    holds it, the holder lets go, and only then does the waiter hold it."""
    import fcntl

    path = tmp_path / ".lock"
    proc = _holder(path)
    events: list = []
    real_flock = fcntl.flock

    def flock(fd, operation):  # the waiter's every attempt, seen before it is made
        if (operation & fcntl.LOCK_EX and
                threading.current_thread() is not threading.main_thread()):
            events.append("tried")
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)

    def wait_and_hold():
        with ExclusiveLock(str(path), wait=True):
            events.append("acquired")
            # The kernel's lock table names no other holder now.
            return lock_holder(str(path))

    try:
        thread, outcome = _in_thread(wait_and_hold)
        _wait_for(lambda: "tried" in events or not thread.is_alive(), "a first attempt")
        assert "acquired" not in events and proc.poll() is None, events
        events.append("released")
        proc.stdin.close()  # the holder exits, and the kernel releases its lock
        assert proc.wait(timeout=60) == 0
        thread.join(60)  # a guard against a hang, not a measure
        assert not thread.is_alive(), "still waiting after the holder exited"
    finally:
        proc.kill()
        proc.wait()
    assert outcome and outcome[0] in (os.getpid(), None), outcome
    assert events.count("acquired") == 1, events
    assert events.index("tried") < events.index("released") < events.index("acquired"), events


def _wait_for(condition, what, timeout=60.0):
    """Polls ``condition()``; a guard against a hang (AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


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
