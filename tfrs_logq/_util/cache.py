"""Where tfrs-logq caches files: downloads, preprocessed data, compiled kernels.

One variable chooses it, ``TFRS_LOGQ_CACHE_DIR``; then ``$XDG_CACHE_HOME/tfrs_logq``;
then ``~/.cache/tfrs_logq``. An empty value counts as unset.

    >>> import os
    >>> os.environ["TFRS_LOGQ_CACHE_DIR"] = "/tmp/tfrs-logq-cache"
    >>> cache_dir()
    '/tmp/tfrs-logq-cache'
    >>> del os.environ["TFRS_LOGQ_CACHE_DIR"]
"""

from __future__ import annotations

import os

CACHE_ENV = "TFRS_LOGQ_CACHE_DIR"


def cache_dir() -> str:
    """The cache directory (it may not exist yet): see the module docstring."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfrs_logq")


__all__ = ["CACHE_ENV", "cache_dir"]
