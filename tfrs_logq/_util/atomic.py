"""Atomic writes: a reader sees the old file (or directory) or the new one, never a part.

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

A writer that takes a file name rather than a file (a compiler's ``-o``, `np.savez`)
writes to `atomic_path`'s temporary name instead; `save_figure` writes a Matplotlib
figure; `write_csv` a list of dicts. A whole directory (a cache entry, a pipeline
artifact, a model version) is written into a `staging_directory` beside its
destination and renamed into place with `publish_directory`; `remove_stale_staging`
clears what writers that died left behind.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import secrets
import shutil
import tempfile
from typing import IO, Any, Iterable, Iterator, Mapping, Optional, Sequence

_TEMP_SUFFIX = ".tmp"


def _fsync_directory(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform opens directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temporary_name(path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(path)),
                        f".{os.path.basename(path)}.{secrets.token_hex(6)}{_TEMP_SUFFIX}")


def stale_temporaries(path: str | os.PathLike) -> list[str]:
    """The temporaries of ``path`` still beside it (left by a writer that was killed
    before it could remove them). Only a caller that knows no writer of ``path`` is
    running (e.g. under its lock) may remove them."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix, name = f".{os.path.basename(path)}.", os.path.basename(path)
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.startswith(prefix) and n.endswith(_TEMP_SUFFIX)
                  and len(n) == len(name) + 2 + 12 + len(_TEMP_SUFFIX))


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
    tmp = _temporary_name(path)
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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary file name beside ``path`` for a writer that takes a name; on a clean
    exit the file written there is ``fsync``'d and renamed over ``path``.

    The name is reserved (an empty file with the usual permissions) before the block
    runs and ends in ``.tmp``, so a writer that picks its format from the extension
    must be told the format. An exception in the block (or no file left at the name)
    removes the temporary, leaves ``path`` untouched and propagates.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = _temporary_name(path)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
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


def write_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]],
              fieldnames: Optional[Sequence[str]] = None, *, restval: Any = "",
              lineterminator: str = "\r\n") -> None:
    """Writes ``rows`` (dicts) under a header of ``fieldnames`` to ``path`` atomically,
    as `csv.DictWriter` does (a missing field is ``restval``; an unknown one raises
    ValueError and leaves ``path`` untouched).

    Args:
      fieldnames: the columns, in order. Defaults to every field of ``rows``, in the
        order they first appear.
      lineterminator: as `csv.DictWriter`'s. Defaults to ``"\r\n"`` (the csv module's).
    """
    if fieldnames is None:
        rows = list(rows)
        fieldnames = list(dict.fromkeys(field for row in rows for field in row))
    with atomic_write(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fieldnames), restval=restval,
                                lineterminator=lineterminator)
        writer.writeheader()
        writer.writerows(rows)


def save_figure(figure: Any, path: str | os.PathLike, **savefig_options) -> None:
    """``figure.savefig(path, **savefig_options)`` atomically (a Matplotlib figure; the
    format is ``path``'s extension unless ``format`` is given)."""
    path = os.fspath(path)
    options = dict(savefig_options)
    options.setdefault("format", os.path.splitext(path)[1][1:].lower() or None)
    with atomic_write(path, "wb") as f:
        figure.savefig(f, **options)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staging_directory(parent: str | os.PathLike, prefix: str, *,
                      mode: Optional[int] = None) -> Iterator[str]:
    """A fresh directory ``parent/PREFIX<random>`` to build a directory in before
    `publish_directory` renames it into place; removed with its contents if the block
    raises.

    Args:
      parent: the destination's parent (created if missing): the rename must not
        cross a file system.
      prefix: the start of the temporary's name; hidden names (``.tmp-...``) keep
        readers that list ``parent`` from seeing it. A name that holds the writer's
        PID lets a cleaner tell a dead writer's temporary from a live one's.
      mode: the directory's permissions. Defaults to ``0o777`` less the umask (not
        `tempfile.mkdtemp`'s ``0o700``, which would outlive the rename).
    """
    parent = os.fspath(parent)
    os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        os.chmod(path, 0o777 & ~_umask() if mode is None else mode)
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def publish_directory(staging: str | os.PathLike, directory: str | os.PathLike, *,
                      replace: bool = True) -> None:
    """Renames the finished directory ``staging`` to ``directory``.

    Args:
      staging: a complete directory beside ``directory`` (`staging_directory`).
      directory: the destination.
      replace: whether an existing ``directory`` is replaced: it is first renamed
        aside to ``.old-NAME-PID-<random>`` and removed after the new one is in place,
        so a reader sees the old complete directory or the new one (and for a moment
        none). With False an existing ``directory`` raises `FileExistsError` and
        ``staging`` is left as it was (for immutable versions). Defaults to True.
    """
    staging, directory = os.fspath(staging), os.fspath(directory)
    parent = os.path.dirname(os.path.abspath(directory))
    old = None
    if os.path.lexists(directory):
        if not replace:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), directory)
        old = tempfile.mkdtemp(prefix=f".old-{os.path.basename(directory)}-{os.getpid()}-",
                               dir=parent)
        os.rmdir(old)
        os.replace(directory, old)
    if replace:
        os.replace(staging, directory)
    else:
        os.rename(staging, directory)  # an empty directory created meanwhile: replaced
    _fsync_directory(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # alive, another user's
    return True


def remove_stale_staging(parent: str | os.PathLike,
                         prefixes: Sequence[str] = (".tmp-", ".old-")) -> list[str]:
    """Removes what writers that died left in ``parent``: staging directories and
    directories `publish_directory` moved aside, named ``PREFIX...-PID-<random>``.

    The PID is the last all-digit ``-`` field before the random suffix (``.tmp-NAME-PID-
    XXXX``, ``.tmp-VERSION-PID-XXXX``, ``.old-NAME-PID-XXXX``). An entry is removed when
    that process is gone; one without a PID, or of a live process (this one included),
    is kept.

    Returns:
      The names removed, sorted.
    """
    parent = os.fspath(parent)
    removed: list[str] = []
    if not os.path.isdir(parent):
        return removed
    for name in sorted(os.listdir(parent)):
        if not name.startswith(tuple(prefixes)):
            continue
        parts = name.split("-")
        pid = next((int(p) for p in reversed(parts[:-1]) if p.isdigit()), None)
        if pid is None or pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(parent, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
        removed.append(name)
    return removed


__all__ = ["atomic_path", "atomic_write", "publish_directory", "remove_stale_staging",
           "save_figure", "stale_temporaries", "staging_directory", "write_bytes", "write_csv",
           "write_json", "write_text"]
