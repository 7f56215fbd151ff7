"""`tfrs-logq compare` (`tfrs_logq.studies.compare` and its report): a tiny comparison
end to end, resume, the plan check, and the paired statistics against SciPy."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import scipy.stats

from tfrs_logq.pipelines.interactions import build_interactions
from tfrs_logq.pipelines.splits import make_split
from tfrs_logq.studies import compare, compare_report
from tfrs_logq.studies._grid import read_rows
from tfrs_logq.towers.config import TwoTowerConfig

CONFIG = TwoTowerConfig(steps=30, batch_size=64, embedding_dim=8, history_length=5,
                        learning_rate=2e-2, eval_every=10)


@pytest.fixture(scope="module")
def split():
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(200), 12)
    items = np.concatenate([rng.choice(np.arange(u % 5, 100, 5), 12) for u in range(200)])
    times = np.arange(len(users))
    return make_split(build_interactions(users, items, times, min_item_interactions=1), "loo")


def test_a_comparison_end_to_end_resumes_and_skips_finished_runs(split, tmp_path):
    plan = compare.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0, 1),
                        config=CONFIG, window=2, source="toy")
    out = str(tmp_path / "cmp")
    said: list = []
    rows = compare.run_compare(plan, split, out, say=said.append, max_runs=1)  # "killed"
    assert len(rows) == 1 and rows[0]["loss"] == "inbatch-logq-official"
    said.clear()
    rows = compare.run_compare(plan, split, out, say=said.append)
    assert said[0].startswith("compare: 4 runs (2 losses x 2 seeds)") and "1 already" in said[0]
    assert sum(line.startswith("run ") for line in said) == 3
    assert any("ms/step here: about" in line for line in said)  # the estimate
    assert [(r["loss"], r["seed"]) for r in rows] == [
        ("inbatch-logq-official", "0"), ("inbatch-corrected", "0"), ("inbatch-logq-official", "1"),
        ("inbatch-corrected", "1")]
    curves = read_rows(os.path.join(out, "curves.csv"))
    assert len(curves) == 4 * 3  # steps 10, 20, 30 of every run
    for row in rows:  # the window's mean of the last two evaluations
        mine = [c for c in curves if c["loss"] == row["loss"] and c["seed"] == row["seed"]]
        assert row["window_steps"] == "20 30"
        assert float(row["recall@10"]) == pytest.approx(
            np.mean([float(c["recall@10"]) for c in mine if c["steps"] in ("20", "30")]))
    for name in ("report.md", "learning_curves.png", "paired.png", "plan.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    report = open(os.path.join(out, "report.md")).read()
    assert "- inbatch-corrected against inbatch-logq-official, recall@10:" in report
    assert not os.listdir(os.path.join(out, "runs"))  # finished runs' checkpoints removed
    said.clear()
    compare.run_compare(plan, split, out, say=said.append)  # all done: nothing trains
    assert not any(line.startswith("run ") for line in said)
    # Another plan in the same directory is refused; more seeds are not.
    other = dataclasses.replace(plan, config=dataclasses.replace(CONFIG, steps=40))
    with pytest.raises(compare.CompareError, match="another plan"):
        compare.run_compare(other, split, out, say=said.append)
    more = dataclasses.replace(plan, seeds=(0, 1, 2))
    assert compare._check_plan(more, out) is None


def test_paired_differences_intervals_and_verdicts_against_scipy():
    plan = compare.Plan(losses=("inbatch-logq-official", "inbatch-corrected", "inbatch-none"),
                        seeds=(0, 1, 2, 3), config=CONFIG, window=1)
    base = [0.20, 0.21, 0.19, 0.205]
    better = [0.23, 0.245, 0.22, 0.236]
    noisy = [0.19, 0.23, 0.18, 0.215]
    rows = []
    for loss, values in (("inbatch-logq-official", base), ("inbatch-corrected", better),
                         ("inbatch-none", noisy)):
        rows += [{"loss": loss, "seed": str(s), "recall@10": str(v),
                  "positive_share_q50": "0.01", "seconds_per_step": "0.01", "machine": "m"}
                 for s, v in enumerate(values)]
    diff = compare_report.paired(rows, plan, "inbatch-corrected", "recall@10")
    d = np.array(better) - np.array(base)
    half = scipy.stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert diff["mean"] == pytest.approx(d.mean())
    assert (diff["low"], diff["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert compare_report.verdict(diff) == "better"
    assert compare_report.verdict(compare_report.paired(rows, plan, "inbatch-none",
                                                        "recall@10")) == "within noise"
    text = compare_report.format_report(plan, rows, [])
    assert "Multiple comparisons: 2 differences" in text
    assert "inbatch-corrected recall@10" in text.split("Multiple comparisons")[1]
    assert "small (median 0.010" in text


@pytest.mark.parametrize("kwargs, match", [
    (dict(losses=("inbatch-logq-official",)), "two or more two-tower losses"),
    (dict(losses=("inbatch-logq-official", "softmax")), "two or more two-tower losses"),
    (dict(seeds=()), "at least one seed"),
    (dict(baseline="mns-none"), "baseline"),
    (dict(window=4), "window"),
    (dict(model="sasrec2"), "model"),
])
def test_bad_plans_are_one_line_errors(kwargs, match):
    with pytest.raises(compare.CompareError, match=match) as error:
        compare.Plan(**{"config": CONFIG, **kwargs})
    assert "\n" not in str(error.value)


def test_the_sasrec_family_trains_through_its_trainer_with_the_plans_window(split, tmp_path):
    plan = compare.Plan(losses=("inbatch-logq", "inbatch-corrected"), seeds=(0,),
                        config=dataclasses.replace(CONFIG, steps=4, eval_every=2), window=2,
                        model="sasrec", sasrec_preset="smoke", source="toy")
    config = plan.sasrec_config("inbatch-corrected", 0)
    assert (config.max_epochs, config.steps_per_epoch, config.test_window) == (2, 2, 2)
    assert config.patience > config.max_epochs  # no early stopping
    out = str(tmp_path / "sasrec")
    rows = compare.run_compare(plan, split, out, say=lambda m: None)
    assert [r["loss"] for r in rows] == ["inbatch-logq", "inbatch-corrected"]
    assert all(r["window_steps"] == "2 4" and 0 <= float(r["recall@10"]) <= 1 for r in rows)
    assert "recall@20" in rows[0]  # SASRec's cut-offs
    with pytest.raises(compare.CompareError, match="sasrec losses"):
        compare.Plan(losses=("inbatch-corrected", "inbatch-sampled"), model="sasrec",
                     config=CONFIG)
