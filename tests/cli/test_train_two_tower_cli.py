"""``tfrs-logq train two-tower`` on a user's log, then ``export``: what a user
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
    code = main(["train", "two-tower", "--interactions", log_csv, *COMMON,
                 "--model-dir", model_dir, "--steps", "12", "--eval-every", "6",
                 "--batch-size", "32", "--embedding-dim", "8", "--history-length", "4",
                 "--loss", "mns-logq-tfrs", "--uniform-negatives", "16", "--json"])
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

    assert main(["diagnose", "--model-dir", model_dir]) == 2  # SASRec runs only, one line
    assert "holds a two-tower run; diagnose reads SASRec runs" in capsys.readouterr().err

    base = str(tmp_path / "served")
    assert main(["export", "--model-dir", model_dir, "--model_base_path", base,
                 "--model_name", "events", "--index", "brute-force", "--k", "3"]) == 0
    meta = json.load(open(os.path.join(base, "1", "assets", "export.json")))
    assert meta["history_dtype"] == "string" and meta["max_length"] == 4

    # evaluate: the run's own log, --split taken on it; the built-in datasets' flags refused.
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    srv = ModelServer(ServerOptions(model_name="events", port=0, rest_api_port=0,
                                    model_base_path=base)).start()
    try:
        common = ["evaluate", "--server", f"127.0.0.1:{srv.port}", "--model_name", "events",
                  "--model-dir", model_dir, "--json"]
        results = {}
        for split in ("temporal", "loo"):
            assert main([*common, "--split", split]) == 0
            results[split] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert results[split]["served"] == results[split]["exact"]
        assert results["loo"]["num_targets"] == 120  # one per user: the log's loo split
        assert results["temporal"]["num_targets"] != 120
        for flag, value in (("--dataset", "ml-1m"), ("--data-format", "sasrec")):
            assert main([*common, flag, value]) == 2
            assert f"{flag} is a built-in dataset's flag" in _error(capsys.readouterr().err)
    finally:
        srv.stop()


@pytest.mark.parametrize("flags, named", [
    (("two-tower", "--num-blocks", "3"), "--num-blocks"),  # SASRec's, not two-tower's
    (("--steps", "5"), "--steps"),  # two-tower's, not SASRec's (the default)
    (("--model", "two-tower"), "--model"),  # the subcommand now
])
def test_the_other_familys_flags_are_refused_by_the_parser(log_csv, tmp_path, capsys, flags,
                                                           named):
    with pytest.raises(SystemExit) as exit:  # tyro's usage error
        main(["train", "--interactions", log_csv, *COMMON,
              "--model-dir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and named in err and not (tmp_path / "run").exists(), err


@pytest.mark.parametrize("flags, message", [
    (("--steps", "0"), "`steps` (--steps) must be an integer in [1,"),
    (("--seed", "-1"), "`seed` (--seed) must be an integer in [0,"),
    (("--uniform-negatives", "0"), "`num_negatives` (--uniform-negatives) must be"),
    (("--learning-rate", "0"), "`learning_rate` (--learning-rate) must be in (0, 10)"),
    (("--interactions", ""), "--interactions is empty"),
    (("--model-dir", ""), "argument --model-dir: empty"),
])
def test_a_two_tower_value_out_of_range_is_a_one_line_error_naming_its_flag(
        log_csv, tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    code = main(["train", "two-tower", "--interactions", log_csv, *COMMON,
                 "--model-dir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and os.listdir(tmp_path) == []


def test_a_log_two_tower_cannot_train_is_refused_before_the_directory_is_made(
        tmp_path, capsys, log_csv):
    rows = ["user,item,ts"] + [f"u{u},i{(u + t) % 10},{u * 100 + t}" for u in range(60)
                               for t in range(8)]  # 10 items: Recall@10 is 1 for any model
    (tmp_path / "small.csv").write_text("\n".join(rows) + "\n")
    for log, flags, message in (
            (str(tmp_path / "small.csv"), (), "the catalog has 10 items"),
            (log_csv, ("--batch-size", "100000"), "--batch-size 100,000 is larger than the")):
        code = main(["train", "two-tower", "--interactions", log, *COMMON, "--split", "loo",
                     "--model-dir", str(tmp_path / "run"), "--steps", "2", *flags])
        err = capsys.readouterr().err
        assert code == 2 and message in _error(err), err
        assert not (tmp_path / "run").exists()


def _weighted_log(path, weights):
    """The module's log with a ``plays`` column: ``weights(user, t)`` for each row."""
    rows = open(write_log(path)).read().splitlines()
    out = [rows[0] + ",plays"]
    for line in rows[1:]:
        user, _, ts = line.split(",")
        out.append(f"{line},{weights(int(user[1:]), int(ts) % 100)}")
    path.write_text("\n".join(out) + "\n")
    return str(path)


TINY = ("--steps", "6", "--eval-every", "6", "--batch-size", "32", "--embedding-dim", "8",
        "--history-length", "4", "--loss", "inbatch-corrected", "--json")


def _error(err: str) -> str:
    """The one error line of ``err`` (the log's summary line may precede it)."""
    errors = [line for line in err.splitlines() if line.startswith("tfrs-logq: error:")]
    assert len(errors) == 1, err
    return errors[0]


def _train(log, model_dir, capsys, *more):
    code = main(["train", "two-tower", "--interactions", log, *COMMON,
                 "--model-dir", model_dir, *TINY, *more])
    out, err = capsys.readouterr()
    return code, out, err


def test_weight_column_weights_the_loss_and_is_part_of_the_run(tmp_path, capsys):
    skewed = _weighted_log(tmp_path / "skewed.csv", lambda u, t: 50.0 if u % 4 == 0 else 0.5)
    uniform = _weighted_log(tmp_path / "uniform.csv", lambda u, t: 7.0)
    runs = {}
    for name, log, more in (("plain", uniform, ()),
                            ("uniform", uniform, ("--weight-column", "plays")),
                            ("skewed", skewed, ("--weight-column", "plays"))):
        code, out, err = _train(log, str(tmp_path / name), capsys, *more)
        assert code == 0, err
        runs[name] = json.loads(out.strip().splitlines()[-1])
    # Uniform weights are scaled to mean 1: the unweighted run, to float32 rounding.
    for key in ("recall@10", "ndcg@10"):
        assert runs["uniform"][key] == pytest.approx(runs["plain"][key], abs=1e-6)
    # A quarter of the users weighing 100 times the rest trains another model.
    assert any(abs(runs["skewed"][k] - runs["uniform"][k]) > 1e-4
               for k in runs["skewed"] if k.startswith(("recall@", "ndcg@")))
    config = json.load(open(tmp_path / "skewed" / "config.json"))
    assert config["weight_column"] == "plays"
    assert "weight_column" not in json.load(open(tmp_path / "plain" / "config.json"))
    # The same directory without the weights is another run.
    code, _, err = _train(skewed, str(tmp_path / "skewed"), capsys)
    assert code == 2 and "another config" in _error(err), err


def test_weight_column_errors_are_one_line_and_leave_no_directory(tmp_path, capsys):
    negative = _weighted_log(tmp_path / "negative.csv", lambda u, t: -2 if u == 3 else 1)
    zero = _weighted_log(tmp_path / "zero.csv", lambda u, t: 0)
    for log, message in ((negative, "negative weights (the least: -2)"),
                         (zero, "every training example has weight 0")):
        model_dir = tmp_path / "run"
        code, _, err = _train(log, str(model_dir), capsys, "--weight-column", "plays")
        assert code == 2 and message in _error(err), err
        assert not model_dir.exists()
    code, _, err = _train(zero, str(tmp_path / "run"), capsys, "--weight-column", "missing")
    assert code == 2 and "missing" in _error(err), err
    sasrec = main(["train", "--interactions", zero, *COMMON, "--weight-column", "plays",
                   "--model-dir", str(tmp_path / "sasrec")])
    err = capsys.readouterr().err
    assert sasrec == 2 and "--weight-column weights the two-tower model's loss" in err, err
    builtin = main(["train", "two-tower", "--dataset", "ml-1m", "--weight-column",
                    "rating", "--model-dir", str(tmp_path / "ml")])
    err = capsys.readouterr().err
    assert builtin == 2 and "names a column of --interactions" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "ml").exists()


def _with_bad_line(tmp_path, name="bad.csv"):
    """The module's log with one malformed row (an empty item id) in the middle."""
    lines = open(write_log(tmp_path / name)).read().splitlines()
    lines.insert(40, "u3,,305")
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    return str(tmp_path / name)


@pytest.mark.slow  # trains and reloads per model (11 s on 2 cores): make test-slow
@pytest.mark.parametrize("model", ["two-tower", "sasrec"])
def test_skip_bad_lines_is_taken_recorded_and_reused_by_the_reload(tmp_path, capsys, model):
    from tfrs_logq.serving.export import load_run_split

    log = _with_bad_line(tmp_path)
    model_dir = str(tmp_path / "run")
    flags = (TINY[:-1] if model == "two-tower" else
             ("--preset", "smoke", "--max-epochs", "1", "--steps-per-epoch", "2"))
    args = ["train", model, "--interactions", log, *COMMON,
            "--model-dir", model_dir, *flags]
    assert main(args) == 2  # without the flag: the malformed row is an error
    assert "line 41" in _error(capsys.readouterr().err)
    assert main([*args, "--skip-bad-lines"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert json.load(open(os.path.join(model_dir, "config.json")))["skipped_lines"] == 1
    split = load_run_split(model_dir)  # what export and evaluate read: the same rows
    assert split.interactions.skipped_lines == 1 and len(split.interactions) == 120 * 12
    with open(log, "a") as f:
        f.write("u5,,999\n")  # the file changed: another malformed row
    with pytest.raises(ValueError, match="now has 2 malformed lines and the run skipped 1"):
        load_run_split(model_dir)
    # Rewritten with other item ids (and the one malformed row): evaluate's data check
    # runs before it waits for a server; its load flags are refused for a log's run.
    lines = open(log).read().splitlines()[:-1]
    (tmp_path / "bad.csv").write_text("\n".join(line.replace("film-", "book-")
                                                for line in lines) + "\n")
    evaluate = ["evaluate", "--server", "127.0.0.1:1", "--model_name", "m",
                "--model-dir", model_dir, "--timeout", "0.1"]
    assert main(evaluate) == 2
    assert "has changed since the run was trained" in _error(capsys.readouterr().err)
    assert main([*evaluate, "--skip-bad-lines"]) == 2
    assert "--skip-bad-lines is for a built-in dataset" in _error(capsys.readouterr().err)


def test_a_row_malformed_by_its_weight_is_skipped_again_when_the_run_is_reloaded(
        tmp_path, capsys):
    from tfrs_logq.serving.export import load_run_split

    log = _weighted_log(tmp_path / "w.csv", lambda u, t: "" if (u, t) == (7, 3) else 2)
    model_dir = str(tmp_path / "run")
    code, _, err = _train(log, model_dir, capsys, "--weight-column", "plays",
                          "--skip-bad-lines")
    assert code == 0, err
    assert json.load(open(os.path.join(model_dir, "config.json")))["skipped_lines"] == 1
    split = load_run_split(model_dir)  # the weight column read again: the same rows
    assert split.interactions.skipped_lines == 1 and len(split.interactions) == 120 * 12 - 1


def test_data_flags_that_cannot_apply_are_one_line_errors(log_csv, tmp_path, capsys):
    for flags, message in (
            (("--interactions", log_csv, *COMMON, "--weight-column", ""),
             "--weight-column is empty"),
            (("--user-column", "user", "--time-column", "ts"),
             "(--interactions) is needed with --user-column"),
            (("--interactions", log_csv, "--item-column", "item"),
             "is needed with --interactions")):
        code = main(["train", "two-tower", *flags, "--no-download",
                     "--model-dir", str(tmp_path / "run")])
        assert code == 2 and message in _error(capsys.readouterr().err)
        assert not (tmp_path / "run").exists()


def test_the_log_filters_train_as_compare_and_data_stats_filter_and_the_run_reloads_them(
        log_csv, tmp_path, capsys):
    from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
    from tfrs_logq.serving.export import load_run_split

    filters = {"min_item_interactions": 15, "min_user_interactions": 3, "deduplicate": True}
    expected = load_user_log_split(UserLogSource(log_csv, "user", "item", time_column="ts"),
                                   "loo", **filters)
    assert expected.num_items < load_user_log_split(
        UserLogSource(log_csv, "user", "item", time_column="ts"), "loo").num_items
    model_dir = str(tmp_path / "run")
    code, _, err = _train(log_csv, model_dir, capsys, "--split", "loo",
                          "--min-item-interactions", "15", "--min-user-interactions", "3",
                          "--deduplicate")
    assert code == 0, err
    record = json.load(open(os.path.join(model_dir, "config.json")))
    assert {k: record[k] for k in filters} == filters and record["num_items"] == \
        expected.num_items
    reloaded = load_run_split(model_dir)  # what export and evaluate rank
    assert reloaded.num_items == expected.num_items and len(reloaded.interactions) == \
        len(expected.interactions)
    # A built-in dataset is preprocessed as its papers do: a filter is refused with it.
    code = main(["train", "two-tower", "--dataset", "ml-1m", "--min-item-interactions", "2",
                 "--model-dir", str(tmp_path / "ml")])
    err = capsys.readouterr().err
    assert code == 2 and "--min-item-interactions" in _error(err), err
    assert not (tmp_path / "ml").exists()


def test_train_two_tower_on_a_cluster_without_tf_config_is_one_line(log_csv, tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    model_dir = tmp_path / "run"
    code = main(["train", "two-tower", "--interactions", log_csv, *COMMON,
                 "--model-dir", str(model_dir), "--steps", "2", "--batch-size", "32",
                 "--strategy", "multi-worker"])
    err = capsys.readouterr().err
    assert code == 2 and "TF_CONFIG" in err and len(err.strip().splitlines()) == 1, err
    assert not model_dir.exists()


def test_compare_refuses_a_cluster_strategy_in_one_line(log_csv, tmp_path, capsys):
    code = main(["compare", "two-tower", "--interactions", log_csv, *COMMON,
                 "--output-dir", str(tmp_path / "c"), "--steps", "2", "--batch-size", "32",
                 "--strategy", "multi-worker"])
    err = capsys.readouterr().err
    assert code == 2 and "train two-tower" in err and len(err.strip().splitlines()) == 1, err
