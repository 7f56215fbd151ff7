"""Artifact manifests of the batch pipeline: reading one and verifying its files.

A Beam-free, TensorFlow-free part of `tfrs_logq.pipelines.beam.artifacts` (which
re-exports every name here and describes the layout), so the training configuration
(`tfrs_logq.sasrec.config.examples_config`) can read an ExampleGen artifact without importing
the pipeline's layer. ``manifest.json`` holds ``outputs``: the sha256 of every file of
the artifact, keyed by its path relative to the artifact directory; a reader
(`verified_manifest`) refuses an artifact whose files do not match, naming the file.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from tfrs_logq._util.fingerprint import file_fingerprint

MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """An artifact that is missing, incomplete or does not match its manifest; the
    message names the artifact and the file."""


def output_fingerprints(directory: str) -> dict:
    """``{relative path: sha256}`` of every file under ``directory`` but the manifest,
    sorted by path (``/``-separated)."""
    found = {}
    for parent, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(parent, name)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if rel != MANIFEST:
                found[rel] = file_fingerprint(path)
    return dict(sorted(found.items()))


def read_manifest(directory: str) -> Optional[dict]:
    """The artifact's manifest, or None when it has none (not built, or not finished).

    Raises:
      ArtifactError: the manifest is unreadable or not a JSON object.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is unreadable ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
        raise ArtifactError(f"{path} is not an artifact manifest")
    return manifest


def mismatch(directory: str, manifest: dict) -> Optional[str]:
    """Why the files of ``directory`` differ from ``manifest["outputs"]`` (the first
    file missing, altered or added), or None when every file verifies."""
    expected = manifest["outputs"]
    found = output_fingerprints(directory)
    for rel, digest in expected.items():
        if rel not in found:
            return f"{os.path.join(directory, rel)} is missing"
        if found[rel] != digest:
            return (f"{os.path.join(directory, rel)} was altered (its sha256 differs from "
                    "the manifest's)")
    extra = sorted(set(found) - set(expected))
    if extra:
        return f"{os.path.join(directory, extra[0])} is not in the manifest"
    return None


def verified_manifest(directory: str, component: Optional[str] = None) -> dict:
    """The manifest of a complete artifact whose files all verify.

    Raises:
      ArtifactError: no artifact, one of another component, or one whose files do not
        match its manifest (the message names the file and says to rerun the pipeline).
    """
    manifest = read_manifest(directory)
    if manifest is None:
        raise ArtifactError(f"{directory} holds no finished artifact (no {MANIFEST}); run "
                            "`tfrs-logq pipeline run` to build it.")
    if component is not None and manifest.get("component") != component:
        raise ArtifactError(f"{directory} is a {manifest.get('component')} artifact, not "
                            f"{component}.")
    problem = mismatch(directory, manifest)
    if problem is not None:
        raise ArtifactError(f"{problem}: the artifact is damaged and is not used; rerun "
                            "`tfrs-logq pipeline run` to rebuild it.")
    return manifest


__all__ = ["MANIFEST", "ArtifactError", "mismatch", "output_fingerprints", "read_manifest",
           "verified_manifest"]
