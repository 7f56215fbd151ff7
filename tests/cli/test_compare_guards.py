"""`tfrs-logq data stats` and `compare` on logs a newcomer brings: degenerate splits
refused in one line before any work, bounds checked before training, the facts of the
log (duplicates, repeats, cold targets, dates) shown, the window fitted to the steps."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cli_process import cli_in_process

LOG = ("--user-column", "user", "--item-column", "item")


def _write(path, rows, header="user,item,ts"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """120 users of 12 clicks on 40 items (repeats common), one row written twice."""
    rng = np.random.default_rng(3)
    rows = [(f"u{u}", f"sku-{int(rng.integers(0, 40))}", 1_700_000_000 + u * 100 + t)
            for u in range(120) for t in range(12)]
    rows.append(rows[5])
    return _write(tmp_path_factory.mktemp("log") / "clicks.csv", rows)


def _one_error(proc, message):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_data_stats_shows_duplicates_repeats_and_dates(clicks, capsys):
    proc = cli_in_process(capsys, "data", "stats", "--interactions", clicks, *LOG,
                          "--time-column", "ts", "--min-item-interactions", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 rows repeat an earlier row exactly" in proc.stdout
    assert "time range: 2023-11-14 22:13:20 .. 2023-11-15 01:31:51 UTC\n" in proc.stdout
    assert "repeat targets 0." in proc.stdout and "cold targets 0.000" in proc.stdout


def test_a_one_user_log_is_refused_not_scored_1(tmp_path, capsys):
    rows = [("u0", f"sku-{i % 30}", i) for i in range(300)]
    log = _write(tmp_path / "one.csv", rows)
    proc = cli_in_process(capsys, "compare", "--interactions", log, *LOG, "--time-column",
                          "ts", "--steps", "4", "--eval-every", "2", "--output-dir",
                          str(tmp_path / "out"))
    _one_error(proc, "the test split has 1 user(s)")
    assert not os.path.exists(tmp_path / "out")


def test_cold_test_items_are_refused(tmp_path, capsys):
    # Each user's last clicks are on items nobody clicked before: every test target cold.
    rows = [(f"u{u}", f"old-{(u + t) % 20}", u * 100 + t) for u in range(60) for t in range(10)]
    rows += [(f"u{u}", f"new-{u % 5}", 10_000_000 + u) for u in range(60)]
    log = _write(tmp_path / "cold.csv", rows)
    proc = cli_in_process(capsys, "compare", "--interactions", log, *LOG, "--time-column",
                          "ts", "--split", "loo", "--min-item-interactions", "1", "--steps",
                          "4", "--eval-every", "2", "--output-dir", str(tmp_path / "out"))
    _one_error(proc, "every test target is an item never seen in training")


def test_a_tiny_catalog_is_refused(tmp_path, capsys):
    rows = [(f"u{u}", f"sku-{(u + t) % 6}", u * 100 + t) for u in range(50) for t in range(8)]
    log = _write(tmp_path / "tiny.csv", rows)
    proc = cli_in_process(capsys, "compare", "--interactions", log, *LOG, "--split", "loo",
                          "--steps", "4", "--eval-every", "2",
                          "--output-dir", str(tmp_path / "out"))
    _one_error(proc, "the catalog has 6 items")


def test_a_batch_larger_than_the_training_examples_is_refused(clicks, tmp_path, capsys):
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, "--split", "loo",
                          "--batch-size", "1000000", "--steps", "4", "--eval-every", "2",
                          "--output-dir", str(tmp_path / "out"))
    _one_error(proc, "--batch-size 1,000,000 is larger than the")
    assert not os.path.exists(tmp_path / "out")


def test_a_run_that_would_not_fit_in_memory_is_refused(clicks, tmp_path, capsys, monkeypatch):
    from tfrs_logq._util import hostinfo

    monkeypatch.setattr(hostinfo, "available_memory_bytes", lambda: 2**20)
    from tfrs_logq.studies.compare import runner as compare_runner

    monkeypatch.setattr(compare_runner, "available_memory_bytes", lambda: 2**20)
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, "--split", "loo",
                          "--steps", "4", "--eval-every", "2",
                          "--output-dir", str(tmp_path / "out"))
    _one_error(proc, "GiB available: lower --batch-size")


def test_few_steps_take_a_window_of_the_evaluations_there_are(clicks, tmp_path, capsys):
    from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
    from tfrs_logq.studies._grid import read_rows

    out = str(tmp_path / "out")
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, "--time-column",
                          "ts", "--split", "temporal", "--temporal-fraction", "0.3",
                          "--min-item-interactions", "1", "--loss",
                          "inbatch-logq-tfrs", "inbatch-corrected", "--seeds", "0", "--steps",
                          "6", "--batch-size", "16", "--embedding-dim", "4",
                          "--output-dir", out)
    assert proc.returncode == 0, proc.stderr[-3000:]  # 6 steps: one evaluation, window 1
    report = open(os.path.join(out, "report.md")).read()
    assert "a direction, not a verdict" in report  # one pair
    assert "estimated peak memory of a run" in proc.stdout
    # --temporal-fraction reaches the split, as in train and data stats.
    split = load_user_log_split(UserLogSource(clicks, "user", "item", time_column="ts"),
                                "temporal", temporal_fraction=0.3, min_item_interactions=1)
    rows = read_rows(os.path.join(out, "results.csv"))
    assert {int(float(r["num_targets"])) for r in rows} == {len(split.test)}


def test_an_output_dir_that_is_a_file_is_named_so(clicks, tmp_path, capsys):
    path = tmp_path / "a_file"
    path.write_text("x")
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG,
                          "--output-dir", str(path))
    _one_error(proc, f"--output-dir {path} exists and is a file")


def test_millisecond_times_are_shown_as_dates_and_named(tmp_path, capsys):
    rows = [(f"u{u}", f"sku-{(u * 7 + t) % 40}", 1_700_000_000_000 + u * 100_000 + t * 1000)
            for u in range(60) for t in range(10)]
    log = _write(tmp_path / "ms.csv", rows)
    proc = cli_in_process(capsys, "data", "stats", "--interactions", log, *LOG,
                          "--time-column", "ts")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "time range: 2023-11-14 22:13:20 .. 2023-11-14 23:51:49 UTC (the times are epoch " \
           "milliseconds)" in proc.stdout


def test_a_sasrec_run_that_would_not_fit_in_memory_is_refused(clicks, tmp_path, capsys,
                                                               monkeypatch):
    from tfrs_logq.studies.compare import runner as compare_runner

    monkeypatch.setattr(compare_runner, "available_memory_bytes", lambda: 2**20)
    proc = cli_in_process(capsys, "compare", "--interactions", clicks, *LOG, "--split", "loo",
                          "sasrec", "--steps", "4", "--eval-every", "2",
                          "--output-dir", str(tmp_path / "out"))
    _one_error(proc, "GiB available: lower --preset")
    assert not os.path.exists(tmp_path / "out")


def test_report_only_takes_the_margin_only_and_data_stats_filters_only_a_log(tmp_path, capsys):
    proc = cli_in_process(capsys, "compare", "--report-only", "--output-dir", str(tmp_path),
                          "--seeds", "0", "1")
    _one_error(proc, "--report-only rebuilds the report")
    for model in ("sasrec", "tfrs-model"):  # the plan names the model
        proc = cli_in_process(capsys, "compare", model, "--report-only", "--output-dir",
                              str(tmp_path), *(["--model-fn", "m:f"] * (model == "tfrs-model")))
        _one_error(proc, "--report-only reads the model from --output-dir's plan.json")
    for flags in (("--seeds", "0", "1", "0"), ("--loss", "inbatch-none", "inbatch-none")):
        proc = cli_in_process(capsys, "compare", "--dataset", "ml-1m", "--output-dir",
                              str(tmp_path / "twice"), *flags)
        _one_error(proc, f"argument {flags[0]}: {flags[-1]} is given twice")
    proc = cli_in_process(capsys, "data", "stats", "--dataset", "ml-1m", "--deduplicate")
    _one_error(proc, "--deduplicate filters --interactions")


def test_a_log_whose_every_target_is_a_sent_repeat_is_refused_under_exclude_seen(tmp_path,
                                                                                 capsys):
    # Every user's last click repeats the one before it: a miss for every model, served.
    rows = []
    for u in range(40):
        items = [f"sku-{(u + t) % 30}" for t in range(6)]
        rows += [(f"u{u}", item, u * 100 + t) for t, item in enumerate(items + [items[-1]])]
    log = _write(tmp_path / "repeats.csv", rows)
    common = ("compare", "--interactions", log, *LOG, "--split", "loo",
              "--min-item-interactions", "1", "--steps", "4", "--eval-every", "2")
    proc = cli_in_process(capsys, *common, "--output-dir", str(tmp_path / "a"))
    _one_error(proc, "compare with --no-exclude-seen")
