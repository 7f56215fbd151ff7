"""A two-tower run in a directory (`tfrs_logq.towers.run`): its files, exact resume after a
kill, the directory rules, and the export of the run answering in the log's own ids, as
exact scoring of the loaded towers does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard_events import scalars

from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
from tfrs_logq.serving.export import RetrievalModule, export_version, load_trained
from tfrs_logq.towers import run as tower_run
from tfrs_logq.towers.config import TwoTowerConfig

CONFIG = TwoTowerConfig(loss="inbatch-corrected", steps=24, batch_size=32, embedding_dim=8,
                        history_length=5, learning_rate=2e-2, eval_every=10)


def write_log(path, num_users=120, seed=0):
    """A CSV of text ids (``u7``, ``film-42``): users read items of one of 4 topics."""
    rng = np.random.default_rng(seed)
    lines = ["user,item,ts"]
    for u in range(num_users):
        for t in range(12):
            lines.append(f"u{u},film-{int(rng.integers(0, 15)) * 4 + u % 4},{u * 100 + t}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def log_split(tmp_path_factory):
    path = write_log(tmp_path_factory.mktemp("log") / "log.csv")
    source = UserLogSource(path, "user", "item", time_column="ts")
    data = {"interactions": path, "user_column": "user", "item_column": "item",
            "time_column": "ts", "split": "temporal"}
    return load_user_log_split(source, "temporal"), data


def _same_weights(a: str, b: str) -> None:
    (ea, _, _), (eb, _, _) = load_trained(a), load_trained(b)
    np.testing.assert_array_equal(ea.item_embeddings().numpy(), eb.item_embeddings().numpy())
    for va, vb in zip(ea.model.query_tower.weights, eb.model.query_tower.weights):
        np.testing.assert_array_equal(va.numpy(), vb.numpy())


def test_a_run_writes_its_files_and_a_killed_run_resumes_to_the_same_weights(log_split,
                                                                             tmp_path):
    split, data = log_split
    whole = str(tmp_path / "whole")
    result = tower_run.train_run(CONFIG, split, whole, data)
    assert [r["steps"] for r in result["evaluations"]] == [10, 20, 24]
    names = set(os.listdir(whole))
    assert {"config.json", "vocabulary.json", "metrics.json", "evaluations.json",
            "final.weights.index", "checkpoint"} <= names
    record = json.load(open(os.path.join(whole, "config.json")))
    assert record["model"] == "two-tower" and record["two_tower"]["loss"] == CONFIG.loss
    assert record["interactions"] == data["interactions"] and record["max_length"] == 5
    assert tower_run.is_two_tower_run(whole)

    killed_dir = str(tmp_path / "killed")

    def kill(step):
        if step == 14:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tower_run.train_run(CONFIG, split, killed_dir, data, on_step=kill,
                            checkpoint_seconds=0.0)
    assert not os.path.exists(os.path.join(killed_dir, "metrics.json"))
    with pytest.raises(FileNotFoundError, match="not finished"):
        load_trained(killed_dir)
    resumed = tower_run.train_run(CONFIG, split, killed_dir, data, checkpoint_seconds=0.0)
    assert resumed["resumed_from_step"] == 15
    assert [r["steps"] for r in resumed["evaluations"]] == [10, 20, 24]
    assert resumed["recall@10"] == pytest.approx(result["recall@10"], abs=1e-9)
    _same_weights(whole, killed_dir)


def test_the_directory_rules(log_split, tmp_path):
    split, data = log_split
    directory = str(tmp_path / "run")
    tower_run.train_run(CONFIG, split, directory, data)
    with pytest.raises(tower_run.RunDirectoryError, match="finished"):
        tower_run.train_run(CONFIG, split, directory, data)
    other = TwoTowerConfig(**{**CONFIG.__dict__, "seed": 1})
    with pytest.raises(tower_run.RunDirectoryError, match="another config"):
        tower_run.train_run(other, split, directory, data)
    tower_run.train_run(other, split, directory, data, overwrite=True)
    assert json.load(open(os.path.join(directory, "config.json")))["two_tower"]["seed"] == 1
    sasrec = tmp_path / "sasrec"
    sasrec.mkdir()
    (sasrec / "config.json").write_text(json.dumps({"loss": "mns-corrected"}))
    with pytest.raises(tower_run.RunDirectoryError, match="a SASRec run"):
        tower_run.train_run(CONFIG, split, str(sasrec), data)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(tower_run.RunDirectoryError, match="holds no tfrs-logq run"):
        tower_run.train_run(CONFIG, split, str(stranger), data)
    from tfrs_logq._util.locks import ExclusiveLock

    busy = str(tmp_path / "busy")
    os.makedirs(busy)
    with ExclusiveLock(os.path.join(busy, ".lock"), wait=False):  # another trainer's
        with pytest.raises(tower_run.RunDirectoryError, match="in use by another"):
            tower_run.train_run(CONFIG, split, busy, data)
    assert not os.path.exists(os.path.join(busy, "config.json"))


def test_a_filesystem_without_locks_trains_with_a_warning(log_split, tmp_path, monkeypatch,
                                                          caplog):
    import errno
    import fcntl
    import logging

    def no_flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    split, data = log_split
    config = TwoTowerConfig(**{**CONFIG.__dict__, "steps": 4, "eval_every": 4})
    with caplog.at_level(logging.WARNING, logger=tower_run.__name__):
        result = tower_run.train_run(config, split, str(tmp_path / "nfs"), data)
    assert result["steps"] == 4
    assert any("cannot lock" in r.getMessage() for r in caplog.records)


def test_the_export_answers_in_the_logs_ids_as_exact_scoring(log_split, tmp_path):
    split, data = log_split
    directory = str(tmp_path / "run")
    tower_run.train_run(CONFIG, split, directory, data)
    encoder, record, raw_ids = load_trained(directory)
    assert raw_ids.dtype.kind == "U" and raw_ids[0].startswith("film-")
    module = RetrievalModule(encoder, raw_ids, "brute-force", default_k=5)
    history = np.array([["film-1", "film-5", ""], ["", "nope", "film-2"]])
    served = module.top_k(tf.constant(history), tf.constant(7), tf.constant(True))
    # exact: the towers on the history's internal ids (right-aligned), history left out
    index = {str(r): i + 1 for i, r in enumerate(raw_ids)}
    for row, answer in zip(history, served["item_ids"].numpy()):
        ids = [index[x] for x in row if x in index]
        padded = np.zeros((1, encoder.max_length), np.int64)
        padded[0, encoder.max_length - len(ids):] = ids
        scores = tf.matmul(encoder.last_query(padded),
                           encoder.item_embeddings()[1:], transpose_b=True).numpy()[0]
        scores[np.array(ids) - 1] = -np.inf
        expected = raw_ids[np.argsort(-scores, kind="stable")[:7]]
        assert [x.decode() for x in answer] == list(expected)
    path = export_version(directory, str(tmp_path / "served"), index="brute-force", default_k=5)
    meta = json.load(open(os.path.join(path, "assets", "export.json")))
    assert meta["history_dtype"] == "string" and meta["model"]["model"] == "two-tower"
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](history=tf.constant(history))
    np.testing.assert_array_equal(out["item_ids"].numpy(),
                                  module.serving_default(tf.constant(history))["item_ids"])


def test_tensorboard_logs_every_evaluation_once_across_a_resume(log_split, tmp_path):
    split, data = log_split
    model_dir = tmp_path / "run"

    def kill(step):
        if step == 14:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tower_run.train_run(CONFIG, split, str(model_dir), data, on_step=kill,
                            checkpoint_seconds=0.0)
    result = tower_run.train_run(CONFIG, split, str(model_dir), data, checkpoint_seconds=0.0)
    train, test = scalars(str(model_dir / "logs" / "train")), \
        scalars(str(model_dir / "logs" / "test"))
    rows = {r["steps"]: r for r in result["evaluations"]}
    assert [s for s, _ in train["loss"]] == [10, 20, 24]  # step 10 written once
    for step, value in train["loss"]:
        assert value == pytest.approx(rows[step]["train_loss"], rel=1e-6)
    for step, value in test["recall@10"]:
        assert value == pytest.approx(rows[step]["recall@10"], abs=1e-7)
    assert {"ndcg@10", "recall@10"} <= set(test)
    assert [v for _, v in train["learning_rate"]] == pytest.approx([CONFIG.learning_rate] * 3)
    assert all(v > 0 for _, v in train["steps_per_second"])
