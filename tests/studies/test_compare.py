"""`tfrs-logq compare` (`tfrs_logq.studies.compare` and its report): a tiny comparison
end to end, resume, the plan check, and the paired statistics against SciPy."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import scipy.stats
from tensorboard_events import hparams_experiment, hparams_trial, scalars

from tfrs_logq.pipelines.interactions import build_interactions
from tfrs_logq.pipelines.splits import make_split
from tfrs_logq.studies._grid import read_rows
from tfrs_logq.studies.compare import builtin as compare_builtin
from tfrs_logq.studies.compare import plan as compare_plan
from tfrs_logq.studies.compare import report as compare_report
from tfrs_logq.studies.compare import runner as compare_runner
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


class FakeServedIndex:
    """A ``served_index`` hook that records what it was called with and answers a faiss
    record whose recall is the call's number (0.9 at the first call, 0.8 at the second)."""

    def __init__(self):
        self.calls: list = []

    def __call__(self, item_embeddings, query_embeddings, ks):
        self.calls.append((np.array(item_embeddings), np.array(query_embeddings), ks))
        share = 1.0 - 0.1 * len(self.calls)
        return {"kind": "faiss", "parameters": {"type": "IVF-Flat", "nlist": 10, "nprobe": 3},
                "recall": {str(k): share for k in ks}, "target_recall": 0.95,
                "reached": True, "settings": {str(k): {"nprobe": 3} for k in ks}}


def _numpy_hits(items, queries, arrays, k):
    """Hits in the top ``k`` of each test target, ranked by numpy over ``items`` (row i is
    item i + 1) with the history left out, as the exact evaluation ranks."""
    scores = queries @ items.T
    for row, history in enumerate(arrays["exclude"]):
        seen = history[history > 0] - 1
        scores[row, seen] = -np.inf
    target = scores[np.arange(len(scores)), arrays["targets"] - 1]
    return int(np.sum((scores > target[:, None]).sum(axis=1) < k))


def test_a_comparison_end_to_end_resumes_and_skips_finished_runs(split, tmp_path):
    from tfrs_logq.pipelines.sequential import evaluation_arrays

    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0, 1),
                        config=CONFIG, window=2, source="toy")
    out = str(tmp_path / "cmp")
    said: list = []
    served = FakeServedIndex()
    rows = compare_builtin.run_compare(plan, split, out, say=said.append, max_runs=1,  # "killed"
                               served_index=served)
    assert len(rows) == 1 and rows[0]["loss"] == "inbatch-logq-official"
    said.clear()
    rows = compare_builtin.run_compare(plan, split, out, say=said.append, served_index=served)
    assert said[0].startswith("compare: estimated peak memory of a run")
    assert said[1].startswith("compare: 4 runs (2 losses x 2 seeds)") and "1 already" in said[1]
    assert sum(line.startswith("run ") for line in said) == 3
    # Where the time went: every part, as minutes and shares of the wall time, in the
    # console, timings.json (one entry a process: 2 here) and the report's run facts.
    spent = next(line for line in said
                 if line.startswith("compare: where this process's time went, "))
    assert "training steps" in spent and "x the training steps' time" in spent
    timings = json.loads(open(os.path.join(out, "timings.json")).read())
    assert len(timings) == 2
    for entry in timings:
        parts = entry["seconds"]
        assert set(parts) == set(compare_runner.TIME_PARTS)
        assert all(v >= 0 for v in parts.values()) and parts["training steps"] > 0
        assert sum(parts.values()) <= entry["wall_seconds"] * 1.01 + 0.05
    assert any("ms/step here: about" in line for line in said)  # the estimate
    assert any(line.startswith("  run 1 took ") and "for the 2 run(s) left" in line
               for line in said)  # each finished run updates it, evaluations included
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
    for row in rows:  # each run's hits per test user: its last evaluation's Recall and NDCG
        hits = compare_runner.load_hits(compare_runner.hits_path(out, row["loss"],
                                                                 int(row["seed"])))
        final = next(c for c in curves if (c["loss"], c["seed"], c["steps"])
                     == (row["loss"], row["seed"], "30"))
        assert np.array_equal(hits["users"], np.unique(split.test.users))
        assert hits["targets"].sum() == len(split.test.targets)
        assert hits["hits@10"].sum() / hits["targets"].sum() == pytest.approx(
            float(final["recall@10"]))
        assert hits["gain@10"].sum() / hits["targets"].sum() == pytest.approx(
            float(final["ndcg@10"]))
    # The hook: called for the final model of each loss at the first seed, with the vectors
    # the exact evaluation ranked (numpy ranks them to the run's saved hits).
    assert len(served.calls) == 2
    arrays = evaluation_arrays(split, split.test, CONFIG.history_length, True)
    for loss, (items, queries, ks) in zip(plan.losses, served.calls):
        assert ks == (10,) and items.shape == (split.num_items, 8)
        assert queries.shape == (len(split.test.targets), 8)
        hits = compare_runner.load_hits(compare_runner.hits_path(out, loss, 0))
        assert _numpy_hits(items, queries, arrays, 10) == hits["hits@10"].sum()
    record = json.loads(open(os.path.join(out, compare_runner.SERVED_INDEX)).read())
    assert record["losses"]["inbatch-logq-official"]["recall"] == {"10": 0.9}
    assert record["losses"]["inbatch-corrected"]["recall"] == {"10": 0.8}
    assert record["losses"]["inbatch-corrected"]["seed"] == 0
    report = open(os.path.join(out, "report.md")).read()
    sentence = ("Served: `tfrs-logq export --index auto` would serve faiss IVF-Flat (10 lists, "
                "nprobe 3 for k = 10), whose top-10 holds 0.800 for inbatch-corrected and 0.900 "
                "for inbatch-logq-official of the exact top-10")
    assert sentence in report and "up to about 20.0 % below" in report
    assert report.index("## Verdict") < report.index(sentence) < report.index("Multiplicity")
    assert any(line.startswith("  served: ") for line in said)
    assert "over seeds and test users" in report
    assert "- inbatch-corrected against inbatch-logq-official, recall@10:" in report
    assert "Decision: not enough seeds: run" in report  # 2 pairs
    assert "repeats (the user had the item before)" in report
    assert "Evaluation policy: exclude-seen" in report and "repeat an earlier row" in report
    assert " Time: " in report and "(2 processes or reruns)" in report
    assert not os.listdir(os.path.join(out, "runs"))  # finished runs' checkpoints removed
    said.clear()
    compare_builtin.run_compare(plan, split, out, say=said.append)  # all done: nothing trains
    assert not any(line.startswith("run ") for line in said)
    assert sentence in open(os.path.join(out, "report.md")).read()  # the record is kept
    # Another plan in the same directory is refused; more seeds are not.
    other = dataclasses.replace(plan, config=dataclasses.replace(CONFIG, steps=40))
    with pytest.raises(compare_plan.CompareError, match="another plan"):
        compare_builtin.run_compare(other, split, out, say=said.append)
    more = dataclasses.replace(plan, seeds=(0, 1, 2))
    assert compare_plan._check_plan(more, out).seeds == (0, 1, 2)
    fewer = dataclasses.replace(plan, seeds=(0,))  # a rerun naming fewer keeps them all
    assert compare_plan._check_plan(fewer, out).seeds == (0, 1, 2)


def _rows(values_by_loss, **extra):
    return [{"loss": loss, "seed": str(s), "recall@10": str(v), "positive_share_q50": "0.01",
             "seconds_per_step": "0.01", "machine": "m", **extra}
            for loss, values in values_by_loss.items() for s, v in enumerate(values)]


def test_paired_differences_intervals_and_verdicts_against_scipy():
    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected", "inbatch-none"),
                        seeds=(0, 1, 2, 3), config=CONFIG, window=1)
    base = [0.20, 0.21, 0.19, 0.205]
    better = [0.23, 0.245, 0.22, 0.236]
    noisy = [0.19, 0.23, 0.18, 0.215]
    rows = _rows({"inbatch-logq-official": base, "inbatch-corrected": better,
                  "inbatch-none": noisy})
    diff = compare_report.paired(rows, plan, "inbatch-corrected", "recall@10")
    d = np.array(better) - np.array(base)
    half = scipy.stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert diff["mean"] == pytest.approx(d.mean())
    assert (diff["low"], diff["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert compare_report.verdict(diff) == "better"
    # Corrected is compared with every other loss: the baseline and "none".
    assert compare_report.comparisons(plan) == [
        ("inbatch-corrected", "inbatch-logq-official"), ("inbatch-corrected", "inbatch-none")]
    text = compare_report.format_report(plan, rows, [], primary_metric="recall@10")
    first = text.split("## Verdict")[1].split("##")[0]
    assert (f"against the official code's logQ (inbatch-logq-official) at Recall@10: "
            f"{d.mean():+.4f}, 95 % interval [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}]"
            ) in first and "Decision: switch" in first
    assert "the 1 other difference with an interval is secondary" in text
    assert "positive share" in text.lower() and "does not predict the verdict" in text


def test_a_diverged_run_is_named_and_left_out_of_the_pairs():
    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0, 1, 2, 3),
                        config=CONFIG, window=1)
    rows = _rows({"inbatch-logq-tfrs": [0.20, 0.21, 0.19, 0.205],
                  "inbatch-corrected": [0.21, float("nan"), 0.20, 0.215]})
    rows[-3]["recall@10"] = "nan"
    diff = compare_report.paired(rows, plan, "inbatch-corrected", "recall@10")
    assert diff["n"] == 3  # seed 1 left out, not ranked as "worse"
    assert compare_report.diverged_runs(rows) == [("inbatch-corrected", 1)]
    text = compare_report.format_report(plan, rows, [])
    assert "Diverged runs, left out of the pairs: inbatch-corrected seed 1." in text
    flagged = _rows({"inbatch-logq-tfrs": [0.2, 0.21, 0.19], "inbatch-corrected": [0, 0, 0]})
    for row in flagged[3:4]:
        row["diverged"] = "1"
    assert compare_report.diverged_runs(flagged) == [("inbatch-corrected", 0)]


def test_report_only_rebuilds_the_report_from_results_csv(tmp_path):
    from tfrs_logq.studies._grid import append_row

    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0, 1, 2),
                        config=CONFIG, window=1, source="hand-made")
    out = str(tmp_path)
    compare_plan._check_plan(plan, out)
    for row in _rows({"inbatch-logq-tfrs": [0.20, 0.21, 0.19],
                      "inbatch-corrected": [0.23, 0.25, 0.22]}):
        append_row(os.path.join(out, "results.csv"), row)
    said: list = []
    text = compare_report.report_only(out, say=said.append)
    assert open(os.path.join(out, "report.md")).read() == text
    assert "Served" not in text  # no hook, no record: no sentence
    assert "TFRS's logQ (inbatch-logq-tfrs) at Recall@10: +0.0333" in text
    assert said[0].startswith("compare: Primary comparison, corrected logQ")
    with pytest.raises(compare_plan.CompareError, match="plan.json"):
        compare_report.report_only(str(tmp_path / "nothing"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(losses=("inbatch-logq-official",)), "two or more two-tower losses"),
    (dict(losses=("inbatch-logq-official", "softmax")), "two or more two-tower losses"),
    (dict(seeds=()), "at least one seed"),
    (dict(losses=("inbatch-logq", "inbatch-corrected")), "'inbatch-logq' is ambiguous: use "
     "'inbatch-logq-tfrs'"),
    (dict(baseline="mns-none"), "baseline"),
    (dict(window=4), "window"),
    (dict(model="sasrec2"), "model"),
])
def test_bad_plans_are_one_line_errors(kwargs, match):
    with pytest.raises(compare_plan.CompareError, match=match) as error:
        compare_plan.Plan(**{"config": CONFIG, **kwargs})
    assert "\n" not in str(error.value)


@pytest.mark.slow  # SASRec trainings of a plan: 22 s on 2 cores; make test-slow (CI) runs it
def test_the_sasrec_family_trains_through_its_trainer_with_the_plans_window(split, tmp_path):
    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0,),
                        config=dataclasses.replace(CONFIG, steps=4, eval_every=2), window=2,
                        model="sasrec", sasrec_preset="smoke", source="toy")
    config = plan.sasrec_config("inbatch-corrected", 0)
    assert (config.max_epochs, config.steps_per_epoch, config.test_window) == (2, 2, 2)
    assert config.patience > config.max_epochs  # no early stopping
    out = str(tmp_path / "sasrec")
    served = FakeServedIndex()
    rows = compare_builtin.run_compare(plan, split, out, say=lambda m: None, served_index=served)
    assert [r["loss"] for r in rows] == ["inbatch-logq-official", "inbatch-corrected"]
    assert [(items.shape[0], len(queries), ks) for items, queries, ks in served.calls] == [
        (split.num_items, len(split.test.targets), (10, 20))] * 2
    assert all(r["window_steps"] == "2 4" and 0 <= float(r["recall@10"]) <= 1 for r in rows)
    assert "recall@20" in rows[0]  # SASRec's cut-offs
    # By popularity band too: the shares add up to 1, and the bands' hits to the whole's.
    for row in rows:
        shares = [float(row[f"{band}:share"]) for band in ("head", "torso", "tail")]
        assert sum(shares) == pytest.approx(1.0)
        assert sum(s * float(row[f"{band}:recall@10"]) for s, band in zip(
            shares, ("head", "torso", "tail")) if s > 0) == pytest.approx(float(row["recall@10"]))
    report = open(os.path.join(out, "report.md")).read()
    assert "## By popularity of the target" in report
    assert "Model: SASRec (preset smoke), 4 steps in 2 epochs of at most 2 steps" in report
    for row in rows:  # the hits of the last epoch, as its test evaluation scored them
        hits = compare_runner.load_hits(compare_runner.hits_path(out, row["loss"], 0))
        assert hits["targets"].sum() == len(split.test.targets)
        assert 0 <= hits["hits@10"].sum() <= hits["hits@20"].sum() <= len(split.test.targets)
    with pytest.raises(compare_plan.CompareError, match="sasrec losses"):
        compare_plan.Plan(losses=("inbatch-corrected", "inbatch-sampled"), model="sasrec",
                     config=CONFIG)


def _fake_trainer(plan):
    """A `Trainer` that trains nothing: one evaluation per run and the vectors of a 20-item
    catalog and 6 test queries."""
    def train(loss, seed, run_dir, on_eval, on_step, evaluations):
        value = 0.2 + 0.01 * seed + (0.02 if loss == "inbatch-corrected" else 0.0)
        on_eval({"steps": CONFIG.steps, "recall@10": value})
        last = {"steps": CONFIG.steps, "recall@10": value}
        return {**compare_runner.window_row(plan, loss, seed, [last], last),
                compare_runner.FINAL_EMBEDDINGS: (np.ones((20, 4)), np.ones((6, 4)))}

    return compare_runner.Trainer(catalog="fake", key=lambda loss, seed: f"{loss}-{seed}",
                           train=train)


def test_the_served_index_hook_runs_at_the_first_seed_and_a_failing_one_costs_the_record_alone(
        tmp_path):
    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(5, 6),
                        config=CONFIG, window=1)
    served = FakeServedIndex()
    out = str(tmp_path / "ok")
    compare_runner.run_plan(plan, out, _fake_trainer(plan), say=lambda m: None, served_index=served,
                            report=compare_report.reporter())
    assert [(i.shape, q.shape, ks) for i, q, ks in served.calls] == [
        ((20, 4), (6, 4), (10,))] * 2  # seed 5 only
    assert {r["seed"] for r in compare_runner.load_served(out)["losses"].values()} == {5}

    def failing(items, queries, ks):
        raise RuntimeError("the index could not be built\nsecond line")

    said: list = []
    out = str(tmp_path / "failing")
    rows = compare_runner.run_plan(plan, out, _fake_trainer(plan), say=said.append,
                                   served_index=failing, report=compare_report.reporter())
    assert len(rows) == 4 and compare_runner.load_served(out) is None
    assert "  served index not measured for inbatch-corrected seed 5: the index could not be "\
        "built" in said
    assert "Served" not in open(os.path.join(out, "report.md")).read()
    with open(os.path.join(out, compare_runner.SERVED_INDEX), "w") as f:
        f.write("[1, 2]")
    with pytest.raises(compare_plan.CompareError, match="served_index.json is not a record "
                                                   "compare wrote.*delete it"):
        compare_report.report_only(out)


def test_the_served_sentence_names_the_index_and_says_brute_force_and_a_missed_target():
    primary = {"subject": "inbatch-corrected", "reference": "inbatch-logq-tfrs",
               "metric": "recall@100"}
    scann = {"kind": "scann", "seed": 0, "recall": {"10": 1.0, "100": 0.97},
             "parameters": {"tree": True, "num_leaves": 100},
             "settings": {"100": {"leaves": 12, "reorder_factor": 20}},
             "target_recall": 0.95, "reached": False}
    words = compare_report.served_sentence({"losses": {"inbatch-corrected": scann}}, primary)
    assert words.startswith("Served: `tfrs-logq export --index auto` would serve ScaNN (100 "
                            "leaves, 12 searched, 20 x k reordered for k = 100), whose "
                            "top-100 holds 0.970 for inbatch-corrected of the exact top-100")
    assert "up to about 3.0 % below" in words
    assert words.endswith("; its tuning missed the export's --target-recall 0.95 (export "
                          "warns of it).")
    exact = {"kind": "brute-force", "seed": 0, "recall": {"10": 1.0}, "parameters": None}
    assert "brute force serves the exact top-k" in compare_report.served_sentence(
        {"losses": {"inbatch-logq-tfrs": exact}}, primary)
    assert compare_report.served_sentence(None, primary) == ""
    assert compare_report.served_sentence({"losses": {}}, primary) == ""


def test_an_empty_popularity_band_pairs_nothing_and_breaks_no_report():
    """A band with no test target has NaN metrics in a healthy run: its cells stay empty,
    the run is not called diverged, and the report is written."""
    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0, 1, 2),
                        config=CONFIG, window=1)
    rows = _rows({"inbatch-logq-tfrs": [0.20, 0.21, 0.19],
                  "inbatch-corrected": [0.21, 0.22, 0.20]},
                 **{"head:recall@10": "0.3", "torso:recall@10": "nan", "tail:recall@10": "0.1",
                    "head:share": "0.6", "torso:share": "0.0", "tail:share": "0.4"})
    assert compare_report.diverged_runs(rows) == []
    text = compare_report.format_report(plan, rows, [])
    assert "Diverged runs: none." in text and "## By popularity of the target" in text
    assert compare_report.paired(rows, plan, "inbatch-corrected", "torso:recall@10")["n"] == 0


def test_report_only_while_runs_are_pending_says_so_first(tmp_path):
    from tfrs_logq.studies._grid import append_row

    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0, 1, 2),
                        config=CONFIG, window=1)
    out = str(tmp_path)
    compare_plan._check_plan(plan, out)
    for row in _rows({"inbatch-logq-tfrs": [0.20, 0.21], "inbatch-corrected": [0.23, 0.25]}):
        append_row(os.path.join(out, "results.csv"), row)
    text = compare_report.report_only(out, say=lambda line: None)
    head = "\n".join(text.splitlines()[:4])
    assert "2 of 6 runs of the plan are pending" in head and "provisional" in head.lower()
    for row in _rows({"inbatch-logq-tfrs": [0.20, 0.21, 0.19],
                      "inbatch-corrected": [0.23, 0.25, 0.22]})[2::3]:
        append_row(os.path.join(out, "results.csv"), row)
    text = compare_report.report_only(out, say=lambda line: None)
    assert "pending" not in text and "rovisional" not in text  # all 6 finished


def test_a_sasrec_run_writes_the_steps_its_curves_record_and_no_empty_progress_line(
        split, tmp_path, monkeypatch):
    """An epoch stops at one pass over the training users (18 steps where --eval-every
    asks 20): results.csv's steps and window are the steps the curves record."""
    import tfrs_logq.sasrec.training as sasrec_training

    def fake_train(config, run_dir, verbose=0, split=None, extra_callbacks=()):
        return {"steps": 36, "epochs": 2, "train_seconds": 3.6,
                "validation_curve": [0.1, 0.2], "diverged": False,
                "test_window": {"epochs": [1, 2], "recall@10": 0.3, "recall@20": 0.4}}

    monkeypatch.setattr(sasrec_training, "train", fake_train)
    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0,),
                        config=dataclasses.replace(CONFIG, steps=40, eval_every=20), window=2,
                        model="sasrec")
    curves = []
    row = compare_runner._sasrec_row(plan, "inbatch-corrected", 0, split, str(tmp_path),
                              curves.append)
    assert [c["steps"] for c in curves] == [18, 36]
    assert row["steps"] == 36 == curves[-1]["steps"] and row["window_steps"] == "18 36"
    # The progress line of an evaluation without test metrics shows the validation's.
    said: list = []
    trainer = compare_runner.Trainer(catalog="c", key=lambda loss, seed: f"{loss}{seed}",
                              train=lambda loss, seed, run_dir, on_eval, on_step, done: (
                                  on_eval({"steps": 18, "validation_monitor": 0.125})
                                  or {"loss": loss, "seed": seed, "steps": 36,
                                      "recall@10": 0.3}))
    compare_runner.run_plan(plan, str(tmp_path / "out"), trainer, say=said.append,
                            report=compare_report.reporter())
    steps = [line for line in said if line.startswith("  step ")]
    assert steps and all(line == "  step 18: validation ndcg@10 0.1250" for line in steps)


def test_a_corrupt_curves_csv_rewrites_nothing_and_names_its_line(tmp_path):
    from tfrs_logq.studies._grid import append_row

    plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0, 1, 2),
                        config=CONFIG, window=1)
    out = str(tmp_path)
    compare_plan._check_plan(plan, out)
    for row in _rows({"inbatch-logq-tfrs": [0.20, 0.21, 0.19],
                      "inbatch-corrected": [0.23, 0.25, 0.22]}):
        append_row(os.path.join(out, "results.csv"), row)
        append_row(os.path.join(out, "curves.csv"), {"loss": row["loss"], "seed": row["seed"],
                                                     "steps": "30", "recall@10": row["recall@10"]})
    compare_report.report_only(out, say=lambda line: None)
    names = ("report.md", "paired.png", "learning_curves.png")
    before = {n: open(os.path.join(out, n), "rb").read() for n in names}
    path = os.path.join(out, "curves.csv")
    lines = open(path).read().splitlines()
    for bad, match in ((lines[2].replace(",30,", ",3x,"), "line 3: steps is '3x'"),
                       (lines[2] + ",0.5", "line 3 has more cells than the header"),
                       (lines[2].replace(",30,", ",30,abc").rsplit(",", 1)[0] + ",abc",
                        "line 3: recall@10 is 'abc'")):
        open(path, "w").write("\n".join([lines[0], lines[1], bad, *lines[3:]]) + "\n")
        with pytest.raises(compare_plan.ReportError, match=match) as error:
            compare_report.report_only(out, say=lambda line: None)
        assert "\n" not in str(error.value) and "curves.csv line 3" in str(error.value)
        assert {n: open(os.path.join(out, n), "rb").read() for n in names} == before


def test_the_memory_estimate_counts_the_ids_as_held(tmp_path, monkeypatch):
    """One 100,000-character user id makes every user id of the log that wide (NumPy text
    of the longest id's width, 4 bytes a character): 200 users hold 80 MB of ids."""
    from tfrs_logq.towers import training as towers

    rng = np.random.default_rng(0)
    names = np.array(["u" * 100_000] + [f"user{u}" for u in range(1, 200)])
    items = np.concatenate([rng.choice(np.arange(u % 5, 100, 5), 12) for u in range(200)])
    interactions = build_interactions(np.repeat(np.arange(200), 12), items,
                                      np.arange(len(items)), min_item_interactions=1)
    # As pipelines.user_log holds a file's ids: the distinct raw ids, by code.
    interactions.raw_users = names[interactions.raw_users]
    log = make_split(interactions, "loo")
    raw_items = np.asarray(log.interactions.raw_items)
    ids = 200 * 100_000 * 4 + len(raw_items) * raw_items.dtype.itemsize
    assert compare_runner.id_storage_bytes(log) == ids
    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0,),
                        config=CONFIG, window=1)
    base = towers.estimated_peak_bytes(CONFIG, log.num_items,
                                       len(towers.Examples(log, CONFIG.history_length)),
                                       len(log.test))
    monkeypatch.setattr(compare_runner, "available_memory_bytes", lambda: base + ids // 2)
    with pytest.raises(compare_plan.CompareError, match=r"GiB of it the ids as held \(200 user ids "
                       r"of 100,000 characters") as error:
        compare_builtin.run_compare(plan, log, str(tmp_path / "refused"), say=lambda line: None)
    assert "\n" not in str(error.value)
    assert not os.path.exists(tmp_path / "refused")  # refused before anything is written
    monkeypatch.setattr(compare_runner, "available_memory_bytes", lambda: base + ids + 1)
    said: list = []
    compare_builtin.run_compare(plan, log, str(tmp_path / "fits"), say=said.append, max_runs=0)
    assert f"run {(base + ids) / 2**30:.1f} GiB, 0.1 GiB of it the ids as held" in said[0]


def test_a_run_killed_mid_training_says_it_resumed(split, tmp_path, monkeypatch):
    """A run killed between two checkpoints is 'to train' again, and the console says it
    resumes from its checkpoint (before, '0 already in ..., 2 to train' and nothing more)."""
    plan = compare_plan.Plan(losses=("inbatch-logq-official", "inbatch-corrected"), seeds=(0,),
                        config=dataclasses.replace(CONFIG, steps=20, eval_every=10),
                        window=1, source="toy")
    out = str(tmp_path / "cmp")
    progress = compare_runner._progress

    def killed(i, *args):
        if i == 14:
            raise KeyboardInterrupt
        return progress(i, *args)

    train = compare_runner.towers.train
    monkeypatch.setattr(compare_runner.towers, "train",  # a checkpoint after every step
                        lambda *a, **k: train(*a, **k, checkpoint_seconds=0.0))
    monkeypatch.setattr(compare_runner, "_progress", killed)
    with pytest.raises(KeyboardInterrupt):
        compare_builtin.run_compare(plan, split, out, say=lambda line: None)
    monkeypatch.setattr(compare_runner, "_progress", progress)
    said: list = []
    rows = compare_builtin.run_compare(plan, split, out, say=said.append)
    assert len(rows) == 2
    header = next(line for line in said if line.startswith("compare: 2 runs"))
    assert "2 to train (1 of them resumed from their checkpoints)" in header
    first = next(line for line in said if line.startswith("run 1/2"))
    assert "resumed" in first and "1 evaluation(s) made" in first
    assert not any(line.startswith("run 2/2") and "resumed" in line for line in said)

    # TensorBoard (read with its own event reader): each run's evaluations once, the
    # killed run's step 10 included, equal to curves.csv; its result and HParams trial.
    curves = read_rows(os.path.join(out, "curves.csv"))
    results = {r["loss"]: r for r in rows}
    for loss in plan.losses:
        logdir = os.path.join(out, "logs", f"{loss}-seed0")
        mine = {int(r["steps"]): r for r in curves if r["loss"] == loss}
        test, train = scalars(os.path.join(logdir, "test")), \
            scalars(os.path.join(logdir, "train"))
        assert [step for step, _ in test["recall@10"]] == [10, 20]
        for step, value in test["recall@10"]:
            assert value == pytest.approx(float(mine[step]["recall@10"]), abs=1e-7)
        assert [step for step, _ in train["loss"]] == [10, 20]
        assert {"ndcg@10", "head/recall@10"} <= set(test)
        result = scalars(os.path.join(logdir, "result"))
        assert result["recall@10"] == [(20, pytest.approx(float(results[loss]["recall@10"]),
                                                         abs=1e-7))]
        trial = hparams_trial(logdir)
        assert trial.hparams["loss"].string_value == loss
        assert trial.hparams["seed"].number_value == 0
        assert trial.hparams["batch_size"].number_value == CONFIG.batch_size
    experiment = hparams_experiment(os.path.join(out, "logs"))
    assert {h.name for h in experiment.hparam_infos} >= {"loss", "seed", "model", "steps"}
    losses = next(h for h in experiment.hparam_infos if h.name == "loss")
    assert sorted(v.string_value for v in losses.domain_discrete.values) == sorted(plan.losses)
    assert "recall@10" in {m.name.tag for m in experiment.metric_infos}


def test_a_comparison_on_two_replicas_reads_as_on_one_device(split, tmp_path,
                                                           mirrored_strategy):
    """compare two-tower --strategy mirrored (the conftest's two logical CPUs): every run
    follows its one-device run (global negatives), so the rows agree within rounding."""
    assert mirrored_strategy.num_replicas_in_sync == 2
    config = dataclasses.replace(CONFIG, steps=20, eval_every=10)
    rows = {}
    for strategy in ("default", "mirrored"):
        plan = compare_plan.Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0,),
                            config=dataclasses.replace(config, strategy=strategy), window=1,
                            source="toy")
        rows[strategy] = compare_builtin.run_compare(plan, split, str(tmp_path / strategy),
                                             say=lambda line: None)
    for one, two in zip(rows["default"], rows["mirrored"]):
        assert (one["loss"], one["seed"]) == (two["loss"], two["seed"])
        for key in ("recall@10", "ndcg@10"):
            assert float(two[key]) == pytest.approx(float(one[key]), abs=0.02), key
    curves = {s: read_rows(os.path.join(tmp_path, s, "curves.csv"))
              for s in ("default", "mirrored")}
    assert len(curves["mirrored"]) == 4
    for one, two in zip(curves["default"], curves["mirrored"]):  # the decisive check
        assert float(two["train_loss"]) == pytest.approx(float(one["train_loss"]), rel=1e-4)
    plan = json.load(open(tmp_path / "mirrored" / "plan.json"))
    assert plan["fixed"]["config"]["strategy"] == "mirrored"
    assert "strategy" not in json.load(open(tmp_path / "default" / "plan.json"))["fixed"][
        "config"]  # a one-device plan reads as before the field existed
