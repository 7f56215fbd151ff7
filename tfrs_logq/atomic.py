"""Atomic file writes: a reader sees the old file or the new one, never a part.

Every write goes to a temporary file in the destination's own directory (so the
rename never crosses a file system), is flushed and ``fsync``'d, then renamed over
the destination with `os.replace`; the directory is ``fsync``'d after the rename
(where the platform allows) so the rename itself survives a crash. If anything
fails before the rename, the temporary file is removed and the old file is left
as it was. The new file gets the usual permissions (``0o666`` less the umask),
not ``mkstemp``'s ``0o600``.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "result.json")
    >>> write_json(path, {"recall@10": 0.25})
    >>> open(path).read()
    '{\\n  "recall@10": 0.25\\n}\\n'
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import IO, Any, Iterator

_TEMP_SUFFIX = ".tmp"


def _fsync_directory(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform opens directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *,
                 encoding: str | None = None, newline: str | None = None) -> Iterator[IO]:
    """Opens a temporary file beside ``path``; on a clean exit it replaces ``path``.

    Args:
      path: the destination file.
      mode: ``"w"`` (text) or ``"wb"`` (bytes). Defaults to ``"w"``.
      encoding: text encoding (text mode only). Defaults to UTF-8.
      newline: as `open`'s (text mode only).

    Yields:
      The open temporary file. An exception in the block removes it, leaves
      ``path`` untouched and propagates.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb', received {mode!r}.")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory,
                       f".{os.path.basename(path)}.{secrets.token_hex(6)}{_TEMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        text = {} if mode == "wb" else {"encoding": encoding or "utf-8", "newline": newline}
        with os.fdopen(fd, mode, **text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    _fsync_directory(directory)


def write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    """Writes ``text`` to ``path`` atomically."""
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically."""
    with atomic_write(path, "wb") as f:
        f.write(data)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2,
               **dump_options) -> None:
    """Writes ``obj`` as JSON (and a final newline) to ``path`` atomically.

    The object is serialised before the file is opened, so an object that is not
    JSON-serialisable leaves no trace."""
    write_text(path, json.dumps(obj, indent=indent, **dump_options) + "\n")


__all__ = ["atomic_write", "write_bytes", "write_json", "write_text"]
