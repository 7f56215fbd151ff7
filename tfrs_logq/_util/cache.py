"""Where tfrs-logq caches files: downloads, preprocessed data, compiled kernels.

One variable chooses it, ``TFRS_LOGQ_CACHE_DIR``; then ``$XDG_CACHE_HOME/tfrs_logq``;
then ``~/.cache/tfrs_logq``. ``TFRS_LOGQ_CACHE``, the name the native kernels used to
read, is still honoured for one release with a `DeprecationWarning` (and ignored,
with the same warning, when ``TFRS_LOGQ_CACHE_DIR`` is set too). An empty value
counts as unset.

    >>> import os
    >>> os.environ["TFRS_LOGQ_CACHE_DIR"] = "/tmp/tfrs-logq-cache"
    >>> cache_dir()
    '/tmp/tfrs-logq-cache'
    >>> del os.environ["TFRS_LOGQ_CACHE_DIR"]
"""

from __future__ import annotations

import os
import warnings

CACHE_ENV = "TFRS_LOGQ_CACHE_DIR"
DEPRECATED_CACHE_ENV = "TFRS_LOGQ_CACHE"


def cache_dir() -> str:
    """The cache directory (it may not exist yet): see the module docstring."""
    root = os.environ.get(CACHE_ENV)
    deprecated = os.environ.get(DEPRECATED_CACHE_ENV)
    if deprecated:
        what = (f"ignored because {CACHE_ENV} is set" if root
                else f"read for now; set {CACHE_ENV} instead")
        warnings.warn(f"{DEPRECATED_CACHE_ENV} is deprecated and will be removed in the next "
                      f"release: it is {what}.", DeprecationWarning, stacklevel=2)
        root = root or deprecated
    if root:
        return root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfrs_logq")


__all__ = ["CACHE_ENV", "DEPRECATED_CACHE_ENV", "cache_dir"]
