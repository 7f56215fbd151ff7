"""MLflow runs of `compare` and `train two-tower` (`tfrs_logq._util.tracking`), written to a
local file store and read back with `mlflow.tracking.MlflowClient`: the comparison a
parent run, each loss and seed a child with its evaluations and result equal to
curves.csv's and results.csv's, the training one run; and the one-line refusals."""

import os
import sys

import numpy as np
import pytest

from tfrs_logq._util.tracking import Tracking, tracking
from tfrs_logq.pipelines.interactions import build_interactions
from tfrs_logq.pipelines.splits import make_split
from tfrs_logq.studies._grid import read_rows
from tfrs_logq.studies.compare.builtin import run_compare
from tfrs_logq.studies.compare.plan import Plan
from tfrs_logq.towers import run as tower_run
from tfrs_logq.towers.config import TwoTowerConfig

mlflow_tracking = pytest.importorskip("mlflow.tracking")

CONFIG = TwoTowerConfig(steps=20, batch_size=64, embedding_dim=8, history_length=5,
                        learning_rate=2e-2, eval_every=10)


@pytest.fixture(scope="module")
def split():
    rng = np.random.default_rng(1)
    users = np.repeat(np.arange(150), 10)
    items = np.concatenate([rng.choice(np.arange(u % 3, 60, 3), 10) for u in range(150)])
    return make_split(build_interactions(users, items, np.arange(len(users)),
                                         min_item_interactions=1), "loo")


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return mlflow_tracking.MlflowClient(tracking_uri=uri)


def _runs(client):
    experiment = client.get_experiment_by_name("tfrs-logq")
    return client.search_runs([experiment.experiment_id])


def _history(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key),
                                              key=lambda m: m.step)]


def test_a_comparison_is_a_parent_run_with_a_child_a_loss_and_seed(split, tmp_path, store):
    plan = Plan(losses=("inbatch-logq-tfrs", "inbatch-corrected"), seeds=(0,), config=CONFIG,
                window=1, source="toy")
    out = str(tmp_path / "cmp")
    rows = run_compare(plan, split, out, say=lambda line: None, tracking=tracking(False))
    runs = _runs(store)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["losses"] == "inbatch-logq-tfrs,inbatch-corrected"
    assert parent.data.params["config.batch_size"] == "64"
    assert {a.path for a in store.list_artifacts(parent.info.run_id)} >= {
        "report.md", "plan.json", "results.csv", "paired.png"}
    curves = read_rows(os.path.join(out, "curves.csv"))
    results = {r["loss"]: r for r in rows}
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"
        loss = child.data.params["loss"]
        assert child.data.params["seed"] == "0" and child.data.params["model"] == "two-tower"
        mine = {int(r["steps"]): r for r in curves if r["loss"] == loss}
        recall = _history(store, child.info.run_id, "recall_at_10")
        assert [step for step, _ in recall] == [10, 20]
        for step, value in recall:
            assert value == pytest.approx(float(mine[step]["recall@10"]), abs=1e-7)
        assert _history(store, child.info.run_id, "head/recall_at_10")
        result = _history(store, child.info.run_id, "result.recall_at_10")
        assert result == [(20, pytest.approx(float(results[loss]["recall@10"]), abs=1e-7))]


def test_a_training_is_one_run_with_its_config(split, tmp_path, store):
    model_dir = tmp_path / "run"
    result = tower_run.train_run(CONFIG, split, str(model_dir), {"dataset": "toy"},
                                 tracking=tracking(True))
    (run,) = _runs(store)
    assert run.info.status == "FINISHED" and run.data.params["two_tower.loss"] == CONFIG.loss
    assert [s for s, _ in _history(store, run.info.run_id, "train_loss")] == [10, 20]
    assert _history(store, run.info.run_id, "recall_at_10")[-1][1] == pytest.approx(
        result["recall@10"], abs=1e-7)
    assert {a.path for a in store.list_artifacts(run.info.run_id)} == {
        "config.json", "metrics.json"}


def test_mlflow_is_off_unless_asked_and_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking(False) is None
    with pytest.raises(ValueError, match="--mlflow needs MLFLOW_TRACKING_URI") as caught:
        tracking(True)
    assert "\n" not in str(caught.value)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not installed
    with pytest.raises(ValueError, match=r'pip install -e "\.\[mlflow\]"'):
        tracking(True)


def test_the_cli_refuses_mlflow_before_reading_the_log(tmp_path, monkeypatch, capsys):
    from tfrs_logq.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code = main(["compare", "two-tower", "--interactions", str(tmp_path / "absent.csv"),
                 "--user-column", "u", "--item-column", "i", "--mlflow",
                 "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "--mlflow needs MLFLOW_TRACKING_URI" in err
    assert "absent.csv" not in err and not (tmp_path / "out").exists()


def test_tracking_names_its_experiment(tmp_path, store, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "mine")
    assert isinstance(tracking(True), Tracking)
    assert store.get_experiment_by_name("mine") is not None
