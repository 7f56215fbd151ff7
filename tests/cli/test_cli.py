"""Specification of the `tfrs-logq` command line: flags and their defaults, data resolution
through the flags, and one-line errors instead of tracebacks.

Most tests call `tfrs_logq.cli.main` in process; the ones about start-up (what the
parser imports, what TensorFlow prints) run a fresh interpreter.
"""

import csv
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from cli_process import entries
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
    """Exit status 2, the last line of stderr ``tfrs-logq: error: ...`` with ``fragments``
    (data lines may come before it)."""
    assert code == 2, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("tfrs-logq: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def assert_usage_error(code, err, *flags):
    """A command line tyro refuses: exit status 2, its message naming ``flags``."""
    assert code == 2, err
    assert "Traceback" not in err, err
    for flag in flags:
        assert flag in err, (flag, err)


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


class Reached(Exception):
    """Raised by a library function a test stands in for: the command got that far."""


def reach(monkeypatch, module, name):
    """Replaces ``module.name`` by a stand-in that records its arguments and raises
    `Reached` (which `main` does not catch); returns the record."""
    calls = []

    def stand_in(*args, **kwargs):
        calls.append((args, kwargs))
        raise Reached(name)

    monkeypatch.setattr(module, name, stand_in)
    return calls


def reached(monkeypatch, module, name, *argv):
    """The ``(args, kwargs)`` ``module.name`` was called with by ``main(argv)``."""
    calls = reach(monkeypatch, module, name)
    with pytest.raises(Reached):
        cli.main([str(a) for a in argv])
    return calls[-1]


def help_of(capsys, *path):
    code, out, err = run(capsys, *path, "--help")
    assert code == 0, err
    return out


COMMANDS = [("demo",), ("data", "stats"), ("train",), ("compare",), ("diagnose",), ("export",),
            ("serve",), ("evaluate",), ("pipeline", "run")]
REQUIRED = {("train",): {"--model-dir"},  # TF Serving's own spelling: --model_base_path
            ("export",): {"--model-dir", "--model_base_path", "--model_name"},
            ("serve",): {"--model_name", "--model_base_path"},
            ("evaluate",): {"--server", "--model_name", "--model-dir"},
            ("pipeline", "run"): {"--pipeline-root"}}


# ------------------------------------------------------------------------------- flags


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_shows_every_flags_default_and_a_missing_required_flag_is_one_line(capsys, path):
    shown = entries(help_of(capsys, *path))
    assert "--verbose" in shown
    for flag, text in shown.items():
        if flag in REQUIRED.get(path, ()):
            assert "default:" not in text, (flag, text)
        elif flag != "-h":
            assert "(default: " in text, (flag, text)
        if "_" in flag:  # dashes, except TF Serving's own names
            assert flag in ("--model_name", "--model_base_path"), flag
    if path in REQUIRED:
        code, _, err = run(capsys, *path)
        assert_usage_error(code, err, *REQUIRED[path])


def test_either_spelling_reaches_the_command_help_shows_one_and_old_names_are_refused(
        capsys, monkeypatch):
    import tfrs_logq.sasrec.training  # noqa: F401 (imported unpatched: it binds load_split)
    from tfrs_logq.pipelines import datasets

    args, kwargs = reached(monkeypatch, datasets, "load_split", "data", "stats",
                           "--data-format", "sasrec", "--data_dir", "d", "--temporal_fraction",
                           "0.2", "--split=loo", "--no_cache", "--skip-bad-lines")
    assert args == ("ml-1m", "loo", "d")
    assert kwargs == {"data_format": "sasrec", "temporal_fraction": 0.2, "skip_bad_lines": True,
                      "use_cache": False, "download_ok": True}
    train = help_of(capsys, "train")
    assert "--data-dir" in train and "--data_dir" not in train and "--format" not in train
    for command in ("serve", "export", "evaluate", ("pipeline", "run")):
        # TF Serving's own flag names, shown first (either spelling is taken)
        shown = entries(help_of(capsys, *([command] if isinstance(command, str) else command)))
        assert "--model_base_path" in shown or command == "evaluate", command
        assert "--model_name" in shown or command == ("pipeline", "run"), command
    code, _, err = run(capsys, "serve", "--model-name", "m", "--model-base-path", "/nonexistent")
    assert_one_line_error(code, err, "--model_base_path /nonexistent does not exist")
    # Old names are gone (given with the required flags: tyro names a missing one first).
    train = ["train", "--model-dir", "m"]
    pipeline = ["pipeline", "run", "--pipeline-root", "r"]
    diagnose = ["diagnose", "--synthetic-items", "10"]
    for command, old in ((["data", "stats"], ["--format", "sasrec"]),
                         (train, ["--fraction", "0.2"]), (["compare"], ["--format", "csv"]),
                         (pipeline, ["--format", "csv"]), (train, ["--xla"]),
                         (train, ["--no-xla"]), (["compare"], ["--losses", "inbatch-none"]),
                         (["compare"], ["--sasrec-preset", "cpu"]),
                         (["compare"], ["--num-negatives", "4"]),
                         (train + ["two-tower"], ["--num-negatives", "4"]),
                         (["demo"], ["--corrections", "none"]), (["demo"], ["--num-items", "9"]),
                         (["demo"], ["--num-users", "9"]),
                         (diagnose, ["--corrections", "none"]),
                         (diagnose, ["--num-negatives", "4"]),
                         (pipeline, ["--serving-base-path", "b"])):
        code, _, err = run(capsys, *command, *old)
        assert_usage_error(code, err, old[0])


def test_train_flags_reach_the_config_and_flags_not_given_leave_the_preset_alone(
        capsys, tmp_path, monkeypatch):
    from tfrs_logq.sasrec import training

    base = ["train", "--model-dir", tmp_path / "m", "--preset", "smoke"]
    _, overrides = reached(monkeypatch, training, "resolve_config", *base, "--jit-compile",
                           "--no-share-item-embeddings", "--max_length", "7", "--dropout", "0")
    assert overrides == {"preset": "smoke", "jit_compile": True, "share_item_embeddings": False,
                         "max_length": 7, "dropout": 0.0, "split": "temporal"}
    # The last one given wins; a flag given at TrainConfig's default goes over the preset.
    _, overrides = reached(monkeypatch, training, "resolve_config", *base, "--jit-compile",
                           "--no-jit-compile", "--dropout", "0.5")
    assert overrides["jit_compile"] is False and overrides["dropout"] == 0.5
    assert "max_length" not in overrides
    # A user's log: no built-in dataset in the config (TrainConfig's default is ml-1m),
    # with the sasrec subcommand named before or after the command's own flags.
    log = ["--interactions", tmp_path / "log.csv", "--user-column", "u", "--item-column", "i"]
    for argv in ([*base, *log], ["train", "sasrec", *log, "--preset", "smoke", "--model-dir",
                                 tmp_path / "m"]):
        _, overrides = reached(monkeypatch, training, "resolve_config", *argv)
        assert overrides["dataset"] == "" and overrides["split"] == "loo", overrides


@pytest.mark.parametrize("flags, split", [
    (["--data-format", "sasrec"], "gsasrec"),  # SASRec's ml-1m.txt has no timestamps
    (["--data-format", "sasrec", "--split", "loo"], "loo"),
    (["--data-format", "sasrec", "--preset", "long"], None),  # the preset's (gsasrec)
    (["--data-format", "ratings"], "temporal"),
])
def test_train_without_split_takes_the_split_the_data_format_supports(
        capsys, tmp_path, monkeypatch, flags, split):
    from tfrs_logq.sasrec import training

    _, overrides = reached(monkeypatch, training, "resolve_config", "train", "--model-dir",
                           tmp_path / "m", *flags)
    assert overrides.get("split") == split


def test_data_stats_and_compare_read_one_data_source(capsys, tmp_path, monkeypatch):
    """`DataSource` (tfrs_logq.pipelines.source) is both commands' data flags: a dataset's
    file format reaches the loader, and a flag of --dataset with a log is refused."""
    import tfrs_logq.sasrec.training  # noqa: F401 (imported unpatched: it binds load_split)
    import tfrs_logq.studies.compare  # noqa: F401
    from tfrs_logq.pipelines import datasets

    commands = (["data", "stats"], ["compare", "--output-dir", tmp_path / "out"])
    for command in commands:
        args, kwargs = reached(monkeypatch, datasets, "load_split", *command, "--dataset",
                               "ml-1m", "--data-format", "sasrec", "--split", "loo",
                               "--data-dir", tmp_path)
        assert args == ("ml-1m", "loo", str(tmp_path)) and kwargs["data_format"] == "sasrec"
        for flag, value in (("--data-format", "sasrec"), ("--data-dir", tmp_path)):
            code, _, err = run(capsys, *command, "--interactions", tmp_path / "log.csv",
                               "--user-column", "u", "--item-column", "i", flag, value)
            assert_one_line_error(code, err, f"{flag} is --dataset's")
    for command in (*commands, ["train", "--model-dir", tmp_path / "m"]):  # one source
        code, _, err = run(capsys, *command, "--dataset", "ml-1m", "--interactions", "x.csv")
        assert_usage_error(code, err, "--dataset", "--interactions")
    assert not (tmp_path / "out").exists() and not (tmp_path / "m").exists()


def test_data_stats_without_split_takes_gsasrec_for_sasrecs_file(capsys, monkeypatch):
    from tfrs_logq.pipelines import datasets

    args, kwargs = reached(monkeypatch, datasets, "load_split", "data", "stats",
                           "--data-format", "sasrec")
    assert args[1] == "gsasrec" and kwargs["data_format"] == "sasrec"


def test_the_installed_commands_are_the_users_and_the_lab_is_not_among_them(capsys):
    """The studies behind the findings are the repository's ``python -m lab`` (tests/lab)."""
    listed = help_of(capsys)
    for path in COMMANDS:
        assert re.search(rf"\b{path[0]}\s+\w", listed), path
    for lab_command in ("study", "experiment"):
        assert lab_command not in listed
        code, _, err = run(capsys, lab_command)
        assert_usage_error(code, err, lab_command)


def test_a_list_takes_its_values_after_the_flag():
    flags = cli.parse(["diagnose", "--synthetic-items", "10", "--num-sampled", "1", "2", "3",
                       "--loss", "none", "corrected"])
    assert flags.num_sampled == (1, 2, 3) and flags.loss == ("none", "corrected")


def test_a_list_is_checked_item_by_item(capsys, tmp_path):
    code, _, err = run(capsys, "diagnose", "--loss", "none", "nope")
    assert_usage_error(code, err, "--loss", "nope")
    code, _, err = run(capsys, "diagnose", "--synthetic-items", "10", "--num-sampled", "4", "0")
    assert_one_line_error(code, err, "argument --num-sampled", ">= 1, got 0")
    assert len(err.strip().splitlines()) == 1, err
    code, _, err = run(capsys, "diagnose", "--synthetic-items", "10", "--num-sampled")
    assert_one_line_error(code, err, "argument --num-sampled", "at least one")
    # one model: a run's or the synthetic stream's, given once
    for flags in ([], ["--model-dir", tmp_path, "--synthetic-items", "10"]):
        code, _, err = run(capsys, "diagnose", *flags)
        assert_usage_error(code, err, "--model-dir", "--synthetic-items")


def test_train_config_fields_are_trains_flags_with_their_docs_choices_and_presets(capsys):
    """`TrainConfig`'s field docstrings are its flags' help: the Python API and the command
    line are documented once."""
    import docstring_parser

    from tfrs_logq.pipelines.source import DataSource
    from tfrs_logq.sasrec.config import FLAGS, OBJECTIVES, PRESETS, TrainConfig

    shown = entries(help_of(capsys, "train"))
    squeeze = lambda text: re.sub(r"\s+", "", text)  # noqa: E731 (help wraps lines)
    for config in (TrainConfig, DataSource):  # the data source's fields are DataSource's
        docs = {p.arg_name: p.description
                for p in docstring_parser.parse_from_object(config).params}
        for field in dataclasses.fields(config):
            if config is TrainConfig and field.name in DataSource.__dataclass_fields__:
                continue
            flag = FLAGS.get(field.name, "--" + field.name.replace("_", "-"))
            assert squeeze(docs[field.name]) in squeeze(shown[flag]), field.name
    # --loss takes SASRec's objectives (train two-tower: the two-tower's losses, among them)
    from tfrs_logq.towers.config import LOSSES

    choices = squeeze(shown["--loss"]).split("{", 1)[1].split("}", 1)[0].split(",")
    assert choices[:len(OBJECTIVES)] == list(OBJECTIVES) and set(LOSSES) <= set(choices)
    # Each flag shows its default; --preset its choices.
    assert f"(default: {TrainConfig.max_length})" in shown["--max-length"]
    presets = squeeze(shown["--preset"]).split("{", 1)[1].split("}", 1)[0].split(",")
    assert set(presets) == {"None", *PRESETS}


def test_the_flags_constants_are_the_librarys():
    """The flag modules import no TensorFlow: the choices they name are the library's."""
    from tfrs_logq.cli import diagnose, export
    from tfrs_logq.pipelines import log_readers, source
    from tfrs_logq.serving import export as serving_export
    from tfrs_logq.studies import diagnose as studies_diagnose

    assert diagnose.SAMPLERS == studies_diagnose.SAMPLERS
    assert source.LOG_FORMATS == log_readers.FORMATS
    assert (export.INDEXES, export.DEFAULT_MAX_K, export.DEFAULT_TARGET_RECALL) == (
        serving_export.INDEXES, serving_export.DEFAULT_MAX_K,
        serving_export.DEFAULT_TARGET_RECALL)


def test_every_server_option_is_a_serve_flag(capsys):
    from tfrs_logq.serving.options import ServerOptions

    shown = entries(help_of(capsys, "serve"))
    for field in dataclasses.fields(ServerOptions):
        flag = f"--{field.name}" if field.name in ("model_name", "model_base_path") else \
            f"--{field.name.replace('_', '-')}"
        assert flag in shown, field.name
        assert len(shown[flag].split()) > 4, field.name  # it has help
    code, _, err = run(capsys, "serve", "--model_name", "m", "--model_base_path", "b",
                       "--rest_api_port", "70000")  # TF Serving's spelling of every flag
    assert_one_line_error(code, err, "rest_api_port")




def test_a_bad_flag_is_a_usage_error_naming_it(capsys, tmp_path):
    for argv, fragments in [
        (["train", "--model-dir", tmp_path, "--bogus"], ["--bogus"]),
        (["train", "--model-dir", tmp_path, "--max-length", "x"], ["--max-length", "'x'"]),
        (["train", "--model-dir", tmp_path, "--loss", "nope"], ["--loss", "'nope'"]),
        (["nope"], ["nope"]),
    ]:
        code, _, err = run(capsys, *argv)
        assert_usage_error(code, err, *fragments)
    assert not (tmp_path / "config.json").exists()


def test_long_values_are_cut_in_errors(capsys, tmp_path, monkeypatch):
    """A 100 KB model name was echoed back in an error."""
    import tfrs_logq.cli.export as cli_export

    name = "m" * 100_000
    monkeypatch.setattr(cli_export, "read_model_config", lambda model_dir: {})
    for argv in (["export", "--model-dir", tmp_path, "--model_base_path", tmp_path / "b",
                  "--model_name", name],
                 ["serve", "--model_base_path", tmp_path, "--model_name", name]):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "m" * 50)
        assert len(err) < 1000 and "m" * 1000 not in err, len(err)


@pytest.mark.parametrize("server", ["notaport", "host:", ":8500", "host:0", "host:99999",
                                    "host:x"])
def test_evaluate_checks_host_port_before_waiting_for_anything(capsys, tmp_path, server,
                                                               monkeypatch):
    """Refused while the flags are read: the command's work (which waited 10 s for the
    server before) never starts."""
    import tfrs_logq.cli.evaluate as cli_evaluate

    started = []
    monkeypatch.setattr(cli_evaluate, "run", lambda args: started.append(args) or 0)
    code, _, err = run(capsys, "evaluate", "--server", server, "--model_name", "m",
                       "--model-dir", tmp_path)
    assert_one_line_error(code, err, "argument --server", "HOST:PORT", repr(server))
    assert started == []


@pytest.mark.parametrize("command", ["serve", "evaluate"])
def test_serve_and_evaluate_name_the_missing_serving_extra_before_any_work(
        capsys, tmp_path, monkeypatch, command):
    """Without the `serving` extra, the command's first output is the one-line error naming
    the extra (it came after a model was loaded or a log read, behind a success line)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorflow_serving" else real(name, *a))
    flags = {"serve": ("--model_base_path", tmp_path / "absent"),  # checked after the extra
             "evaluate": ("--server", "localhost:1", "--model-dir", tmp_path / "absent")}
    code, out, err = run(capsys, command, "--model_name", "m", *flags[command])
    assert_one_line_error(code, err, "tensorflow_serving", "pip install 'tfrs-logq[serving]'")
    assert out == "" and len(err.strip().splitlines()) == 1, (out, err)


def test_compare_checks_window_against_the_evaluations_before_reading_the_log(capsys, tmp_path):
    code, _, err = run(capsys, "compare", "--interactions", tmp_path / "absent.csv",
                       "--user-column", "u", "--item-column", "i", "--steps", "4",
                       "--eval-every", "2", "--window", "3", "--output-dir", tmp_path / "out")
    assert_one_line_error(code, err, "--window", "[1, 2]", "received 3")




def test_seed_must_be_non_negative_and_the_error_names_the_flag(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--model-dir", tmp_path / "m", "--seed", "-1")
    assert_one_line_error(code, err, "--seed", "-1")
    assert len(err.strip().splitlines()) == 1, err
    code, _, err = run(capsys, "compare", "--seeds", "0", "-1")
    assert_one_line_error(code, err, "argument --seeds", "-1")
    assert len(err.strip().splitlines()) == 1, err




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
    assert_one_line_error(code, err, flag, excinfo.value.problem)
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("content, fragment", [
    ('{"seed": true}', "seed must be int, received true"),
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


# ----------------------------------------------------------------------- start-up cost


def _fresh(code, env=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)


def _skip_if_package_imports_tensorflow():
    proc = _fresh("import sys, tfrs_logq; print('tensorflow' in sys.modules)")
    if proc.stdout.strip() != "False":
        pytest.skip("`import tfrs_logq` imports TensorFlow itself (tfrs_logq/__init__.py)")


def test_parsing_and_the_help_of_commands_import_no_tensorflow():
    """`train --help` and the others answer at once: the flag dataclasses import no
    TensorFlow (a command's handler imports it after parsing)."""
    _skip_if_package_imports_tensorflow()
    proc = _fresh("import sys\nfrom tfrs_logq import cli\n"
                  "cli.parse(['data', 'stats', '--split', 'loo'])\n"
                  "for path in ([], ['data', 'stats'], ['train'], ['compare'], ['serve'],\n"
                  "             ['evaluate'], ['pipeline', 'run'], ['demo'], ['diagnose'],\n"
                  "             ['export']):\n"
                  "    try:\n        cli.main(path + ['--help'])\n"
                  "    except SystemExit:\n        pass\n"
                  "print('tensorflow' in sys.modules)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


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


@pytest.mark.slow  # a training through the CLI (14 s on 2 cores): make test-slow
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


@pytest.mark.slow  # a whole smoke training for its last line (28 s on 2 cores): test-slow
def test_a_smoke_run_ends_saying_it_is_not_a_usable_model(capsys, tmp_path):
    # The README's walkthrough trained a smoke model at random-level recall
    # (test Recall@10 0.0023 on ML-1M, 10/3,416 = 0.0029 for a random list) and said
    # nothing. Another preset, cut as small, trains as little and says nothing.
    data = tmp_path / "data"
    _write_ratings(data)
    tiny = ["--split", "loo", "--max-epochs", "1", "--steps-per-epoch", "2", "--max-length",
            "20", "--embedding-dim", "8", "--data-dir", data]
    # Two of the three combinations (each run builds a model: about 10 s): the smoke line
    # last on stderr without --json, and stdout one JSON object with it.
    for preset, json_flag in (("smoke", None), ("cpu", "--json")):
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
    assert_usage_error(code, err, "--scann-search-fraction", value)


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


@pytest.mark.slow  # three demo trainings: 11 s on 2 cores; make test-slow (CI) runs it
def test_demo_cli_writes_table_csv_and_png(capsys, tmp_path):
    # In this process: an interpreter importing TensorFlow costs about 7 s of the suite.
    out = tmp_path / "demo"
    code, stdout, err = run(capsys, "demo", "--output-dir", out, "--synthetic-items", "3000",
                            "--synthetic-users", "500", "--steps", "30", "--batch-size", "128",
                            "--num-eval", "256", "--json")
    assert code == 0, err[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    methods = [r["method"] for r in result["results"]]
    assert methods == ["oracle (true P(d|u))", "in-batch, none", "in-batch, logq-tfrs",
                       "in-batch, corrected"]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and 0 <= float(rows[1]["recall@1000"]) <= 1
    assert (out / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # three demo trainings: 16 s on 2 cores; make test-slow (CI) runs it
def test_demo_says_what_it_is_doing_in_a_log(capsys, tmp_path):
    # Piped or logged (stdout not a terminal), a demo correction printed
    # nothing for its whole training (Keras' bar is one line per epoch, the demo one
    # epoch). Now: a timed line per phase and a line every tenth of the steps. (In this
    # process, whose captured stdout is not a terminal either.)
    steps = 30
    code, out, err = run(capsys, "demo", "--output-dir", tmp_path / "d", "--synthetic-items",
                         "3000",
                         "--synthetic-users", "500", "--steps", steps, "--batch-size", "128",
                         "--num-eval", "256", "--num-topics", "40", "--topic-sharpness", "3.5")
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    assert "3,000 items, 500 users, 40 topics (sharpness 3.5)" in lines[0]
    every = -(-steps // 10)
    expected = [f"step {n}/{steps}:" for n in range(every, steps + 1, every)]
    for correction in ("none", "logq-tfrs", "corrected"):
        start = next(i for i, line in enumerate(lines) if f"correction={correction!r}" in line)
        done = next(i for i, line in enumerate(lines) if f": {correction}: Recall@10 " in line)
        steps_seen = [line.split()[0] + " " + line.split()[1] for line in lines[start + 1:done]]
        assert steps_seen == expected, lines[start:done + 1]
        assert lines[done - 1].endswith("about 0 s left")
    stamped = [line for line in lines if line.startswith("[")]
    assert len(stamped) == 3 + 2 * 3  # the stream, its regime, 2 a correction, the files
    assert "] regime: at the truth P(p|u)/Q(p) has median" in stamped[1]
    seconds = [float(line[1:line.index(" s]")]) for line in stamped]
    assert seconds == sorted(seconds)


def test_demo_cli_rejects_bad_corrections(capsys):
    code, _, err = run(capsys, "demo", "--loss", "none", "bogus")
    assert code == 2 and "bogus" in err


def test_a_closed_pipe_on_stdout_ends_quietly():
    """``tfrs-logq ... --help | head``: the reader has left; no error line, exit 141 (as a
    process SIGPIPE ends), not 2 with "Broken pipe"."""
    read, write = os.pipe()
    os.close(read)  # the reader left before the first line: every write fails
    try:
        proc = subprocess.run([sys.executable, "-m", "tfrs_logq.cli", "train", "--help"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
