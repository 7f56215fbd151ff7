"""Content digests: a file's sha256 (manifests, caches, checkpoints' code keys)."""

from __future__ import annotations

import hashlib


def file_fingerprint(path: str) -> str:
    """sha256 of a file's bytes (streamed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["file_fingerprint"]
