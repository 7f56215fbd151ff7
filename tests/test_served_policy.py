"""Offline metrics rank as the served model ranks: on a log with repeat purchases, the
Recall@10 that ``train`` reports and the exported ``top_k`` deliver the same hits,
target by target, under each evaluation policy (history left out, or kept)."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.towers.test_towers_run import write_log
from tfrs_logq.cli import main
from tfrs_logq.metrics import target_ranks
from tfrs_logq.pipelines.sequential import evaluation_arrays
from tfrs_logq.pipelines.splits import target_facts
from tfrs_logq.serving.export import load_run_split, load_trained


def _train_and_export(root, log, flags):
    model_dir, base = str(root / "run"), str(root / "served")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", "--interactions", log, "--user-column", "user", "--item-column",
                     "item", "--time-column", "ts", "--model-dir", model_dir, *flags,
                     "--json"]) == 0
        assert main(["export", "--model-dir", model_dir, "--model_base_path", base,
                     "--model_name", "clicks", "--index", "brute-force", "--k", "10"]) == 0
    result = next(line for line in out.getvalue().splitlines() if line.startswith("{"))
    return model_dir, os.path.join(base, "1"), json.loads(result)


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy")
    return _train_and_export(root, write_log(root / "clicks.csv"), [
        "two-tower", "--steps", "40", "--eval-every", "40", "--batch-size", "32",
        "--embedding-dim", "8", "--history-length", "4"])


def _served_hits(saved_model_dir, histories_raw, targets_raw, exclude_history):
    top_k = tf.saved_model.load(saved_model_dir).signatures["top_k"]
    width = max(len(h) for h in histories_raw)
    padded = np.array([[""] * (width - len(h)) + list(h) for h in histories_raw])
    out = top_k(history=tf.constant(padded), k=tf.constant(10, tf.int32),
                exclude_history=tf.constant(exclude_history))
    ids = out["item_ids"].numpy().astype(str)
    returned = out["scores"].numpy() > -np.inf  # -inf: left out, filling the list
    return np.array([t in row[kept] for row, kept, t in zip(ids, returned, targets_raw)])


def _check_served_equals_offline(model_dir, saved):
    """Under each policy: the served top_k's hits equal the offline ranking's; returns
    the offline hits under exclude-seen and the split's facts."""
    encoder, config, raw_ids = load_trained(model_dir)
    split = load_run_split(model_dir)
    length = config["max_length"]
    facts = target_facts(split, split.test, length)
    assert facts["sent_repeat_share"] > 0.05  # the log has repeats the server never returns
    histories_raw = [raw_ids[split.sequences[u][:n][-length:] - 1]
                     for u, n in zip(split.test.users, split.test.history_lengths)]
    targets_raw = raw_ids[split.test.targets - 1]
    hits = {}
    for exclude_seen in (True, False):
        arrays = evaluation_arrays(split, split.test, length, exclude_seen)
        hits[exclude_seen] = target_ranks(encoder.last_query(arrays["history"]),
                                          encoder.item_embeddings(), arrays["targets"],
                                          exclude=arrays["exclude"]) < 10
        served = _served_hits(saved, histories_raw, targets_raw, exclude_seen)
        np.testing.assert_array_equal(served, hits[exclude_seen])
    assert hits[True].mean() < hits[False].mean()  # the repeats were hits when kept
    return hits[True], facts


def test_sasrec_served_recall_equals_the_offline_one(tmp_path):
    log = write_log(tmp_path / "clicks.csv")
    model_dir, saved, _ = _train_and_export(tmp_path, log, [
        "--preset", "smoke", "--max-length", "4", "--max-epochs", "1",
        "--steps-per-epoch", "3", "--split", "temporal"])
    _check_served_equals_offline(model_dir, saved)


def test_served_recall_equals_the_offline_one_example_by_example(served_run):
    model_dir, saved, result = served_run
    offline, facts = _check_served_equals_offline(model_dir, saved)
    # What train reported is what the server delivers by default.
    assert result["recall@10"] == pytest.approx(offline.mean(), abs=1e-12)
    assert result["repeat_share"] >= result["sent_repeat_share"] == pytest.approx(
        facts["sent_repeat_share"])


def test_train_no_exclude_seen_reports_the_keep_seen_recall(served_run, tmp_path):
    """The policy is a flag of train too: --no-exclude-seen reports what top_k serves with
    exclude_history false."""
    log = write_log(tmp_path / "clicks.csv")
    model_dir, saved, result = _train_and_export(tmp_path, log, [
        "two-tower", "--steps", "40", "--eval-every", "40", "--batch-size", "32",
        "--embedding-dim", "8", "--history-length", "4", "--no-exclude-seen"])
    encoder, config, raw_ids = load_trained(model_dir)
    split = load_run_split(model_dir)
    arrays = evaluation_arrays(split, split.test, config["max_length"], exclude_seen=False)
    kept = target_ranks(encoder.last_query(arrays["history"]), encoder.item_embeddings(),
                        arrays["targets"]) < 10
    assert result["recall@10"] == pytest.approx(kept.mean(), abs=1e-12)
    assert result["recall@10"] > served_run[2]["recall@10"]  # the repeats are hits now
