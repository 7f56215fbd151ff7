"""ExampleGen's user-log source (`UserLogExampleGen`) on Beam's local FnApiRunner: the
artifact holds the split `load_user_log_split` gives on the same log and options.
One Beam job per test (about 5 s each on two busy cores), so they are few."""

import numpy as np
import pytest

apache_beam = pytest.importorskip("apache_beam")

from tfrs_logq.pipelines.beam import artifacts, read_split, run_components  # noqa: E402
from tfrs_logq.pipelines.beam.user_log_source import UserLogExampleGen  # noqa: E402
from tfrs_logq.pipelines.interactions import DataFormatError  # noqa: E402
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split  # noqa: E402


def write_log(directory, seed=0, users=80, n=1500):
    """Two CSV files (one gzip'd would do as well) with text users, integer items,
    ties in time and a malformed line in the second file."""
    rng = np.random.default_rng(seed)
    rows = [f"u{int(u)},{int(i) * 7},{1000 + int(t) * 60}"
            for u, i, t in zip(rng.integers(0, users, n), rng.zipf(1.3, n) % 40,
                               rng.integers(0, 30, n))]
    directory.mkdir()
    (directory / "part-0.csv").write_text("user,item,time\n" + "\n".join(rows[:700]) + "\n")
    (directory / "part-1.csv").write_text("user,item,time\n" + "\n".join(rows[700:720])
                                          + "\nu1,5\n" + "\n".join(rows[720:]) + "\n")
    return directory


def assert_same_split(got, ref):
    a, b = got.interactions, ref.interactions
    for name in ("user", "item", "timestamp", "raw_users", "raw_items"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(got.train_lengths, ref.train_lengths)
    for part in ("validation", "test"):
        for field in ("users", "history_lengths", "targets"):
            np.testing.assert_array_equal(getattr(getattr(got, part), field),
                                          getattr(getattr(ref, part), field))
    assert got.stats() == ref.stats()


def test_user_log_example_gen_equals_load_user_log_split(tmp_path):
    source = UserLogSource(str(write_log(tmp_path / "log")), "user", "item",
                           time_column="time", skip_bad_lines=True)
    root = tmp_path / "root"
    run_components([UserLogExampleGen(source, "temporal", temporal_fraction=0.15,
                                      min_item_interactions=3, num_shards=3)], str(root))
    got = read_split(str(root / "ExampleGen"))
    ref = load_user_log_split(source, "temporal", temporal_fraction=0.15,
                              min_item_interactions=3)
    assert_same_split(got, ref)
    assert got.interactions.raw_users.dtype.kind == "U"
    assert got.interactions.raw_items.dtype == np.int64
    counts = artifacts.read_manifest(str(root / "ExampleGen"))["counts"]
    assert (counts["num_rows"], counts["skipped_lines"]) == (1500, 1)
    assert counts["skipped_examples"][0].startswith(f"{tmp_path / 'log' / 'part-1.csv'}, line 22:")


def test_user_log_example_gen_fails_as_the_library_does(tmp_path):
    source = UserLogSource(str(write_log(tmp_path / "log")), "user", "item",
                           time_column="time")
    with pytest.raises(DataFormatError) as library:
        load_user_log_split(source, "temporal")
    with pytest.raises(DataFormatError) as beam:
        run_components([UserLogExampleGen(source, "temporal")], str(tmp_path / "root"))
    assert str(beam.value) == str(library.value)
    assert f"{tmp_path / 'log' / 'part-1.csv'}, line 22:" in str(beam.value)


def test_run_pipeline_takes_one_source_of_data(tmp_path):
    """`run_pipeline`'s data is a file, a user's log or synthetic draws, one of them; a
    log's skip_bad_lines is its source's. Refused before any component runs."""
    from tfrs_logq.pipelines.beam import run_pipeline
    from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec

    log = UserLogSource(str(write_log(tmp_path / "log")), "user", "item")
    root = tmp_path / "root"
    for kwargs, message in (({}, "no data"),
                            ({"input_path": "x.txt", "data_format": "sasrec", "user_log": log},
                             "both name the data"),
                            ({"user_log": log, "synthetic": SyntheticSpec(num_users=5)},
                             "give one"),
                            ({"user_log": log, "skip_bad_lines": True}, "UserLogSource")):
        with pytest.raises(ValueError, match=message):
            run_pipeline(str(root), **kwargs)
    assert not root.exists()


# -------------------------------------------------- the command: pipeline run --interactions


def _cli(capsys, *argv):
    """``main(argv)`` in process (`tests.cli_process`): (exit code, stdout, stderr)."""
    from tests.cli_process import cli_in_process

    proc = cli_in_process(capsys, *argv)
    return proc.returncode, proc.stdout, proc.stderr


def test_pipeline_run_on_a_users_log_builds_what_the_library_builds(tmp_path, capsys):
    """``pipeline run --interactions`` (DataSource's flags, LogFilters', --skip-bad-lines):
    its ExampleGen artifact is `load_user_log_split`'s split with train's default split
    (temporal, as the log has times), its Statistics the split's training counts, and the
    Trainer takes the artifact's data fields (its config, without training)."""
    from tfrs_logq.pipelines.beam import load_item_statistics
    from tfrs_logq.pipelines.beam.trainer import Trainer

    log = write_log(tmp_path / "log")
    root = tmp_path / "root"
    code, out, err = _cli(capsys, "pipeline", "run", "--pipeline-root", root,
                          "--interactions", log, "--user-column", "user", "--item-column",
                          "item", "--time-column", "time", "--skip-bad-lines",
                          "--min-item-interactions", "3", "--min-user-interactions", "7",
                          "--deduplicate",
                          "--stop-after", "Statistics", "--num-shards", "2",
                          "--sketch-width", "64")
    assert code == 0, err
    assert f"{log} (user-log), split temporal" in out and "1 malformed lines skipped" in out
    source = UserLogSource(str(log), "user", "item", time_column="time", skip_bad_lines=True)
    ref = load_user_log_split(source, "temporal", min_item_interactions=3,
                              min_user_interactions=7, deduplicate=True)
    got = read_split(str(root / "ExampleGen"))
    assert_same_split(got, ref)
    assert ref.interactions.num_users < 80 and len(ref.interactions) < 1500  # filtered
    np.testing.assert_array_equal(load_item_statistics(str(root / "Statistics")).counts,
                                  ref.train_item_counts())
    manifest = artifacts.read_manifest(str(root / "ExampleGen"))
    assert manifest["parameters"] == UserLogExampleGen(
        source, "temporal", min_item_interactions=3, min_user_interactions=7, deduplicate=True,
        num_shards=2).parameters()
    assert (manifest["parameters"]["dataset"], manifest["parameters"]["log_name"]) == ("", "log")
    config = Trainer(str(root / "ExampleGen"), str(root / "Statistics")).config()
    assert (config.dataset, config.split, config.data_format) == ("", "temporal", "user-log")


def test_pipeline_run_on_a_log_without_times_splits_leave_one_out(tmp_path, capsys):
    """train's default for a log without --time-column; --max-bad-share bounds the
    skipped share as in train and data stats (the run stops with the library's line)."""
    log = write_log(tmp_path / "log")
    base = ["pipeline", "run", "--pipeline-root", tmp_path / "root", "--interactions", log,
            "--user-column", "user", "--item-column", "item", "--stop-after", "ExampleGen"]
    strict = UserLogSource(str(log), "user", "item", skip_bad_lines=True, max_bad_share=1e-4)
    with pytest.raises(DataFormatError) as library:
        load_user_log_split(strict, "loo")
    code, _, err = _cli(capsys, *base, "--skip-bad-lines", "--max-bad-share", "0.0001")
    assert code == 2 and err.strip().splitlines()[-1] == f"tfrs-logq: error: {library.value}"
    assert not (tmp_path / "root" / "ExampleGen").exists()
    code, out, err = _cli(capsys, *base, "--skip-bad-lines")
    assert code == 0, err
    assert "split leave-one-out" in out
    skipping = UserLogSource(str(log), "user", "item", skip_bad_lines=True)
    assert_same_split(read_split(str(tmp_path / "root" / "ExampleGen")),
                      load_user_log_split(skipping, "loo"))



def test_a_first_run_refused_for_bad_data_leaves_no_pipeline_root(tmp_path, capsys):
    """ExampleGen refusing the log (here a --time-column it lacks) ends the run with one
    line and leaves no pipeline root, nor the parent it made, no .lock and no .logs (an
    existing root: test_beam_pipeline's
    test_a_run_failing_before_any_component_finished_leaves_the_root_as_it_was)."""
    log = write_log(tmp_path / "log")
    base = ["pipeline", "run", "--interactions", log, "--user-column", "user",
            "--item-column", "item", "--stop-after", "Statistics"]
    code, _, err = _cli(capsys, *base, "--pipeline-root", tmp_path / "runs" / "first",
                        "--time-column", "nosuchcol")
    assert code == 2 and "no column 'nosuchcol'" in err.strip().splitlines()[-1], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log"]


@pytest.mark.slow  # smoke training and BulkInferrer's TensorFlow workers: about 40 s
def test_the_whole_pipeline_runs_on_a_users_log(tmp_path, capsys):
    """ExampleGen to Pusher on a user's log: the Trainer trains on UserLogExampleGen's
    records, BulkInferrer lists and the Evaluator scores every test target of the split,
    Pusher pushes the blessed export."""
    log = write_log(tmp_path / "log")
    root = tmp_path / "root"
    code, out, err = _cli(capsys, "pipeline", "run", "--pipeline-root", root,
                          "--interactions", log, "--user-column", "user", "--item-column",
                          "item", "--time-column", "time", "--skip-bad-lines",
                          "--index", "brute-force", "--top-k", "50", "--sketch-width", "64",
                          "--model_base_path", tmp_path / "serving", "--json")
    assert code == 0, err
    import json

    ran = {c["name"]: c for c in json.loads(out.strip().splitlines()[-1])["components"]}
    assert list(ran) == ["ExampleGen", "Statistics", "Trainer", "Exporter", "BulkInferrer",
                         "Evaluator", "Pusher"]
    split = read_split(str(root / "ExampleGen"))
    assert ran["Evaluator"]["counts"]["num_targets"] == len(split.test)
    assert ran["BulkInferrer"]["counts"]["num_predictions"] == len(split.test)
    assert ran["Pusher"]["pushed"] and (tmp_path / "serving" / "1" / "saved_model.pb").exists()
