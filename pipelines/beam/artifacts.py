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
from typing import Iterator, Optional

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
def locked(root: str) -> Iterator[None]:
    """Holds ``ROOT/.lock`` for the block (`tfrs_logq._util.locks.ExclusiveLock`); a second
    run on the same root is refused at once, naming the process that holds it. On a
    filesystem that cannot lock, a warning, and the run goes on.

    Raises:
      ArtifactError: another pipeline run holds the root.
    """
    os.makedirs(root, exist_ok=True)
    lock = ExclusiveLock(os.path.join(root, LOCK), wait=False)
    try:
        lock.acquire()
    except LockUnsupported as e:
        log.warning("cannot lock %s (%s): this filesystem has no flock, so nothing stops a "
                    "second pipeline run on the same root", lock.path, e.strerror)
        yield
        return
    except LockHeld as e:
        raise ArtifactError(f"--pipeline-root {root} is in use by another pipeline run "
                            f"({describe_holder(e.holder)}); wait for it to finish.") from None
    try:
        yield
    finally:
        lock.release()
