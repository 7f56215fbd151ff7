"""One process at a time on a path: an exclusive file lock (the `filelock` library).

`ExclusiveLock` holds ``PATH`` (a lock file, created if missing and left in place) for
a ``with`` block, through ``filelock.FileLock`` (``flock(2)`` on POSIX, released by the
kernel when the process ends, however it ends). The package's three locks use it:

- the native kernels' build (``tfrs_logq.sasrec.native``) *waits* (``wait=True``): a second
  process blocks until the first has built the library, then finds it built;
- a run directory (``tfrs_logq._util.run_directory.RunLock``) and a batch
  pipeline's root (``tfrs_logq.pipelines.beam.artifacts.locked``) *refuse*
  (``wait=False``): `LockHeld` at once, which the caller turns into its one-line error,
  naming the holder's process id where the system tells it (Linux's ``/proc/locks``).

A filesystem that cannot lock (NFS mounted ``nolock``, some FUSE mounts) raises
`LockUnsupported`; each caller decides whether that is an error or a warning. (filelock
would fall back to a marker file there, which a killed process leaves behind; it is
told not to.) What this module adds to filelock is that distinction and the holder's
name: filelock reports a held lock without saying who holds it.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), ".lock")
    >>> with ExclusiveLock(path, wait=False):
    ...     try:
    ...         ExclusiveLock(path, wait=False).acquire()
    ...     except LockHeld as held:
    ...         print(held.holder == os.getpid())
    True
"""

from __future__ import annotations

import errno
import os
from typing import Optional

import filelock

# flock(2) errors that mean "this filesystem cannot lock", not "someone holds it".
_UNSUPPORTED_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


class LockHeld(RuntimeError):
    """Another process (or another lock object of this one) holds the lock.

    Attributes:
      path: the lock file.
      holder: the holding process's id, or None where the system does not tell.
    """

    def __init__(self, path: str, holder: Optional[int]) -> None:
        self.path, self.holder = path, holder
        super().__init__(f"{path} is locked by {describe_holder(holder)}")


class LockUnsupported(OSError):
    """The filesystem holding the lock file cannot lock it."""


def describe_holder(holder: Optional[int]) -> str:
    """``"process 1234"``, or ``"another process"`` when the holder is unknown."""
    return f"process {holder}" if holder is not None else "another process"


def lock_holder(path: str) -> Optional[int]:
    """The id of the process holding a ``flock`` on ``path`` (from Linux's
    ``/proc/locks``), or None: not Linux, not locked, or not readable."""
    try:
        st = os.stat(path)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 17632 fe:00:2146896 0 EOF"
                if "FLOCK" in fields and key in fields:
                    return int(fields[fields.index(key) - 1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class ExclusiveLock:
    """An exclusive lock on the file ``path`` for a ``with`` block (or `acquire` /
    `release`). Not re-entrant: a second lock object on the same path is refused (or
    waits) even in the same process.

    Args:
      path: str. The lock file; its directory must exist. The file is left in place.
      wait: bool. Block until the lock is free (True), or raise `LockHeld` at once
        (False). Defaults to True.

    Raises (from `acquire`, hence from ``with``):
      LockHeld: ``wait`` is False and the lock is held.
      LockUnsupported: the filesystem cannot lock ``path``.
    """

    def __init__(self, path: str, wait: bool = True) -> None:
        self.path, self.wait = str(path), wait
        self._lock: Optional[filelock.BaseFileLock] = None

    def acquire(self) -> "ExclusiveLock":
        """Takes the lock (nothing to do if this object holds it already); returns self."""
        if self._lock is not None:
            return self
        # No soft fallback: a marker file outlives a killed process, a flock does not.
        lock = filelock.FileLock(self.path, fallback_to_soft=False)
        try:
            lock.acquire(timeout=-1 if self.wait else 0)
        except filelock.Timeout:
            raise LockHeld(self.path, lock_holder(self.path)) from None
        except OSError as e:
            if e.errno not in _UNSUPPORTED_ERRNOS:
                raise
            raise LockUnsupported(e.errno, os.strerror(e.errno), self.path) from None
        self._lock = lock
        return self

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "ExclusiveLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


__all__ = ["ExclusiveLock", "LockHeld", "LockUnsupported", "describe_holder", "lock_holder"]
