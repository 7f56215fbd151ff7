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
SMALL = ("--losses", "inbatch-logq-tfrs,inbatch-corrected", "--steps", "2", "--eval-every",
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


def _one_error(proc, message):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_a_seed_beyond_32_bits_is_refused_before_anything_is_written(clicks, tmp_path, capsys):
    out = tmp_path / "out"
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, *SMALL,
                          "--seeds", "0,4294967296", "--output-dir", str(out))
    _one_error(proc, "--seeds: must be <= 4294967295, got 4294967296")
    assert not out.exists()
