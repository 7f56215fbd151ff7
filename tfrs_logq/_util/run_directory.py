"""A run's directory as every trainer and driver keeps it (no TensorFlow).

SASRec's ``train`` (`tfrs_logq.sasrec.run`), the two-tower run
(`tfrs_logq.towers.run`) and the resumable drivers (`tfrs_logq.studies._grid`) share:

- `RunLock`: one process at a time in a directory (``.lock`` in it); a second is refused
  at once in one line naming the holder, and a filesystem that cannot lock is a warning;
- the layout's rules: ``config.json`` is written last when a run is created (a directory
  with one holds a run) and ``metrics.json`` when it has finished; `check_not_a_file`,
  `check_new`, `refuse_other_run` and `refuse_finished` say so in one line each;
- `clear`: what ``--overwrite`` removes (everything but the lock);
- `worker_directory`: a multi-worker cluster's non-chief worker keeps its own state in
  ``model_dir/worker-TYPE-INDEX`` (`WORKER_PREFIX`), which the chief's rules leave alone.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with RunLock(d):
    ...     try:
    ...         RunLock(d).__enter__()
    ...     except RunDirectoryError as e:
    ...         print(str(e).split(" (")[0].replace(d, "DIR"))
    --model-dir DIR is in use by another training process
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Callable, Iterable, Optional

from tfrs_logq._util.locks import ExclusiveLock, LockHeld, LockUnsupported, describe_holder
from tfrs_logq._util.strategy import is_chief

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
CONFIG = "config.json"  # written last when a run is created
FINISHED = "metrics.json"  # written last when a run has finished
WORKER_PREFIX = "worker-"  # a multi-worker run's other workers' folders


class RunDirectoryError(ValueError):
    """A run directory is in use, is a file, or holds another run or this run finished."""


class RunLock:
    """An exclusive lock on a run directory (``.lock`` in it, `ExclusiveLock`), so two
    processes never write into one directory; released when the process ends,
    however it ends. On a filesystem that cannot lock, a warning, and the run goes on.

    Args:
      model_dir: str. The directory (it must exist).
      flag: str. How the error names the directory. Defaults to ``"--model-dir"``.

    Raises:
      RunDirectoryError: another process holds the lock (refused at once, naming it).
    """

    NAME = LOCK_NAME

    def __init__(self, model_dir: str, flag: str = "--model-dir") -> None:
        self.path = os.path.join(model_dir, self.NAME)
        self.flag = flag
        self._lock: Optional[ExclusiveLock] = None

    def __enter__(self) -> "RunLock":
        lock = ExclusiveLock(self.path, wait=False)
        try:
            lock.acquire()
        except LockUnsupported as e:
            # A filesystem without flock (NFS mounted nolock, some FUSE mounts).
            log.warning("cannot lock %s (%s): this filesystem has no flock, so nothing "
                        "stops a second process training into the same directory",
                        self.path, e.strerror)
            return self
        except LockHeld as e:
            raise RunDirectoryError(
                f"{self.flag} {os.path.dirname(self.path)} is in use by another training "
                f"process ({describe_holder(e.holder)}); wait for it or choose another "
                f"directory.") from None
        self._lock = lock
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def check_not_a_file(model_dir: str) -> None:
    """Refuses a ``--model-dir`` that exists as a file."""
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise RunDirectoryError(f"--model-dir {model_dir} is a file, not a directory.")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def clear(model_dir: str, names: Optional[Iterable[str]] = None,
          keep: Callable[[str], bool] = lambda name: False) -> None:
    """Removes ``names`` (default: everything) from ``model_dir``, but the lock this
    process holds and the names ``keep`` keeps."""
    if not os.path.isdir(model_dir):
        return
    for name in os.listdir(model_dir) if names is None else names:
        if name != LOCK_NAME and not keep(name):
            _remove(os.path.join(model_dir, name))


def check_new(model_dir: str, allowed: Callable[[str], bool] = lambda name: False) -> None:
    """Refuses a directory with no ``config.json`` that holds anything but the lock, the
    temporaries of an atomic write (``.*.tmp``) and what ``allowed`` allows: what a run
    killed while it was being created leaves (its ``config.json`` is written last)."""
    left = [n for n in (os.listdir(model_dir) if os.path.isdir(model_dir) else [])
            if n != LOCK_NAME and not allowed(n) and not (n.startswith(".") and n.endswith(".tmp"))]
    if left:
        raise RunDirectoryError(
            f"--model-dir {model_dir} is not empty and holds no tfrs-logq run; choose "
            f"another directory or pass --overwrite to clear it.")


def refuse_other_run(model_dir: str, what: str = "a run with another config") -> None:
    """Refuses a directory whose ``config.json`` is another run's."""
    raise RunDirectoryError(
        f"--model-dir {model_dir} holds {what} (its config.json); choose another "
        f"directory, or pass --overwrite to replace it.")


def refuse_finished(model_dir: str) -> None:
    """Refuses to train again a run that has finished (its ``metrics.json`` exists)."""
    if os.path.exists(os.path.join(model_dir, FINISHED)):
        raise RunDirectoryError(
            f"--model-dir {model_dir} holds this run, finished (metrics.json); pass "
            f"--overwrite to train it again.")


def worker_directory(model_dir: str, strategy: str = "auto") -> str:
    """Where this process keeps its run state: ``model_dir`` itself, except on a
    non-chief worker of a multi-worker cluster (``TF_CONFIG``), which uses
    ``model_dir/worker-TYPE-INDEX``: every worker saves its own checkpoints (the
    collective ops need them all to), and only the chief writes the run's files."""
    if strategy not in ("auto", "multi-worker") or is_chief():
        return model_dir
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    return os.path.join(model_dir, f"{WORKER_PREFIX}{kind}-{index}")


__all__ = ["CONFIG", "FINISHED", "LOCK_NAME", "WORKER_PREFIX", "RunDirectoryError", "RunLock",
           "check_new", "check_not_a_file", "clear", "refuse_finished", "refuse_other_run",
           "worker_directory"]
