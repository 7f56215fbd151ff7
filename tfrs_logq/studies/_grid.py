"""What the resumable drivers share: a results table appended to row by row, the runs
still missing a row, and one driver per output directory.

`tfrs_logq.studies.compare` (``tfrs-logq compare``) appends a row to ``results.csv``
(or ``curves.csv``) the moment a run (or an evaluation) finishes, rewriting the whole
file atomically (`append_row`), so a killed driver leaves every finished run's row and a
rerun trains only the runs `missing` one; `exclusive_output_dir` refuses a second driver
on the same directory.
The lab's SASRec grid (``lab/experiment.py``) reads its tables with `read_rows`.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "results.csv")
    >>> append_row(path, {"run_id": "a", "recall@10": 0.5})
    >>> append_row(path, {"run_id": "b", "steps": 4})
    >>> open(path).read()
    'run_id,recall@10,steps\\na,0.5,\\nb,,4\\n'
    >>> missing(["a", "b", "c"], {row["run_id"] for row in read_rows(path)}, lambda r: [r])
    ['c']
"""

from __future__ import annotations

import contextlib
import csv
import os
from typing import Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

from tfrs_logq._util.atomic import write_csv
from tfrs_logq._util.run_directory import RunLock

T = TypeVar("T")


def read_rows(path: str) -> list[dict]:
    """The rows of the CSV file ``path`` (strings, as `csv.DictReader` reads them), or []
    when there is no file yet."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: str, rows: Sequence[dict]) -> None:
    """Replaces ``path`` atomically with ``rows`` under a header of every field, in the
    order the fields first appear (a field a row lacks is empty), lines ending in
    ``"\\n"``."""
    write_csv(path, rows, lineterminator="\n")


def append_row(path: str, row: dict) -> None:
    """Appends ``row`` to the table ``path`` (created if missing): the whole file is
    rewritten atomically (`write_rows`), so a reader or a killed writer never sees part
    of a row."""
    write_rows(path, read_rows(path) + [row])


def missing(items: Iterable[T], done: set, keys: Callable[[T], Iterable[Hashable]]) -> list[T]:
    """The ``items``, in order, some of whose row keys (``keys(item)``: the keys of the
    rows the item writes) are not in ``done``."""
    return [item for item in items if not done.issuperset(keys(item))]


def check_output_dir(output_dir: str) -> None:
    """Refuses, in one line, an ``--output-dir`` that exists and is not a directory."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output-dir {output_dir} exists and is a file: give a directory "
                         f"(new, or one this command wrote).")


@contextlib.contextmanager
def exclusive_output_dir(output_dir: str) -> Iterator[str]:
    """Creates ``output_dir`` and holds its `RunLock` for the block: a second driver on
    the same directory is refused at once, naming ``--output-dir``."""
    check_output_dir(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    with RunLock(output_dir, "--output-dir"):
        yield output_dir


__all__ = ["append_row", "check_output_dir", "exclusive_output_dir", "missing", "read_rows",
           "write_rows"]
