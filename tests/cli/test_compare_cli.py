"""`tfrs-logq data stats --interactions` and `tfrs-logq compare`: what a user
types and sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_process import cli_in_process


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "tfrs_logq.cli", *args], capture_output=True,
                          text=True, timeout=timeout)




@pytest.fixture(scope="module")
def log_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "events.csv"
    rng = np.random.default_rng(1)
    lines = ["user,item,when"]
    for u in range(120):
        topic = u % 4
        for t in range(10):
            item = int(rng.choice(np.arange(topic, 60, 4)))
            lines.append(f"u{u},item-{item},2024-01-01T00:{u % 60:02d}:{t:02d}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_data_stats_of_a_log_prints_the_datasets_keys(log_csv, capsys):
    proc = cli_in_process(capsys, "data", "stats", "--interactions", log_csv, "--user-column",
                       "user", "--item-column", "item", "--time-column", "when", "--split",
                       "temporal", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["dataset"] == "events.csv" and stats["split"] == "temporal"
    assert stats["num_users"] == 120 and stats["num_interactions"] == 1200
    for key in ("source", "data_format", "rows", "skipped_lines", "num_items", "time_range",
                "train", "validation", "test"):
        assert key in stats, key


@pytest.mark.parametrize("args, message", [
    (["--item-column", "nope"], "no column 'nope'"),
    (["--item-column", "item", "--split", "temporal", "--time-column", "user"], "time"),
])
def test_bad_logs_are_one_line_errors_with_exit_2(log_csv, args, message, capsys):
    proc = cli_in_process(capsys, "data", "stats", "--interactions", log_csv, "--user-column",
                       "user", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_compare_on_a_log_writes_a_paired_report(log_csv, tmp_path, capsys):
    out = str(tmp_path / "cmp")
    proc = cli_in_process(capsys, "compare", "--interactions", log_csv, "--user-column", "user",
                       "--item-column", "item", "--time-column", "when", "--split", "loo",
                       "--loss", "inbatch-logq-official", "inbatch-corrected", "--seeds", "0", "1",
                       "--steps", "20", "--eval-every", "10", "--window", "2", "--batch-size",
                       "32", "--embedding-dim", "8", "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(r["loss"], r["seed"]) for r in result["results"]] == [
        ("inbatch-logq-official", "0"), ("inbatch-corrected", "0"), ("inbatch-logq-official", "1"),
        ("inbatch-corrected", "1")]
    assert "compare: 4 runs" in proc.stderr  # progress goes to stderr with --json
    report = open(os.path.join(out, "report.md")).read()
    assert "inbatch-corrected against inbatch-logq-official, recall@10:" in report
    # The index export --index auto would serve, measured on each loss's final model at seed 0.
    with open(os.path.join(out, "served_index.json")) as f:
        served = json.load(f)
    assert served and "Served: `tfrs-logq export --index auto` would serve" in report
    again = cli_in_process(capsys, "compare", "--interactions", "x.csv", "--dataset", "ml-1m")
    assert again.returncode == 2 and "--interactions" in again.stderr
    assert "--dataset" in again.stderr
    neither = cli_in_process(capsys, "compare", "--output-dir", out)
    assert neither.returncode == 2 and "either --interactions" in neither.stderr


@pytest.mark.slow  # a training through the CLI process (19 s on 2 cores): make test-slow
def test_train_on_a_log_through_the_cli_with_a_line_per_epoch_in_a_pipe(log_csv, tmp_path):
    # `train --interactions`; Keras' \r progress bar in piped logs.
    proc = _cli("train", "--interactions", log_csv, "--user-column", "user", "--item-column",
                "item", "--preset", "smoke", "--max-epochs", "1", "--steps-per-epoch", "2",
                "--model-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stdout and "\r" not in proc.stderr
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert result["split"] == "loo" and 0.0 <= result["test"]["recall@10"] <= 1.0
    with open(tmp_path / "run" / "config.json") as f:
        assert json.load(f)["interactions"] == log_csv


@pytest.fixture(scope="module")
def weighted_log_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("weighted") / "plays.csv"
    rng = np.random.default_rng(2)
    lines = ["user,item,plays"]
    for u in range(60):
        for _ in range(8):
            lines.append(f"u{u},i{int(rng.choice(np.arange(u % 3, 30, 3)))},{rng.integers(0, 4)}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_compare_without_split_takes_loo_for_a_log_without_times(weighted_log_csv, tmp_path,
                                                                  capsys):
    """As `train` and `data stats`: no --split and no --time-column is leave-one-out (the
    temporal default was an error on such a log)."""
    proc = cli_in_process(capsys, "compare", "--interactions", weighted_log_csv,
                          "--user-column", "user", "--item-column", "item", "--seeds", "0",
                          "--steps", "2", "--eval-every", "2", "--window", "1",
                          "--batch-size", "16", "--embedding-dim", "4", "--loss",
                          "inbatch-logq-official", "inbatch-corrected", "--output-dir",
                          str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])["plan"]
    assert plan["source"] == "plays.csv, split loo"


def test_compare_weights_the_two_tower_loss_and_refuses_weights_for_sasrec(
        weighted_log_csv, tmp_path, capsys):
    common = ("--interactions", weighted_log_csv, "--user-column", "user", "--item-column",
              "item", "--weight-column", "plays", "--split", "loo", "--seeds", "0",
              "--steps", "4", "--eval-every", "2", "--window", "1", "--batch-size", "16",
              "--embedding-dim", "4")
    out = str(tmp_path / "weighted")
    proc = cli_in_process(capsys, "compare", *common, "--loss", "inbatch-logq-official",
                          "inbatch-corrected", "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])["plan"]
    assert plan["source"] == "plays.csv, split loo, weighted by plays"
    # The same directory without the weights is another plan.
    unweighted = [a for a in common if a not in ("--weight-column", "plays")]
    again = cli_in_process(capsys, "compare", *unweighted, "--loss",
                           "inbatch-logq-official", "inbatch-corrected", "--output-dir", out)
    assert again.returncode == 2 and "another plan" in again.stderr, again.stderr[-2000:]
    sasrec_flags = common[:-4]  # not --batch-size and --embedding-dim: two-tower flags
    assert sasrec_flags[-2:] == ("--window", "1")
    sasrec = cli_in_process(capsys, "compare", "sasrec", *sasrec_flags, "--loss",
                            "bce", "full-softmax", "--output-dir", str(tmp_path / "sasrec"))
    assert sasrec.returncode == 2, sasrec.stderr[-2000:]
    errors = [line for line in sasrec.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "compare two-tower only" in errors[0], sasrec.stderr[-2000:]
    assert not os.path.exists(tmp_path / "sasrec")  # refused before the directory is made


def test_weight_errors_leave_no_directory_and_data_stats_summarises_weights(
        weighted_log_csv, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    text = open(weighted_log_csv).read().splitlines()
    text[1] = text[1].rsplit(",", 1)[0] + ",-2"  # one negative weight
    bad.write_text("\n".join(text) + "\n")
    out = tmp_path / "refused"
    proc = cli_in_process(capsys, "compare", "--interactions", str(bad), "--user-column",
                          "user", "--item-column", "item", "--weight-column", "plays",
                          "--split", "loo", "--seeds", "0", "--steps", "2", "--eval-every",
                          "2", "--window", "1", "--output-dir", str(out))
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "negative weights (the least: -2)" in errors[0], proc.stderr
    assert not out.exists()
    ml = cli_in_process(capsys, "compare", "--dataset", "ml-1m", "--weight-column", "rating",
                        "--output-dir", str(tmp_path / "ml"))
    assert ml.returncode == 2 and "--weight-column is a flag of --interactions" in ml.stderr
    assert not (tmp_path / "ml").exists()
    stats = cli_in_process(capsys, "data", "stats", "--interactions", weighted_log_csv,
                           "--user-column", "user", "--item-column", "item", "--weight-column",
                           "plays", "--split", "loo", "--json")
    assert stats.returncode == 0, stats.stderr[-2000:]
    weights = json.loads(stats.stdout.strip().splitlines()[-1])["weights"]
    original = open(weighted_log_csv).read().splitlines()[1:]
    plays = np.array([float(line.rsplit(",", 1)[1]) for line in original])
    assert weights == {"min": plays.min(), "mean": pytest.approx(plays.mean()),
                       "max": plays.max(), "zeros": int((plays == 0).sum())}


def test_compare_refuses_flags_it_would_ignore_and_other_data_in_a_directory(
        weighted_log_csv, tmp_path, capsys):
    common = ("--user-column", "user", "--item-column", "item", "--split", "loo", "--seeds",
              "0", "--steps", "2", "--eval-every", "2", "--window", "1", "--batch-size", "16",
              "--embedding-dim", "4", "--loss", "inbatch-logq-official", "inbatch-corrected")
    out = str(tmp_path / "cmp")
    first = cli_in_process(capsys, "compare", "--interactions", weighted_log_csv, *common,
                           "--output-dir", out)
    assert first.returncode == 0, first.stderr[-3000:]
    copy = tmp_path / "elsewhere" / os.path.basename(weighted_log_csv)  # same base name
    copy.parent.mkdir()
    lines = open(weighted_log_csv).read().splitlines()
    copy.write_text("\n".join(lines[:-30]) + "\n")
    for log, more in ((weighted_log_csv, ("--deduplicate",)),
                      (weighted_log_csv, ("--min-item-interactions", "1")),
                      (str(copy), ())):
        again = cli_in_process(capsys, "compare", "--interactions", log, *common, *more,
                               "--output-dir", out)
        assert again.returncode == 2, again.stderr[-2000:]
        assert "holds a comparison with another plan (data." in again.stderr
    # A directory made before plans recorded the data is taken as it is.
    plan_path = os.path.join(out, "plan.json")
    plan = json.load(open(plan_path))
    del plan["fixed"]["data"]
    json.dump(plan, open(plan_path, "w"))
    same = cli_in_process(capsys, "compare", "--interactions", weighted_log_csv, *common,
                          "--output-dir", out)
    assert same.returncode == 0 and "data" in json.load(open(plan_path))["fixed"]
    for flags, message in (
            (("--dataset", "ml-1m", "--deduplicate"),
             "--deduplicate is a flag of --interactions"),
            (("--interactions", weighted_log_csv, "--data-dir", str(tmp_path)),
             "--data-dir is --dataset's")):
        proc = cli_in_process(capsys, "compare", *flags, "--output-dir", str(tmp_path / "x"))
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr
        assert not (tmp_path / "x").exists()
    # A flag of another model is refused by the parser, naming it (exit status 2).
    for flags, named in ((("sasrec", "--learning-rate", "0.05"), "--learning-rate"),
                         (("sasrec", "--no-exclude-seen"), "--no-exclude-seen"),
                         (("--preset", "smoke"), "--preset"),
                         (("--model", "sasrec"), "--model")):
        proc = cli_in_process(capsys, "compare", "--interactions", weighted_log_csv, *flags,
                              "--output-dir", str(tmp_path / "x"))
        assert proc.returncode == 2 and named in proc.stderr, proc.stderr
        assert not (tmp_path / "x").exists()


# A user's module, as `tfrs-logq compare --model-fn log_model:build` imports it from the
# current directory: TFRS's quickstart model over the log's ids, read from the log itself.
LOG_MODEL = '''
import csv

import tensorflow as tf
import tensorflow_recommenders as tfrs

with open({log!r}) as f:
    ROWS = list(csv.DictReader(f))
USERS = sorted({{r["user"] for r in ROWS}})
ITEMS = sorted({{r["item"] for r in ROWS}})


class LogModel(tfrs.Model):
    def __init__(self, task):
        super().__init__()
        self.query_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
            tf.keras.layers.Embedding(len(USERS) + 1, 8)])
        self.candidate_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=ITEMS, mask_token=None),
            tf.keras.layers.Embedding(len(ITEMS) + 1, 8)])
        self.task = task

    def compute_loss(self, features, training=False):
        return self.task(self.query_model(features["user_id"]),
                         self.candidate_model(features["item_id"]),
                         candidate_ids=features["item_id"])


def build(task):
    model = LogModel(task)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(learning_rate=0.1))
    return model
'''


def test_compare_takes_your_own_tfrs_model_with_model_fn(log_csv, tmp_path, monkeypatch,
                                                         capsys, request):
    (tmp_path / "log_model.py").write_text(LOG_MODEL.format(log=log_csv))
    monkeypatch.chdir(tmp_path)  # the module is found in the current directory
    request.addfinalizer(lambda: sys.modules.pop("log_model", None))
    out = str(tmp_path / "mine")
    log = ("--interactions", log_csv, "--user-column", "user", "--item-column", "item",
           "--split", "loo")
    proc = cli_in_process(capsys, "compare", "tfrs-model", *log, "--model-fn", "log_model:build",
                          "--loss", "inbatch-logq-tfrs", "inbatch-corrected", "--seeds", "0",
                          "--steps", "4", "--eval-every", "2", "--window", "1",
                          "--batch-size", "32", "--output-dir", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(r["loss"], r["seed"]) for r in result["results"]] == [
        ("inbatch-logq-tfrs", "0"), ("inbatch-corrected", "0")]
    assert result["plan"]["model"] == "tfrs-model"
    assert result["plan"]["config"]["model_fn"] == "log_model:build"
    assert result["plan"]["source"] == "events.csv, split loo"
    assert result["results"][0]["num_users"] == "120"  # the split's facts
    assert "Model: tfrs-model" in open(os.path.join(out, "report.md")).read()
    again = cli_in_process(capsys, "compare", "--report-only", "--output-dir", out)
    assert again.returncode == 0, again.stderr[-2000:]
    # The primary comparison named by flags: the verdict's first sentence answers it.
    assert "Defaults that did not apply: recall@100 was not recorded" in \
        open(os.path.join(out, "report.md")).read()
    named = cli_in_process(capsys, "compare", "--report-only", "--output-dir", out,
                           "--primary-metric", "recall@10", "--primary-baseline", "logq-tfrs")
    assert named.returncode == 0, named.stderr[-2000:]
    report = open(os.path.join(out, "report.md")).read()
    assert "against TFRS's logQ (inbatch-logq-tfrs) at Recall@10" in report.split("\n\n")[2]
    assert "recall@100 was not recorded" not in report  # named, not defaulted
    for flags, message in (
            (("--model-fn", "no_such_module:build"), "no module named 'no_such_module'"),
            (("--model-fn", "log_model:nothing"), "has no function 'nothing'"),
            (("--model-fn", "log_model:build", "--weight-column", "user"),
             "--weight-column weights the built-in two-tower's loss")):
        bad = cli_in_process(capsys, "compare", "tfrs-model", *log, *flags, "--output-dir",
                             str(tmp_path / "refused"))
        errors = [line for line in bad.stderr.splitlines() if "error:" in line]
        assert bad.returncode == 2 and len(errors) == 1 and message in errors[0], bad.stderr
        assert not (tmp_path / "refused").exists()
    # Flags of another model, or none of --model-fn, are the parser's usage errors.
    for flags, named in ((("tfrs-model", "--model-fn", "log_model:build", "--embedding-dim",
                           "8"), "--embedding-dim"),
                         (("tfrs-model",), "--model-fn"),
                         (("--query-model", "user_model"), "--query-model"),
                         (("--model-fn", "log_model:build"), "--model-fn")):
        bad = cli_in_process(capsys, "compare", *log, *flags, "--output-dir",
                             str(tmp_path / "refused"))
        assert bad.returncode == 2 and named in bad.stderr, bad.stderr
        assert not (tmp_path / "refused").exists()


def test_compare_takes_max_bad_share_for_a_log_and_skips_the_served_index_when_told(
        log_csv, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    lines = open(log_csv).read().splitlines()
    bad.write_text("\n".join(lines[:600] + ['u1,"item-1,2024-01-01T00:01:01'] + lines[600:])
                   + "\n")
    common = ("compare", "--interactions", str(bad), "--user-column", "user", "--item-column",
              "item", "--split", "loo", "--loss", "inbatch-logq-tfrs", "inbatch-corrected",
              "--seeds", "0", "--steps", "4", "--eval-every", "4", "--batch-size", "32",
              "--embedding-dim", "8")
    # A stray quote swallows the log's tail: more than --max-bad-share of its lines.
    proc = cli_in_process(capsys, *common, "--skip-bad-lines", "--max-bad-share", "0.01",
                          "--output-dir", str(tmp_path / "a"))
    assert proc.returncode == 2 and "--max-bad-share" in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "a" / "results.csv")
    proc = cli_in_process(capsys, *common, "--skip-bad-lines", "--max-bad-share", "0.9",
                          "--no-served-index", "--output-dir", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not os.path.exists(tmp_path / "b" / "served_index.json")
    assert "Served:" not in open(tmp_path / "b" / "report.md").read()
    for args, flag in ((["--max-bad-share", "1.5"], "--max-bad-share"),
                       (["--dataset", "ml-1m", "--max-bad-share", "0.5"], "--max-bad-share")):
        proc = cli_in_process(capsys, "compare", *args, "--output-dir", str(tmp_path / "c"))
        assert proc.returncode == 2 and flag in proc.stderr, proc.stderr[-2000:]
