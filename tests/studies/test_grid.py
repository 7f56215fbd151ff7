"""`tfrs_logq.studies._grid`, what the resumable drivers (the study's, ``compare``'s) share:
the results table appended to row by row, the runs still missing a row, one driver per
output directory."""

import os

import pytest

from tfrs_logq.sasrec.run import RunDirectoryError
from tfrs_logq.studies import _grid


def test_append_row_keeps_every_field_in_first_seen_order_and_no_temporary(tmp_path):
    path = str(tmp_path / "results.csv")
    assert _grid.read_rows(path) == []
    _grid.append_row(path, {"run_id": "a", "recall@10": 0.25})
    _grid.append_row(path, {"run_id": "b, quoted", "steps": 4})
    _grid.append_row(path, {"steps": 8, "run_id": "c"})
    with open(path, newline="") as f:
        assert f.read() == ('run_id,recall@10,steps\na,0.25,\n"b, quoted",,4\nc,,8\n')
    assert _grid.read_rows(path) == [{"run_id": "a", "recall@10": "0.25", "steps": ""},
                                     {"run_id": "b, quoted", "recall@10": "", "steps": "4"},
                                     {"run_id": "c", "recall@10": "", "steps": "8"}]
    assert os.listdir(tmp_path) == ["results.csv"]


def test_missing_keeps_the_items_with_a_row_not_written_in_order():
    done = {"a", "b1", "b2", "c1"}
    runs = {"a": ["a"], "b": ["b1", "b2"], "c": ["c1", "c2"], "d": ["d"], "e": []}
    assert _grid.missing(runs, done, runs.get) == ["c", "d"]
    assert _grid.missing(iter([("x", 1), ("y", 0)]), {("x", 1)}, lambda pair: [pair]) == [
        ("y", 0)]


def test_exclusive_output_dir_creates_the_directory_and_refuses_a_second_driver(tmp_path):
    out = str(tmp_path / "new" / "grid")
    with _grid.exclusive_output_dir(out) as held:
        assert held == out and os.path.isdir(out)
        with pytest.raises(RunDirectoryError, match="--output-dir"):
            with _grid.exclusive_output_dir(out):
                pass
    with _grid.exclusive_output_dir(out):  # released with the block
        pass
