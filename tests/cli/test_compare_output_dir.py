"""`tfrs-logq compare`'s output directory: a plan pins every setting that changes a
result (the split, its fraction, the filters, the data's content), seeds only add,
and bad input (seeds, a foreign results.csv, an edited plan.json or results.csv) is
refused in one line, exit code 2, before anything is written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_process import cli_in_process

LOG = ("--user-column", "user", "--item-column", "item", "--time-column", "ts")
SMALL = ("--loss", "inbatch-logq-tfrs", "inbatch-corrected", "--steps", "2", "--eval-every",
         "2", "--window", "1", "--batch-size", "16", "--embedding-dim", "4",
         "--min-item-interactions", "1")


def _write(path, rows, header="user,item,ts"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return str(path)


def _rows(seed=3):
    rng = np.random.default_rng(seed)
    return [(f"u{u}", f"sku-{int(rng.integers(0, 40))}", 1_700_000_000 + u * 100 + t)
            for u in range(120) for t in range(12)]


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("log") / "clicks.csv", _rows())


def _cell(line, index, value):
    cells = line.split(",")
    cells[index] = value
    return ",".join(cells)


def _one_error(proc, message):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_seed_beyond_32_bits_is_refused_before_anything_is_written(clicks, tmp_path, capsys):
    out = tmp_path / "out"
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                          "--seeds", "0", "4294967296", "--output-dir", str(out))
    _one_error(proc, "--seeds: must be <= 4294967295, got 4294967296")
    assert not out.exists()


@pytest.fixture(scope="module")
def finished(clicks, tmp_path_factory):
    """Runs a comparison of seeds 0 and 1 at --temporal-fraction 0.3 into a fresh directory
    (the call returns the directory and the flags)."""
    def make(capsys, path):
        out = str(path)
        proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                              "--temporal-fraction", "0.3", "--seeds", "0", "1",
                              "--output-dir", out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return out
    return make


def test_another_split_fraction_or_edited_data_is_refused_more_seeds_are_not(
        clicks, finished, tmp_path, capsys):
    out = finished(capsys, tmp_path / "out")
    results = open(os.path.join(out, "results.csv")).read()
    other = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                           "--temporal-fraction", "0.2", "--seeds", "0", "1", "--output-dir", out)
    _one_error(other, "data.temporal_fraction 0.3 there, 0.2 now")
    # The same sizes with other content (a log edited in place) is other data.
    edited = [(u, i, t) for u, i, t in _rows()]
    edited[7] = (edited[7][0], "sku-39" if edited[7][1] != "sku-39" else "sku-38", edited[7][2])
    copy = tmp_path / "clicks.csv"
    _write(copy, _rows())
    first = cli_in_process(capsys, "compare", "--interactions", str(copy), *LOG, *SMALL,
                           "--temporal-fraction", "0.3", "--seeds", "0",
                           "--output-dir", str(tmp_path / "copy"))
    assert first.returncode == 0, first.stderr[-3000:]
    _write(copy, edited)
    again = cli_in_process(capsys, "compare", "--interactions", str(copy), *LOG, *SMALL,
                           "--temporal-fraction", "0.3", "--seeds", "0", "1",
                           "--output-dir", str(tmp_path / "copy"))
    _one_error(again, "data.fingerprint ")
    assert open(os.path.join(out, "results.csv")).read() == results
    # A rerun naming fewer seeds keeps the planned ones; a new seed adds to them.
    fewer = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                           "--temporal-fraction", "0.3", "--seeds", "0", "--output-dir", out)
    assert fewer.returncode == 0, fewer.stderr[-3000:]
    assert "4 runs (2 losses x 2 seeds)" in fewer.stdout and "0 to train" in fewer.stdout
    assert json.load(open(os.path.join(out, "plan.json")))["seeds"] == [0, 1]
    more = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                          "--temporal-fraction", "0.3", "--seeds", "2", "--output-dir", out)
    assert more.returncode == 0 and "2 to train" in more.stdout, more.stderr[-3000:]
    assert json.load(open(os.path.join(out, "plan.json")))["seeds"] == [0, 1, 2]
    # Another model into the directory: the model is named, not its settings' defaults.
    sasrec = cli_in_process(capsys, "compare", "sasrec", "--interactions", clicks, *LOG,
                            "--temporal-fraction", "0.3", "--seeds", "0", "--output-dir", out)
    _one_error(sasrec, "holds a two-tower comparison, not sasrec: rerun it with `compare "
                       "two-tower`")


def test_a_folder_with_a_foreign_results_csv_is_refused_untouched(clicks, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.csv").write_text("name,score\na,1\n")
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                          "--seeds", "0", "--output-dir", str(out))
    _one_error(proc, "holds results.csv but no plan.json")
    assert sorted(os.listdir(out)) == ["results.csv"]


@pytest.mark.parametrize("edit, message", [
    (lambda p: {k: v for k, v in p.items() if k != "fixed"}, "no `fixed` object"),
    (lambda p: {**p, "fixed": {**p["fixed"], "window": "3"}}, "`fixed.window` must be"),
    (lambda p: {**p, "losses": []}, "`losses` must list two or more"),
    (lambda p: [p], "a JSON list, not an object"),
    (lambda p: {**p, "seeds": [0, 2**32]}, "`seeds` must list"),
    (None, "invalid JSON at line 1"),
])
def test_an_edited_plan_json_is_named_in_one_line(finished, tmp_path, capsys, edit, message):
    from tfrs_logq.studies.compare.plan import CompareError, load_plan

    if not hasattr(test_an_edited_plan_json_is_named_in_one_line, "out"):
        test_an_edited_plan_json_is_named_in_one_line.out = finished(capsys, tmp_path / "out")
    out = test_an_edited_plan_json_is_named_in_one_line.out
    path = os.path.join(out, "plan.json")
    saved = open(path).read()
    try:
        with open(path, "w") as f:
            f.write("{not json" if edit is None else json.dumps(edit(json.loads(saved))))
        with pytest.raises(CompareError, match=message) as error:
            load_plan(out)
        assert path in str(error.value) and "\n" not in str(error.value)
        proc = cli_in_process(capsys, "compare", "--report-only", "--output-dir", out)
        _one_error(proc, f"{path} is not a plan")
    finally:
        open(path, "w").write(saved)


@pytest.mark.parametrize("edit, message", [
    (lambda lines: lines[:-1] + [",".join(lines[-1].split(",")[:3])], "line 5 has fewer cells"),
    (lambda lines: lines[:-1] + [_cell(lines[-1], 6, "abc")],
     "line 5: recall@10 is 'abc', not a number"),
    (lambda lines: lines[:-1] + [_cell(lines[-1], 6, "1.7")],
     "line 5: recall@10 is 1.7, outside [0, 1]"),
    (lambda lines: lines[:-1] + [_cell(lines[-1], 6, "-0.3")],
     "line 5: recall@10 is -0.3, outside [0, 1]"),
    (lambda lines: lines + [lines[-1]], "line 6 repeats the run"),
    (lambda lines: [lines[0] + ",recall@5"] + [line + ",0.1" for line in lines[1:]],
     "a column 'recall@5'"),
])
def test_a_damaged_results_csv_is_a_damaged_file_not_a_diverged_run(
        finished, tmp_path, capsys, edit, message):
    if not hasattr(test_a_damaged_results_csv_is_a_damaged_file_not_a_diverged_run, "out"):
        test_a_damaged_results_csv_is_a_damaged_file_not_a_diverged_run.out = finished(
            capsys, tmp_path / "out")
    out = test_a_damaged_results_csv_is_a_damaged_file_not_a_diverged_run.out
    path = os.path.join(out, "results.csv")
    saved = open(path).read()
    lines = saved.splitlines()
    assert lines[0].split(",")[6] == "recall@10", lines[0]
    try:
        open(path, "w").write("\n".join(edit(lines)) + "\n")
        proc = cli_in_process(capsys, "compare", "--report-only", "--output-dir", out)
        _one_error(proc, f"{path} {message}" if message.startswith("line") else message)
        assert "Diverged" not in proc.stdout
    finally:
        open(path, "w").write(saved)
