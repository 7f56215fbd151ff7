"""TensorFlow's start-up lines, filtered as ``TF_CPP_MIN_LOG_LEVEL`` asks, on TF 2.21 too.

TensorFlow 2.20 honours ``TF_CPP_MIN_LOG_LEVEL`` (which `tfrs-logq` sets to 3
unless ``--verbose``, keeping a value the user set). TensorFlow 2.21 logs through
absl, and the lines its libraries write while loading, before absl is set up
(``WARNING: All log messages before absl::InitializeLog() ...``, oneDNN's
``port.cc``, ``cudart_stub.cc``), ignore it. `install` adds an import hook that
runs ``import tensorflow`` with the process's stderr (file descriptor 2) sent to a
temporary file, then writes back every line but the log records below that level
(and that absl banner). Anything else written meanwhile (a Python warning, an
error) comes through unchanged; a ``TF_CPP_MIN_LOG_LEVEL`` unset or 0 (``--verbose``)
leaves the import alone.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

# TensorFlow's C++ log records: absl's "I0000 00:00:17.. 123 port.cc:153] ..." (TF 2.21)
# and TSL's "YYYY-MM-DD hh:mm:ss.fff: I tensorflow/...cc:31] ..." (TF 2.20).
_RECORD = re.compile(r"^(?:([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ |"
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) )\S+:\d+\] ")
_ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called"
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


def min_log_level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it (0 when unset or not a number)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def filter_log(text: str, level: int) -> str:
    """``text`` without the log records below ``level`` (and their continuation lines)."""
    kept, dropping = [], False
    for line in text.splitlines(keepends=True):
        record = _RECORD.match(line)
        if record:
            severity = _SEVERITY[record.group(1) or record.group(2)]
            dropping = severity < min(level, 3)
        elif line.startswith(_ABSL_BANNER):
            dropping = level > 0
        elif not dropping or re.match(r"^\S.*:\d+: \w+(Warning|Error)\b", line):
            dropping = False  # not a record's continuation (a Python warning, say)
        if not dropping:
            kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def filtered_stderr(level: int):
    """File descriptor 2 goes to a temporary file; at exit, its text minus `filter_log`."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr descriptor: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = filter_log(captured.read().decode("utf-8", "replace"), level)
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do, and loads it in `filtered_stderr`."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        uninstall()  # once: the first import of tensorflow
        level = min_log_level()
        spec = importlib.util.find_spec(name)  # by the other finders
        if level <= 0 or spec is None or spec.loader is None:
            return spec
        loader, exec_module = spec.loader, spec.loader.exec_module

        def quiet_exec_module(module):
            try:
                with filtered_stderr(level):
                    exec_module(module)
            finally:
                with contextlib.suppress(AttributeError):
                    del loader.exec_module  # the loader's own method again

        loader.exec_module = quiet_exec_module
        return spec


_FINDER = _QuietTensorFlowImport()


def install() -> None:
    """Filters the start-up lines of the first ``import tensorflow`` (not yet imported)."""
    if "tensorflow" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_FINDER)
