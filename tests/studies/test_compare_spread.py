"""A comparison spread over processes (`tfrs_logq.studies.compare.plan.RunShare`): the fixed
assignment of the plan's runs, the flags and scheduler variables that choose a process's
share and their refusals, and `run_plan` sharing a directory (a run held elsewhere left to
its holder, the tables' lock, the report written once every run is done, the runs missing
named). A fake trainer stands in for training: each run's row is a function of its loss and
seed alone."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tfrs_logq._util.locks import ExclusiveLock
from tfrs_logq.studies._grid import read_rows
from tfrs_logq.studies.compare import plan as compare_plan
from tfrs_logq.studies.compare import report as compare_report
from tfrs_logq.studies.compare import runner as compare_runner
from tfrs_logq.towers.config import TwoTowerConfig

CONFIG = TwoTowerConfig(steps=30, eval_every=10)
LOSSES = ("inbatch-logq-tfrs", "inbatch-corrected")
PLAN = compare_plan.Plan(losses=LOSSES, seeds=(0, 1), config=CONFIG, window=1, source="fake")


def run_plan(*args, **kwargs):
    """`run_plan` with the comparison's report step, as `compare` hands it."""
    return compare_runner.run_plan(*args, report=compare_report.reporter(), **kwargs)


def _fake_trainer(trained: list) -> compare_runner.Trainer:
    def train(loss, seed, run_dir, on_eval, on_step, evaluations):
        trained.append((loss, seed))
        value = 0.2 + 0.01 * seed + (0.02 if loss == "inbatch-corrected" else 0.0)
        on_eval({"steps": 30, "recall@10": value})
        return {"loss": loss, "seed": seed, "steps": 30, "window": 1, "window_steps": "30",
                "recall@10": value, "positive_share_q50": 0.01, "machine": "m"}

    return compare_runner.Trainer(catalog="fake", key=lambda loss, seed: f"{loss}/{seed}",
                           train=train)


def test_run_k_of_the_plan_goes_to_index_k_mod_n():
    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-logq-official",
                                "inbatch-corrected"), seeds=(5, 7), config=CONFIG, window=1)
    runs = compare_plan.plan_runs(plan)
    assert runs == [("inbatch-logq-tfrs", 5), ("inbatch-logq-official", 5),
                    ("inbatch-corrected", 5), ("inbatch-logq-tfrs", 7),
                    ("inbatch-logq-official", 7), ("inbatch-corrected", 7)]
    shares = [compare_plan.RunShare(i, 4).runs(plan) for i in range(4)]
    assert shares[0] == [runs[0], runs[4]] and shares[3] == [runs[3]]
    assert sorted(sum(shares, []), key=runs.index) == runs  # each run once
    assert compare_plan.RunShare(0, 1).runs(plan) == runs
    assert compare_plan.RunShare(2, 9).runs(plan) == [runs[2]]


@pytest.mark.parametrize("flags, env, expected", [
    ((None, None), {}, None),
    (("1", "3"), {}, (1, 3, "--run-index and --run-count")),
    ((2, 4), {}, (2, 4, "--run-index and --run-count")),
    # The flags win over the variables.
    (("0", "2"), {"JOB_COMPLETION_INDEX": "1", "TFRS_LOGQ_RUN_COUNT": "2"},
     (0, 2, "--run-index and --run-count")),
    ((None, None), {"JOB_COMPLETION_INDEX": "2", "TFRS_LOGQ_RUN_COUNT": "4"},
     (2, 4, "JOB_COMPLETION_INDEX=2, TFRS_LOGQ_RUN_COUNT=4")),
    ((None, "3"), {"JOB_COMPLETION_INDEX": "2", "TFRS_LOGQ_RUN_COUNT": "9"},
     (2, 3, "JOB_COMPLETION_INDEX=2, --run-count")),
    ((None, None), {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4",
                    "SLURM_ARRAY_TASK_MAX": "6", "SLURM_ARRAY_TASK_COUNT": "3"},
     (1, 3, "SLURM_ARRAY_TASK_ID=5, SLURM_ARRAY_TASK_MIN=4, SLURM_ARRAY_TASK_COUNT=3")),
    ((None, None), {"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_MIN": "0",
                    "SLURM_ARRAY_TASK_MAX": "8", "SLURM_ARRAY_TASK_STEP": "2"},
     (3, 5, "SLURM_ARRAY_TASK_MAX=8")),
    ((None, "2"), {"SLURM_ARRAY_TASK_ID": "1"}, (1, 2, "SLURM_ARRAY_TASK_ID=1")),
])
def test_the_share_comes_from_the_flags_else_the_schedulers_variables(flags, env, expected):
    share = compare_plan.resolve_share(*flags, environ=env)
    if expected is None:
        assert share is None
        return
    index, count, source = expected
    assert (share.index, share.count) == (index, count) and source in share.source
    assert share.describe().startswith(f"compare: run index {index} of {count} (")


@pytest.mark.parametrize("flags, env, message", [
    (("3", "3"), {}, "the run index must be in [0, 2] for a count of 3, received 3"),
    (("-1", "3"), {}, "the run index must be in [0, 2]"),
    (("0", "0"), {}, "the run count must be at least 1, received 0"),
    (("1", None), {}, "--run-index needs --run-count"),
    ((None, "2"), {}, "--run-count needs --run-index"),
    (("one", "2"), {}, "--run-index must be an integer, received 'one'"),
    (("1", "2.0"), {}, "--run-count must be an integer, received '2.0'"),
    ((None, None), {"JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX must be an integer"),
    ((None, None), {"JOB_COMPLETION_INDEX": "1"}, "set TFRS_LOGQ_RUN_COUNT"),
    ((None, None), {"JOB_COMPLETION_INDEX": "4", "TFRS_LOGQ_RUN_COUNT": "4"},
     "the run index must be in [0, 3] for a count of 4, received 4 (JOB_COMPLETION_INDEX=4"),
    ((None, None), {"JOB_COMPLETION_INDEX": "1", "TFRS_LOGQ_RUN_COUNT": ""},
     "TFRS_LOGQ_RUN_COUNT must be an integer, received ''"),
    ((None, None), {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "abc"},
     "SLURM_ARRAY_TASK_COUNT must be an integer, received 'abc'"),
    ((None, None), {"SLURM_ARRAY_TASK_ID": "2"}, "needs a count: SLURM_ARRAY_TASK_COUNT"),
    ((None, None), {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1",
                    "SLURM_ARRAY_TASK_MAX": "7", "SLURM_ARRAY_TASK_COUNT": "3"},
     "are not the ids 1-7:1"),
    ((None, None), {"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "0",
                    "SLURM_ARRAY_TASK_MAX": "3"}, "SLURM_ARRAY_TASK_ID=9 is not an id"),
])
def test_bad_indices_counts_and_variables_are_one_line_errors(flags, env, message):
    with pytest.raises(compare_plan.CompareError) as error:
        compare_plan.resolve_share(*flags, environ=env)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_shares_fill_one_directory_and_the_last_writes_the_report(tmp_path):
    out, single = str(tmp_path / "spread"), str(tmp_path / "single")
    runs = compare_plan.plan_runs(PLAN)
    trained: list = []
    said: list = []
    # Index 0 of 3: runs 0 and 3; the report waits for the others.
    run_plan(PLAN, out, _fake_trainer(trained), say=said.append,
                     share=compare_plan.RunShare(0, 3))
    assert trained == [runs[0], runs[3]]
    assert said[0] == (f"compare: index 0 of 3: 2 of 4 runs (2 losses x 2 seeds) of 30 "
                       f"steps; 0 already in {out}, 2 to train")
    assert said[-1].startswith("compare: index 0's runs are done or held elsewhere; 2 of "
                               "the plan's 4 runs remain: inbatch-corrected seed 0, "
                               "inbatch-logq-tfrs seed 1 (")
    assert not os.path.exists(os.path.join(out, "report.md"))
    # Index 1's run 1 is held by another process: left to it.
    held = ExclusiveLock(os.path.join(out, compare_runner.RUN_LOCKS, os.path.basename(
        compare_runner._run_dir(out, "inbatch-corrected/0")) + ".lock"), wait=False).acquire()
    said.clear()
    run_plan(PLAN, out, _fake_trainer(trained), say=said.append,
                     share=compare_plan.RunShare(1, 3))
    held.release()
    assert trained == [runs[0], runs[3]]
    assert f"run 1/1: inbatch-corrected, seed 0 is being trained by process {os.getpid()}: " \
           f"left to it" in said
    # Index 2 (given as `spread` sets it, as for compare_split) leaves run 1 missing.
    said.clear()
    with compare_plan.spread(compare_plan.RunShare(2, 3)):
        run_plan(PLAN, out, _fake_trainer(trained), say=said.append)
    assert trained == [runs[0], runs[3], runs[2]]
    assert "1 of the plan's 4 runs remain: inbatch-corrected seed 0" in said[-1]
    assert not os.path.exists(os.path.join(out, "report.md"))
    # Index 1 rerun (the lost process's index): its run, then the report.
    said.clear()
    run_plan(PLAN, out, _fake_trainer(trained), say=said.append,
                     share=compare_plan.RunShare(1, 3))
    assert trained[-1] == runs[1]
    assert "compare: every run of the plan is done: writing the report" in said
    report = os.path.join(out, "report.md")
    written = os.stat(report).st_mtime_ns
    # results.csv in the plan's order, the same bytes as one process's comparison.
    run_plan(PLAN, single, _fake_trainer([]), say=lambda line: None)
    with open(os.path.join(out, "results.csv"), "rb") as a, \
            open(os.path.join(single, "results.csv"), "rb") as b:
        assert a.read() == b.read()
    assert [(r["loss"], int(r["seed"])) for r in read_rows(os.path.join(out, "results.csv"))] \
        == runs
    assert len(read_rows(os.path.join(out, "curves.csv"))) == 4
    # Every run done and the report newer than results.csv: nothing trains or rewrites it.
    said.clear()
    run_plan(PLAN, out, _fake_trainer(trained), say=said.append,
                     share=compare_plan.RunShare(0, 3))
    assert len(trained) == 4 and os.stat(report).st_mtime_ns == written
    assert said[-1].startswith(f"compare: every run of the plan is done and {report} is up "
                               f"to date")


def test_a_run_finished_elsewhere_while_this_process_waited_is_not_trained_again(
        tmp_path, monkeypatch):
    out = str(tmp_path)
    trained: list = []
    run_plan(PLAN, out, _fake_trainer(trained), say=lambda line: None,
                     share=compare_plan.RunShare(0, 2), max_runs=1)
    original, other = compare_runner._claim, []

    def claim_after_another_finished(output_dir, key):  # its row lands before the lock
        if not other:
            other.append(key)
            run_plan(PLAN, out, _fake_trainer(trained), say=lambda line: None,
                             share=compare_plan.RunShare(0, 2))
        return original(output_dir, key)

    monkeypatch.setattr(compare_runner, "_claim", claim_after_another_finished)
    said: list = []
    run_plan(PLAN, out, _fake_trainer(trained), say=said.append,
                     share=compare_plan.RunShare(0, 2))
    assert other == ["inbatch-logq-tfrs/1"]
    assert trained == [("inbatch-logq-tfrs", 0), ("inbatch-logq-tfrs", 1)]
    assert "run 1/1: inbatch-logq-tfrs, seed 1 finished elsewhere" in said


def test_a_process_writes_its_tables_only_under_the_tables_lock(tmp_path):
    out = str(tmp_path)
    lock = ExclusiveLock(os.path.join(out, compare_plan.TABLES_LOCK)).acquire()
    worker = threading.Thread(target=compare_runner.run_plan, kwargs=dict(
        plan=PLAN, output_dir=out, trainer=_fake_trainer([]), say=lambda line: None,
        share=compare_plan.RunShare(0, 1)))
    worker.start()
    try:
        time.sleep(0.5)
        assert worker.is_alive() and not os.path.exists(os.path.join(out, "plan.json"))
    finally:
        lock.release()
    worker.join(timeout=60)
    assert not worker.is_alive() and len(read_rows(os.path.join(out, "results.csv"))) == 4


def test_report_only_names_the_missing_runs_and_says_the_report_is_partial(tmp_path):
    out = str(tmp_path)
    run_plan(PLAN, out, _fake_trainer([]), say=lambda line: None,
                     share=compare_plan.RunShare(0, 3))
    said: list = []
    text = compare_report.report_only(out, say=said.append)
    assert said[0] == ("compare: partial report: 2 of the plan's 4 runs have no row in "
                       "results.csv yet: (inbatch-corrected, 0), (inbatch-logq-tfrs, 1); the "
                       "report is provisional until they finish")
    assert "2 of 4 runs of the plan are pending" in text
    assert compare_plan.missing_runs(PLAN, read_rows(os.path.join(out, "results.csv"))) == [
        ("inbatch-corrected", 0), ("inbatch-logq-tfrs", 1)]
