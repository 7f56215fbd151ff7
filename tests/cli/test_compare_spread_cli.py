"""`tfrs-logq compare --run-index I --run-count N` (or a Kubernetes Indexed Job's, a Slurm
array's variables): the source of the share said on stderr, bad input refused in one line
before the log is read, and one comparison trained by three processes on one directory
giving the results.csv of one process."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_process import cli_in_process

SCHEDULER_VARIABLES = ("JOB_COMPLETION_INDEX", "TFRS_LOGQ_RUN_COUNT", "SLURM_ARRAY_TASK_ID",
                       "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                       "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP")
SMALL = ("--user-column", "user", "--item-column", "item", "--split", "loo", "--loss",
         "inbatch-logq-official", "inbatch-corrected", "--seeds", "0", "1", "--steps", "4",
         "--eval-every", "2", "--window", "2", "--batch-size", "16", "--embedding-dim", "4",
         "--no-served-index")
TIMING = ("seconds_per_step",)
"""results.csv's columns that time a run (left out of the comparison of two directories)"""


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    """The test's own scheduler variables only (a suite run in a Slurm array has its own)."""
    for name in SCHEDULER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "plays.csv"
    rng = np.random.default_rng(1)
    lines = ["user,item"] + [f"u{u},i{int(rng.choice(np.arange(u % 4, 40, 4)))}"
                             for u in range(60) for _ in range(8)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("flags, env, message", [
    (("--run-index", "3", "--run-count", "3"), {}, "the run index must be in [0, 2]"),
    (("--run-index", "0", "--run-count", "0"), {}, "the run count must be at least 1"),
    (("--run-index", "1"), {}, "--run-index needs --run-count"),
    (("--run-index", "first", "--run-count", "2"), {}, "--run-index must be an integer"),
    ((), {"JOB_COMPLETION_INDEX": "two", "TFRS_LOGQ_RUN_COUNT": "3"},
     "JOB_COMPLETION_INDEX must be an integer, received 'two'"),
    ((), {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1",
          "SLURM_ARRAY_TASK_MAX": "3"}, "SLURM_ARRAY_TASK_ID=4 is not an id of the array"),
])
def test_bad_shares_are_one_line_before_the_log_is_read(log_csv, tmp_path, capsys,
                                                        monkeypatch, flags, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "cmp"
    proc = cli_in_process(capsys, "compare", "--interactions", log_csv, *SMALL, *flags,
                          "--output-dir", out)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfrs-logq: error: ") \
        and message in lines[0], lines
    assert not out.exists()


def test_the_source_of_the_share_is_one_line_on_stderr_the_flags_first(tmp_path, capsys,
                                                                        monkeypatch):
    absent = str(tmp_path / "absent.csv")  # the command stops at the log, after the line
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("TFRS_LOGQ_RUN_COUNT", "3")
    for flags, source in (
            ((), "compare: run index 1 of 3 (JOB_COMPLETION_INDEX=1, TFRS_LOGQ_RUN_COUNT=3)"),
            (("--run-count", "2"), "compare: run index 1 of 2 (JOB_COMPLETION_INDEX=1, "
                                   "--run-count)"),
            (("--run-index", "0", "--run-count", "2"),
             "compare: run index 0 of 2 (--run-index and --run-count)")):
        proc = cli_in_process(capsys, "compare", "--interactions", absent, *SMALL, *flags,
                              "--output-dir", tmp_path / "cmp")
        assert proc.returncode == 2
        shares = [line for line in proc.stderr.splitlines() if "run index" in line]
        assert len(shares) == 1 and shares[0].startswith(source), proc.stderr
        assert "k mod" in shares[0] and "run index" not in proc.stdout
    # --report-only reads no share: the variables are left alone, a flag is refused.
    proc = cli_in_process(capsys, "compare", "--report-only", "--output-dir", tmp_path / "no",
                          "--run-index", "0")
    assert proc.returncode == 2 and "--run-index belongs to a comparison run" in proc.stderr


def test_report_only_json_lists_the_missing_runs(log_csv, tmp_path, capsys):
    out = tmp_path / "cmp"
    first = cli_in_process(capsys, "compare", "--interactions", log_csv, *SMALL,
                           "--run-index", "1", "--run-count", "4", "--output-dir", out)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "3 of the plan's 4 runs remain: inbatch-logq-official seed 0, inbatch-logq-" \
           "official seed 1, inbatch-corrected seed 1" in first.stdout
    assert not (out / "report.md").exists()
    proc = cli_in_process(capsys, "compare", "--report-only", "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["missing"] == [["inbatch-logq-official", 0], ["inbatch-logq-official", 1],
                                 ["inbatch-corrected", 1]]
    assert "compare: partial report: 3 of the plan's 4 runs have no row" in proc.stderr
    assert "Provisional: 3 of 4 runs of the plan are pending" in result["report"]


def test_compare_tfrs_model_hands_its_share_to_the_comparison(log_csv, tmp_path, capsys,
                                                             monkeypatch):
    """`compare tfrs-model` reaches `run_plan` through `compare_split`: the share is set
    around it (`spread`)."""
    from tfrs_logq.studies.compare import model_fn as compare_model_fn
    from tfrs_logq.studies.compare import plan as compare_plan

    seen = []
    monkeypatch.setattr(compare_model_fn, "load_model_fn", lambda *args: None)
    monkeypatch.setattr(compare_model_fn, "compare_split",
                        lambda *args, **kwargs: seen.append(compare_plan._SHARE.get()) or [])
    proc = cli_in_process(capsys, "compare", "tfrs-model", "--model-fn", "m:f",
                          "--interactions", log_csv, "--user-column", "user", "--item-column",
                          "item", "--split", "loo", "--loss", "inbatch-logq-official",
                          "inbatch-corrected", "--run-index", "1", "--run-count", "2",
                          "--output-dir", tmp_path / "cmp")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seen == [compare_plan.RunShare(1, 2)] and compare_plan._SHARE.get() is None


_DETERMINISTIC_CLI = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from deterministic_process import _initialise; _initialise(1); "
    "from tfrs_logq.cli import main; sys.exit(main(sys.argv[1:]))")
"""``tfrs-logq`` in an interpreter where TensorFlow gives the same bits for the same ops
(one intra-op thread, op determinism: tests/deterministic_process.py)."""


def _results(path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING}
                for row in csv.DictReader(f)]


@pytest.mark.slow  # four CLI processes with TensorFlow: about 65 s of CPU (make test-slow)
def test_three_processes_on_one_directory_give_one_process_results(log_csv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in SCHEDULER_VARIABLES}
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def start(out, *flags, name):
        log = open(tmp_path / f"{name}.log", "w")
        return subprocess.Popen(
            [sys.executable, "-c", _DETERMINISTIC_CLI, tests, "compare", "--interactions",
             log_csv, *SMALL, "--output-dir", str(out), *flags],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path), log

    spread, single = tmp_path / "spread", tmp_path / "single"
    started = [start(spread, "--run-index", str(i), "--run-count", "3", name=f"index{i}")
               for i in range(3)] + [start(single, name="single")]
    deadline = time.monotonic() + 420
    try:
        for proc, _ in started:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc, log in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    said = {name: (tmp_path / f"{name}.log").read_text()
            for name in ("index0", "index1", "index2", "single")}
    for (proc, _), (name, text) in zip(started, said.items()):
        assert proc.returncode == 0, f"{name}: {text[-3000:]}"
    for i in range(3):
        assert f"compare: run index {i} of 3 (--run-index and --run-count)" in said[f"index{i}"]
    reporters = [name for name in said if "writing the report" in said[name]]
    assert len(reporters) == 1 and reporters[0] != "single", said
    assert (spread / "report.md").stat().st_size > 0
    # The rows, in the same order, equal but for the timing columns.
    header = (spread / "results.csv").read_text().splitlines()[0]
    assert header == (single / "results.csv").read_text().splitlines()[0]
    assert _results(spread / "results.csv") == _results(single / "results.csv")
    assert len(_results(single / "results.csv")) == 4

    def evaluations(out):
        with open(out / "curves.csv", newline="") as f:
            return sorted((r["loss"], r["seed"], r["steps"], r["recall@10"])
                          for r in csv.DictReader(f))

    assert evaluations(spread) == evaluations(single)  # no process lost another's rows
