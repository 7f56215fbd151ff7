"""Artifacts of the batch pipeline: one directory per component, described by its manifest.

Under ``--pipeline-root``::

    ROOT/
      .lock                        held by the run using ROOT (a file lock)
      ExampleGen/manifest.json     ...and the component's files
      Statistics/manifest.json
      .tmp-Statistics-PID-XXXX/    a component being written (removed when PID is gone)

``manifest.json`` records what the artifact was made from and what it holds:
``component`` and its ``version``, ``inputs`` (each with the sha256 of what it
was read from: a data file, or another artifact's outputs), ``parameters``,
``counts``, and ``outputs``: the sha256 of every file of the artifact, keyed by
its path relative to the artifact directory.

An artifact is *current* when its manifest matches the inputs and parameters of
the run and every file verifies (`verify`: no file missing, none altered, none
added). Otherwise it is rebuilt, and a reader (`verified_manifest`) refuses it,
naming the file: a damaged artifact is never trusted.

Writing: a component writes into ``.tmp-NAME-PID-XXXX`` beside its directory,
the manifest last, then renames that into place (`publish`); a reader sees the
old complete artifact, no artifact, or the new complete one, never half of one.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
from typing import Callable, Iterator, Optional

from tfrs_logq._util import atomic
from tfrs_logq._util.atomic import write_json
from tfrs_logq._util.locks import ExclusiveLock, LockHeld, LockUnsupported, describe_holder

# Reading and verifying a manifest, Beam-free (re-exported here).
from tfrs_logq.pipelines.manifest import (  # noqa: F401
    MANIFEST,
    ArtifactError,
    mismatch,
    output_fingerprints,
    read_manifest,
    verified_manifest,
)

log = logging.getLogger(__name__)

LOCK = ".lock"
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"


def artifact_input(directory: str, component: str) -> dict:
    """An upstream artifact as a manifest input: its component and the sha256 of its
    files (by content, so a moved pipeline root is still current).

    Raises:
      ArtifactError: no finished artifact of ``component``, or a damaged one.
    """
    manifest = verified_manifest(directory, component)
    return {"component": manifest["component"], "sha256": manifest["outputs"]}


def stale_reason(directory: str, component: str, version: int, inputs: dict,
                 parameters: dict) -> Optional[str]:
    """None when the artifact in ``directory`` is current for these inputs and
    parameters and its files verify; otherwise why it must be (re)built."""
    try:
        manifest = read_manifest(directory)
    except ArtifactError as exc:
        return str(exc)
    if manifest is None:
        return "not built yet"
    if manifest.get("component") != component or manifest.get("version") != version:
        return (f"written by {manifest.get('component')} version {manifest.get('version')}, "
                f"this is version {version}")
    if manifest.get("inputs") != inputs:
        changed = sorted(k for k in set(inputs) | set(manifest.get("inputs") or {})
                         if inputs.get(k) != (manifest.get("inputs") or {}).get(k))
        return f"its inputs changed ({', '.join(changed)})"
    if manifest.get("parameters") != parameters:
        old = manifest.get("parameters") or {}
        changed = sorted(k for k in set(parameters) | set(old) if parameters.get(k) != old.get(k))
        return "its parameters changed (" + ", ".join(
            f"{k}: {old.get(k)!r} -> {parameters.get(k)!r}" for k in changed) + ")"
    return mismatch(directory, manifest)


def write_manifest(staging: str, record: dict) -> dict:
    """Fingerprints the staged files and writes ``manifest.json`` (last, atomically)."""
    manifest = {**record, "outputs": output_fingerprints(staging),
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
    write_json(os.path.join(staging, MANIFEST), manifest, indent=1)
    return manifest


def staging_directory(root: str, component: str) -> contextlib.AbstractContextManager[str]:
    """A fresh ``ROOT/.tmp-COMPONENT-PID-XXXX`` directory, removed if the block fails
    (`tfrs_logq._util.atomic.staging_directory`)."""
    return atomic.staging_directory(root, f"{_TMP_PREFIX}{component}-{os.getpid()}-")


def publish(staging: str, directory: str) -> None:
    """Moves a finished ``staging`` directory to ``directory``, replacing any old one
    (moved aside to ``.old-NAME-PID-XXXX`` first: `tfrs_logq._util.atomic.publish_directory`)."""
    atomic.publish_directory(staging, directory)


def remove_stale(root: str) -> list[str]:
    """Removes ``.tmp-*`` / ``.old-*`` directories left by runs that died (their PID is
    gone); returns what was removed (`tfrs_logq._util.atomic.remove_stale_staging`)."""
    return atomic.remove_stale_staging(root, (_TMP_PREFIX, _OLD_PREFIX))


@contextlib.contextmanager
def locked(root: str, undo: Optional[Callable[[], bool]] = None) -> Iterator[None]:
    """Holds ``ROOT/.lock`` for the block (`tfrs_logq._util.locks.ExclusiveLock`); a second
    run on the same root is refused at once, naming the process that holds it. On a
    filesystem that cannot lock, a warning, and the run goes on.

    When the block raises and ``undo()`` is true (say, no component finished), what the
    run added to ROOT is removed before the lock is released (`_remove_added`): ROOT
    itself, its missing parents and ``.lock`` where the run made them, and the entries of
    ROOT and of its directories that were not there when the lock was taken. What was
    there is left as it was.

    Raises:
      ArtifactError: another pipeline run holds the root.
    """
    made = _missing_directories(root)  # ROOT and the parents makedirs will create
    lock_path = os.path.join(root, LOCK)
    made_lock = not os.path.lexists(lock_path)
    os.makedirs(root, exist_ok=True)
    lock = ExclusiveLock(lock_path, wait=False)
    held = False
    try:
        lock.acquire()
        held = True
    except LockUnsupported as e:
        log.warning("cannot lock %s (%s): this filesystem has no flock, so nothing stops a "
                    "second pipeline run on the same root", lock.path, e.strerror)
    except LockHeld as e:
        raise ArtifactError(f"--pipeline-root {root} is in use by another pipeline run "
                            f"({describe_holder(e.holder)}); wait for it to finish.") from None
    try:
        before = _entries(root)  # while the lock is held nothing else adds to ROOT
        try:
            yield
        except BaseException:
            if undo is not None and undo():
                _remove_added(root, before, made_lock, made)
            raise
    finally:
        if held:
            lock.release()


def _missing_directories(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _entries(root: str) -> set[str]:
    """The names in ``root`` and, as ``DIR/NAME``, in each of its directories."""
    names = set()
    for name in os.listdir(root):
        names.add(name)
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            names.update(f"{name}/{inner}" for inner in os.listdir(path))
    return names


def _remove_added(root: str, before: set[str], made_lock: bool, made: list[str]) -> None:
    """Removes what is in ``root`` now and was not in ``before`` (`_entries`), then its
    ``.lock`` if ``made_lock`` and the directories ``made`` (deepest first) where empty.
    The lock file goes last, so no other run can take ROOT while this one empties it;
    a run that takes it in between keeps ROOT (its own ``.lock`` is in it)."""
    for name in sorted(_entries(root) - before - {LOCK}, key=lambda n: -n.count("/")):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    if made_lock:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(root, LOCK))
    for directory in made:
        try:
            os.rmdir(directory)
        except OSError:  # not empty (another run's lock, or a file of someone else's)
            break
