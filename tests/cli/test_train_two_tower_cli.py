"""``tfrs-logq train --model two-tower`` on a user's log, then ``export``: what a user
types and sees, and the flags of the other family refused in one line."""

from __future__ import annotations

import json
import os

import pytest

from tests.towers.test_towers_run import write_log
from tfrs_logq.cli import main

COMMON = ("--user-column", "user", "--item-column", "item", "--time-column", "ts")


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory):
    return write_log(tmp_path_factory.mktemp("log") / "events.csv")


def test_train_two_tower_on_a_log_then_export_in_its_ids(log_csv, tmp_path, capsys):
    model_dir = str(tmp_path / "run")
    code = main(["train", "--model", "two-tower", "--interactions", log_csv, *COMMON,
                 "--model-dir", model_dir, "--steps", "12", "--eval-every", "6",
                 "--batch-size", "32", "--embedding-dim", "8", "--history-length", "4",
                 "--loss", "mns-logq-tfrs", "--num-negatives", "16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["model"] == "two-tower" and result["steps"] == 12
    assert 0 <= result["recall@10"] <= 1 and result["data"]["source"] == log_csv
    assert "step 6:" in err and "step 12:" in err  # progress on stderr under --json
    config = json.load(open(os.path.join(model_dir, "config.json")))
    assert config["two_tower"]["loss"] == "mns-logq-tfrs"
    assert config["split"] == "temporal" and config["interactions"] == log_csv
    assert config["dataset"] is None  # a user's log, not TrainConfig's default ml-1m

    base = str(tmp_path / "served")
    assert main(["export", "--model-dir", model_dir, "--model_base_path", base,
                 "--model_name", "events", "--index", "brute-force", "--k", "3"]) == 0
    meta = json.load(open(os.path.join(base, "1", "assets", "export.json")))
    assert meta["history_dtype"] == "string" and meta["max_length"] == 4


@pytest.mark.parametrize("flags, message", [
    (("--model", "two-tower", "--num-blocks", "3"), "--num-blocks is a SASRec flag"),
    (("--model", "two-tower", "--loss", "gbce"), "`loss` must be one of"),
    (("--steps", "5"), "--steps is a two-tower flag"),
    (("--loss", "inbatch-logq-tfrs", "--preset", "smoke"), "loss"),
])
def test_the_other_familys_flags_are_one_line_errors(log_csv, tmp_path, capsys, flags,
                                                     message):
    code = main(["train", "--interactions", log_csv, *COMMON,
                 "--model-dir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
