"""Specification of the `tfrs-logq` command line: flags and their defaults, data resolution
through the flags, and one-line errors instead of tracebacks.

Most tests call `tfrs_logq.cli.main` in process; the ones about start-up (what the
parser imports, what TensorFlow prints) run a fresh interpreter.
"""

import argparse
import csv
import dataclasses
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from pipeline_data import SHARED, isolated_cache, needs_shared  # noqa: F401  (autouse fixture)

from tfrs_logq import cli


def run(capsys, *argv):
    """``main(argv)`` in process: (exit code, stdout, stderr)."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *fragments):
    assert code == 2, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]  # data lines may come before it
    assert last.startswith("tfrs-logq: error: ") or "error: argument" in last, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def _parsers(parser, path=()):
    """Every (sub)parser, fully built, with its command path."""
    parser.format_help()  # builds a lazily populated parser
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def _options(parser):
    return [a for a in parser._actions if a.option_strings
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def _write_ratings(directory, users=40, items=30, seed=0, bad_lines=0):
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        for k in range(int(rng.integers(6, 14))):
            item = int(rng.zipf(1.5) % items) + 1
            lines.append(f"{u}::{item}::5::{1_000_000 + 1000 * k + u}\n")
    lines += ["this is not a rating\n"] * bad_lines
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "ratings.dat"), "w") as f:
        f.writelines(lines)
    return len(lines) - bad_lines


def _write_sasrec(directory, users=20):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "ml-1m.txt"), "w") as f:
        f.writelines(f"{u} {1 + (u + k) % 7}\n" for u in range(1, users + 1) for k in range(6))


def _fake_model_dir(root, data_dir, data_format, split="loo"):
    """A training output's config.json and vocabulary.json (no weights): enough for every
    check `evaluate` makes before it loads the model."""
    from tfrs_logq.pipelines.datasets import load_dataset

    inter = load_dataset("ml-1m", data_dir, fmt=data_format, download_ok=False)
    model_dir = root / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "dataset": "ml-1m", "split": split, "loss": "mns-corrected", "data_dir": data_dir,
        "data_format": data_format, "max_length": 5, "embedding_dim": 4, "num_blocks": 1,
        "num_heads": 1, "dropout": 0.1, "num_negatives": 4, "temporal_fraction": None,
        "num_items": inter.num_items}))
    (model_dir / "vocabulary.json").write_text(json.dumps(
        {"raw_items": [str(x) for x in inter.raw_items]}))
    return model_dir


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------- flags


def test_every_option_shows_its_default_in_help():
    missing = []
    for path, parser in _parsers(cli.build_parser()):
        formatter = parser._get_formatter()
        for action in _options(parser):
            if not action.required and "default" not in formatter._expand_help(action):
                missing.append((" ".join(path), action.option_strings[0]))
    assert not missing


def test_every_flag_takes_both_spellings_and_help_shows_one():
    lacking = []
    for path, parser in _parsers(cli.build_parser()):
        for action in _options(parser):
            for flag in action.option_strings:
                body = flag[2:]
                other = "--" + (body.replace("-", "_") if "-" in body else body.replace("_", "-"))
                if other != flag and other not in action.option_strings:
                    lacking.append((" ".join(path), flag))
    assert not lacking
    help_text = {path: p.format_help() for path, p in _parsers(cli.build_parser())}
    assert "--data-dir" in help_text[("train",)] and "--data_dir" not in help_text[("train",)]
    serve = help_text[("serve",)]  # TF Serving's own flag names
    assert "--model_base_path" in serve and "--model-base-path" not in serve
    args = cli.build_parser().parse_args(["data", "stats", "--format", "sasrec",
                                          "--data_dir", "d", "--fraction", "0.2"])
    assert (args.data_format, args.data_dir, args.temporal_fraction) == ("sasrec", "d", 0.2)


def test_flags_are_built_from_the_config_dataclasses_and_module_constants():
    from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
    from tfrs_logq.pipelines.splits import SPLITS
    from tfrs_logq.sasrec.objectives import OBJECTIVES
    from tfrs_logq.sasrec.training import PRESETS, STRATEGIES, TrainConfig
    from tfrs_logq.serving.server import ServerOptions

    parsers = {path: p for path, p in _parsers(cli.build_parser())}
    by_dest = {path: {a.dest: a for a in _options(p)} for path, p in parsers.items()}
    train = by_dest[("train",)]
    for field in dataclasses.fields(TrainConfig):
        assert field.name in train, field.name
    assert tuple(train["loss"].choices) == tuple(OBJECTIVES)
    assert tuple(train["strategy"].choices) == tuple(STRATEGIES)
    assert tuple(train["preset"].choices) == tuple(PRESETS)
    assert tuple(train["split"].choices) == tuple(SPLITS)
    assert tuple(train["dataset"].choices) == tuple(DATASETS)
    assert tuple(train["data_format"].choices) == tuple(ML1M_FORMATS)
    help_max_length = parsers[("train",)]._get_formatter()._expand_help(train["max_length"])
    assert str(TrainConfig.max_length) in help_max_length
    assert f"smoke: {PRESETS['smoke']['max_length']}" in help_max_length
    experiment = by_dest[("experiment",)]
    for field in dataclasses.fields(TrainConfig):
        if field.name not in ("dataset", "split", "loss", "seed"):
            assert field.name in experiment, field.name
    for field in dataclasses.fields(ServerOptions):
        assert field.name in by_dest[("serve",)], field.name
    stats = by_dest[("data", "stats")]
    assert stats["split"].default is None  # TrainConfig's default applies (temporal)
    for path in (("train",), ("evaluate",), ("data", "stats")):
        assert {"skip_bad_lines", "no_cache", "data_dir"} <= set(by_dest[path]), path
    assert "data_dir" in by_dest[("experiment",)]


@pytest.mark.parametrize("flag", ["--skip-bad-lines", "--no-cache", "--no-download"])
def test_experiment_neither_shows_nor_takes_the_load_flags(capsys, tmp_path, flag,
                                                            monkeypatch):
    """`run_grid` loads its data with the defaults: a flag it would refuse is not in help,
    and given anyway it is a one-line usage error before anything runs."""
    import tfrs_logq.studies.experiment as experiment

    monkeypatch.setattr(experiment, "run_grid", lambda *a, **kw: pytest.fail("ran"))
    parsers = {path: p for path, p in _parsers(cli.build_parser())}
    assert flag not in parsers[("experiment",)].format_help()
    assert flag in parsers[("train",)].format_help()
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", flag)
    assert_one_line_error(code, err, flag)
    assert not (tmp_path / "e").exists()



def test_train_flags_help_is_train_configs_field_documentation():
    """jsonargparse reads `TrainConfig`'s field docstrings: each is its flag's help, so the
    Python API and the command line are documented once."""
    from tfrs_logq.cli._dataclass_flags import dataclass_fields
    from tfrs_logq.sasrec.config import TrainConfig

    fields = dataclass_fields(TrainConfig)
    assert [f.name for f in fields] == [f.name for f in dataclasses.fields(TrainConfig)]
    parsers = {path: p for path, p in _parsers(cli.build_parser())}
    train = {a.dest: a for a in _options(parsers[("train",)])}
    for field in fields:
        assert field.doc, field.name  # docstring-parser missing would leave help empty
        assert train[field.name].help.startswith(field.doc), field.name
        assert field.default == getattr(TrainConfig, field.name), field.name
    assert {f.name: f.kind for f in fields}["max_validation_users"] is int  # Optional[int]


@pytest.mark.parametrize("flag, value", [
    ("--dropout", 1.0), ("--temporal-fraction", 0.5), ("--learning-rate", 0.0),
    ("--max-validation-users", 0), ("--length-buckets", 0), ("--patience", -1),
])
def test_flag_values_are_checked_by_train_config_in_its_words(capsys, tmp_path, flag, value):
    """The command line refuses what `TrainConfig` refuses, and says it in its words."""
    from tfrs_logq.sasrec.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError) as excinfo:
        TrainConfig(**{flag[2:].replace("-", "_"): value})
    code, _, err = run(capsys, "train", "--model-dir", tmp_path / "m", flag, value)
    assert_one_line_error(code, err, f"argument {flag}", excinfo.value.problem)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("content, fragment", [
    ('{"seed": true}', "seed must be int, got true"),
    ('{"dropout": "high"}', "dropout must be float"),
    ('{"loss": "corrected"}', "loss must be one of"),
    ('{"temporal_fraction": 0.7}', "temporal_fraction must be in (0, 0.5)"),
])
def test_config_file_values_are_type_checked_then_checked_by_train_config(
        capsys, tmp_path, content, fragment):
    path = tmp_path / "config.json"
    path.write_text(content)
    code, _, err = run(capsys, "train", "--model-dir", tmp_path / "m", "--config", path)
    assert_one_line_error(code, err, f"--config {path}: {fragment}")


def test_seed_must_be_non_negative_and_the_error_names_the_flag(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--model-dir", tmp_path / "m", "--seed", "-1")
    assert_one_line_error(code, err, "argument --seed", "-1")
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--seeds", "0,-1")
    assert_one_line_error(code, err, "argument --seeds", "-1")


def test_experiment_parallel_reaches_run_grid(capsys, tmp_path, monkeypatch):
    import tfrs_logq.studies.experiment as experiment

    seen = {}
    monkeypatch.setattr(experiment, "run_grid", lambda *a, **kw: seen.update(kw))
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--parallel", "3",
                       "--losses", "inbatch-none", "--seeds", "0")
    assert code == 0, err
    assert seen["parallel"] == 3
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--parallel", "0")
    assert_one_line_error(code, err, "argument --parallel", "0")


# ----------------------------------------------------------------------- start-up cost


def _fresh(code, env=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)


def _skip_if_package_imports_tensorflow():
    proc = _fresh("import sys, tfrs_logq; print('tensorflow' in sys.modules)")
    if proc.stdout.strip() != "False":
        pytest.skip("`import tfrs_logq` imports TensorFlow itself (tfrs_logq/__init__.py)")


def test_building_the_parser_and_top_level_help_import_no_tensorflow():
    _skip_if_package_imports_tensorflow()
    proc = _fresh("import sys\nfrom tfrs_logq import cli\n"
                  "p = cli.build_parser()\nhelp_text = p.format_help()\n"
                  "p.parse_args(['data', 'stats', '--split', 'loo'])\n"
                  "print('tensorflow' in sys.modules)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_tensorflow_start_up_logs_are_silenced_unless_verbose(tmp_path):
    _skip_if_package_imports_tensorflow()
    code = ("import sys\nfrom tfrs_logq import cli\n"
            "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "import tensorflow as tf\ntf.constant(1.0) + 1.0\n")
    quiet = subprocess.run([sys.executable, "-c", code, "train", "--help"],
                           capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items()
                                if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "--model-dir" in quiet.stdout
    tf_lines = [line for line in quiet.stderr.splitlines()
                if "cuda" in line.lower() or "cpu_feature_guard" in line or "cuInit" in line]
    assert not tf_lines, quiet.stderr


# ------------------------------------------------------------------------------- data


def test_data_stats_and_train_default_to_temporal_and_say_the_file_has_no_timestamps(
        capsys, tmp_path):
    data = tmp_path / "sasrec"
    _write_sasrec(data)
    code, _, err = run(capsys, "data", "stats", "--data-dir", data)
    assert_one_line_error(code, err, "temporal split needs timestamps", "ml-1m.txt",
                          "--split loo", "ratings.dat")
    model_dir = tmp_path / "model"
    code, _, err = run(capsys, "train", "--data-dir", data, "--model-dir", model_dir)
    assert_one_line_error(code, err, "temporal split needs timestamps", "--split loo")
    assert not model_dir.exists()  # nothing written before the data is known to be usable


def test_data_dir_is_checked_and_never_falls_back(capsys, tmp_path, monkeypatch):
    elsewhere = tmp_path / "env"
    _write_ratings(elsewhere)
    monkeypatch.setenv("TFRS_LOGQ_DATA_DIR", str(elsewhere))
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", "")
    assert_one_line_error(code, err, "--data-dir is empty")
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir",
                       tmp_path / "missing")
    assert_one_line_error(code, err, "missing", "does not exist")


def test_several_candidates_fail_naming_them_and_data_format_picks_one(capsys, tmp_path):
    data = tmp_path / "data"
    _write_ratings(data / "partial")
    _write_sasrec(data / "sasrec")
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data)
    assert_one_line_error(code, err, "partial/ratings.dat", "sasrec/ml-1m.txt", "--data-format")
    code, out, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data,
                         "--data-format", "sasrec", "--json")
    assert code == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["source"] == str(data / "sasrec" / "ml-1m.txt") and stats["rows"] == 120
    assert "sasrec/ml-1m.txt" in err and "120 rows" in err  # which file, always said


def test_skipped_lines_are_counted_printed_and_in_json(capsys, tmp_path):
    data = tmp_path / "data"
    rows = _write_ratings(data, bad_lines=2)
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data)
    assert_one_line_error(code, err, "ratings.dat, line", "--skip-bad-lines")
    code, out, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data,
                         "--skip-bad-lines", "--json")
    assert code == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert (stats["rows"], stats["skipped_lines"]) == (rows, 2)
    assert "2 malformed lines skipped" in err
    code, out, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data,
                         "--skip-bad-lines", "--no-cache")
    assert code == 0 and "2 malformed lines skipped" in out + err


def test_train_skips_bad_lines_and_reports_the_count(capsys, tmp_path):
    data = tmp_path / "data"
    rows = _write_ratings(data, bad_lines=1)
    code, out, err = run(capsys, "train", "--preset", "smoke", "--split", "loo",
                         "--max-epochs", "1", "--data-dir", data, "--model-dir",
                         tmp_path / "m", "--skip-bad-lines", "--json")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["data"]["skipped_lines"] == 1 and result["data"]["rows"] == rows
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["data_format"] == "ratings"  # the resolved source is recorded


SMOKE_LINE = ("tfrs-logq: warning: smoke preset: a plumbing check, not a usable model; use "
              "--preset cpu for a useful one")


def test_a_smoke_run_ends_saying_it_is_not_a_usable_model(capsys, tmp_path, monkeypatch):
    # Issue 23: the README's walkthrough trained a smoke model at random-level recall
    # (test Recall@10 0.0023 on ML-1M, 10/3,416 = 0.0029 for a random list) and said
    # nothing. Another preset, cut as small, trains as little and says nothing.
    data = tmp_path / "data"
    _write_ratings(data)
    tiny = ["--split", "loo", "--max-epochs", "1", "--steps-per-epoch", "2", "--max-length",
            "20", "--embedding-dim", "8", "--data-dir", data]
    for preset, json_flag in (("smoke", "--json"), ("smoke", None), ("cpu", "--json")):
        argv = ["train", "--preset", preset, *tiny, "--model-dir", tmp_path / preset,
                "--overwrite", *([json_flag] if json_flag else [])]
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        if json_flag:
            assert json.loads(out)["epochs"] == 1  # stdout stays one JSON object
        lines = err.strip().splitlines()
        if preset == "smoke":
            assert lines[-1] == SMOKE_LINE and err.count("smoke preset") == 1, err
        else:
            assert "smoke preset" not in err, err
    import tfrs_logq.studies.experiment as experiment

    monkeypatch.setattr(experiment, "run_grid", lambda *a, **kw: None)
    for preset in ("smoke", "cpu"):
        code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--preset",
                           preset, "--losses", "inbatch-none", "--seeds", "0")
        assert code == 0 and (SMOKE_LINE in err) == (preset == "smoke"), err


def test_a_cache_directory_that_is_a_file_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    data = tmp_path / "data"
    _write_ratings(data)
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(blocker))
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data)
    assert_one_line_error(code, err, "cache-file", "TFRS_LOGQ_CACHE_DIR", "--no-cache")
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", data,
                       "--no-cache")
    assert code == 0, err


@needs_shared
def test_shared_data_root_needs_data_format_for_loo(capsys):
    code, _, err = run(capsys, "data", "stats", "--split", "loo", "--data-dir", SHARED,
                       "--no-download")
    assert_one_line_error(code, err, "ml-1m-partial/ratings.dat.gz",
                          "ml-1m-sasrec/ml-1m.txt.gz", "--data-format")


# ------------------------------------------------------------------------ one-line errors


@pytest.mark.parametrize("content, fragment", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"lossy": 1}', "lossy"),
    ('{"seed": -1}', "seed"),
])
def test_bad_or_missing_config_json(capsys, tmp_path, content, fragment):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "train", "--model-dir", tmp_path / "m", "--config", path)
    assert_one_line_error(code, err, "--config", str(path), fragment)


def test_verbose_shows_the_traceback(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--model-dir", tmp_path / "m", "--config",
                       tmp_path / "nope.json", "--verbose")
    assert code == 2 and "Traceback" in err and "tfrs-logq: error: " in err


def test_export_onto_a_file(capsys, tmp_path):
    target = tmp_path / "a-file"
    target.write_text("")
    code, _, err = run(capsys, "export", "--model-dir", tmp_path / "m", "--model_base_path",
                       target, "--model_name", "x")
    assert_one_line_error(code, err, "--model_base_path", str(target), "not a directory")


@pytest.mark.parametrize("value", ["0", "1.5", "x"])
def test_export_refuses_a_search_fraction_outside_0_1(capsys, tmp_path, value):
    code, _, err = run(capsys, "export", "--model-dir", tmp_path / "m", "--model_base_path",
                       tmp_path / "b", "--model_name", "x", "--scann-search-fraction", value)
    assert_one_line_error(code, err, "--scann-search-fraction", value)


def test_export_passes_the_search_fraction_on(capsys, tmp_path, monkeypatch):
    import tfrs_logq.cli.export as cli_export
    from tfrs_logq.serving import export as serving_export

    seen = {}
    monkeypatch.setattr(cli_export, "read_model_config", lambda model_dir: {})
    monkeypatch.setattr(serving_export, "export_version",
                        lambda *a, **kw: seen.update(kw) or str(tmp_path / "b" / "1"))
    code, out, _ = run(capsys, "export", "--model-dir", tmp_path / "m", "--model_base_path",
                       tmp_path / "b", "--model_name", "x", "--scann-search-fraction", "1")
    assert code == 0 and seen["search_fraction"] == 1.0 and seen["default_k"] == 100


@pytest.mark.parametrize("which", ["rest", "grpc"])
def test_serve_on_a_port_in_use(capsys, tmp_path, which):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    flags = {"rest": ["--port", "0", "--rest_api_port", port],
             "grpc": ["--port", port, "--rest_api_port", "0"]}[which]
    try:
        code, _, err = run(capsys, "serve", "--model_name", "m", "--model_base_path",
                           tmp_path, *flags)
    finally:
        holder.close()
    flag = {"rest": "--rest_api_port", "grpc": "--port"}[which]
    assert_one_line_error(code, err, f"{flag} {port}", "in use")
    # The base path holds no version: TF Serving's message comes first.
    assert f"No versions of servable m found under base path {tmp_path}" in err


def test_serve_a_base_path_that_does_not_exist(capsys, tmp_path):
    code, _, err = run(capsys, "serve", "--model_name", "m", "--model_base_path",
                       tmp_path / "nothing", "--port", "0", "--rest_api_port", "0")
    assert_one_line_error(code, err, "--model_base_path", "does not exist")


def test_evaluate_against_a_dead_server(capsys, tmp_path):
    data = tmp_path / "data"
    _write_ratings(data)
    model_dir = _fake_model_dir(tmp_path, str(data), "ratings")
    address = f"127.0.0.1:{_free_port()}"
    code, _, err = run(capsys, "evaluate", "--server", address, "--model_name", "m",
                       "--model-dir", model_dir, "--timeout", "1")
    assert_one_line_error(code, err, address, "--server")


def test_evaluate_a_model_name_the_server_does_not_serve(capsys, tmp_path):
    pytest.importorskip("tensorflow_serving")
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    data = tmp_path / "data"
    _write_ratings(data)
    model_dir = _fake_model_dir(tmp_path, str(data), "ratings")
    base = tmp_path / "base"
    base.mkdir()
    server = ModelServer(ServerOptions(model_name="served", model_base_path=str(base),
                                       port=0, rest_api_port=0)).start()
    try:
        code, _, err = run(capsys, "evaluate", "--server", f"127.0.0.1:{server.port}",
                           "--model_name", "wrong", "--model-dir", model_dir, "--timeout", "5")
    finally:
        server.stop()
    assert_one_line_error(code, err, "'wrong'", "--model_name")


def test_evaluate_temporal_on_a_sasrec_model(capsys, tmp_path):
    data = tmp_path / "data"
    _write_sasrec(data)
    model_dir = _fake_model_dir(tmp_path, str(data), "sasrec")
    code, _, err = run(capsys, "evaluate", "--server", "127.0.0.1:1", "--model_name", "m",
                       "--model-dir", model_dir, "--split", "temporal")
    assert_one_line_error(code, err, "temporal split needs timestamps", "--split loo")


def test_evaluate_a_directory_that_is_no_training_output(capsys, tmp_path):
    code, _, err = run(capsys, "evaluate", "--server", "127.0.0.1:1", "--model_name", "m",
                       "--model-dir", tmp_path)
    assert_one_line_error(code, err, "--model-dir", "config.json")


# ------------------------------------------------------------------------------- demo


def test_demo_cli_writes_table_csv_and_png(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "demo", "--output-dir", str(out),
         "--num-items", "3000", "--num-users", "500", "--steps", "30", "--batch-size", "128",
         "--num-eval", "256", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    methods = [r["method"] for r in result["results"]]
    assert methods == ["oracle (true P(d|u))", "in-batch, none", "in-batch, logq",
                       "in-batch, corrected"]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and 0 <= float(rows[1]["recall@1000"]) <= 1
    assert (out / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_says_what_it_is_doing_in_a_log(tmp_path):
    # Issue 23: piped or logged (stdout not a terminal), a demo correction printed
    # nothing for its whole training (Keras' bar is one line per epoch, the demo one
    # epoch). Now: a timed line per phase and a line every tenth of the steps.
    steps = 30
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "demo", "--output-dir", str(tmp_path / "d"),
         "--num-items", "3000", "--num-users", "500", "--steps", str(steps), "--batch-size",
         "128", "--num-eval", "256", "--num-topics", "40", "--topic-sharpness", "3.5"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "3,000 items, 500 users, 40 topics (sharpness 3.5)" in lines[0]
    every = -(-steps // 10)
    expected = [f"step {n}/{steps}:" for n in range(every, steps + 1, every)]
    for correction in ("none", "logq", "corrected"):
        start = next(i for i, line in enumerate(lines) if f"correction={correction!r}" in line)
        done = next(i for i, line in enumerate(lines) if f"{correction}: trained in" in line)
        steps_seen = [line.split()[0] + " " + line.split()[1] for line in lines[start + 1:done]]
        assert steps_seen == expected, lines[start:done + 1]
        assert lines[done - 1].endswith("about 0 s left")
    stamped = [line for line in lines if line.startswith("[")]
    assert len(stamped) == 3 + 2 * 3  # the stream, its regime, 2 a correction, the files
    assert "] regime: at the truth P(p|u)/Q(p) has median" in stamped[1]
    seconds = [float(line[1:line.index(" s]")]) for line in stamped]
    assert seconds == sorted(seconds)


def test_demo_cli_rejects_bad_corrections():
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "demo", "--corrections", "none,bogus"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "bogus" in proc.stderr


def test_study_counts_a_presets_pending_runs_and_takes_both_spellings(tmp_path):
    from tfrs_logq.studies import study

    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "study", "--preset", "samplers", "--pending",
         "--output_dir", str(tmp_path), "--max_runs", "1", "--seeds", "0", "1"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == str(len(study.preset_runs("samplers", [0, 1])))
    proc = subprocess.run([sys.executable, "-m", "tfrs_logq.cli", "study", "--preset", "x"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "argument --preset: invalid choice: 'x'" in proc.stderr
