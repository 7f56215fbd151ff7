"""Specification of ``python -m lab``, the lab's command (``experiment``) on the
flags machinery of ``tfrs-logq``: flags and their defaults, lists, one-line errors naming the
command, and nothing run before the flags are checked."""

import os
import subprocess
import sys

import pytest
from cli_process import entries

from lab import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE_LINE = ("python -m lab: warning: smoke preset: a plumbing check, not a usable model; "
              "use --preset cpu for a useful one")


def run(capsys, *argv):
    """``lab.cli.main(argv)`` in process: (exit code, stdout, stderr)."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *fragments):
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m lab: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def assert_usage_error(code, err, *fragments):
    """A command line tyro refuses: exit status 2, its message naming ``fragments``."""
    assert code == 2, err
    assert "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


class Reached(Exception):
    """Raised by a function a test stands in for: the command got that far."""


def reached(monkeypatch, module, name, *argv):
    """The ``(args, kwargs)`` ``module.name`` was called with by ``main(argv)``."""
    calls = []

    def stand_in(*args, **kwargs):
        calls.append((args, kwargs))
        raise Reached(name)

    monkeypatch.setattr(module, name, stand_in)
    with pytest.raises(Reached):
        cli.main([str(a) for a in argv])
    return calls[-1]


def help_of(capsys, *path):
    code, out, err = run(capsys, *path, "--help")
    assert code == 0, err
    return out


@pytest.mark.parametrize("command", ["experiment"])
def test_help_shows_every_flags_default_and_names_no_issue(capsys, command):
    shown = entries(help_of(capsys, command))
    assert "--verbose" in shown
    for flag, text in shown.items():
        if flag == "--output-dir" and command == "experiment":
            assert "default:" not in text, text  # required
        elif flag != "-h":
            assert "(default: " in text, (flag, text)
    assert "issue" not in help_of(capsys) + help_of(capsys, command)


def test_a_missing_required_flag_or_an_unknown_command_is_one_line_naming_the_lab(capsys):
    code, _, err = run(capsys, "experiment")
    assert_usage_error(code, err, "python -m lab experiment", "--output-dir")
    code, _, err = run(capsys, "train")  # a library command: `tfrs-logq train`
    assert_usage_error(code, err, "train", "experiment")


def test_a_list_takes_its_values_after_the_flag(capsys, tmp_path, monkeypatch):
    import lab.experiment as experiment

    args, _ = reached(monkeypatch, experiment, "run_grid", "experiment", "--output-dir",
                      tmp_path / "e", "--seeds", "0", "1", "2", "--loss", "bce", "gbce")
    assert args[3] == ["bce", "gbce"] and args[4] == [0, 1, 2]


def test_a_list_is_checked_item_by_item(capsys, tmp_path):
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--loss",
                       "bce", "nope")
    assert_usage_error(code, err, "--loss", "nope", "gbce")
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--seeds")
    assert_one_line_error(code, err, "argument --seeds", "at least one")
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--seeds", "0", "-1")
    assert_one_line_error(code, err, "argument --seeds", "-1")


def test_experiment_takes_trains_model_flags_and_a_list_of_losses(capsys):
    experiment = entries(help_of(capsys, "experiment"))
    assert "--max-length" in experiment and "INT" in experiment["--max-length"]
    assert "[" in experiment["--loss"] and "--losses" not in experiment


@pytest.mark.parametrize("flag", ["--skip-bad-lines", "--no-cache", "--no-download"])
def test_experiment_neither_shows_nor_takes_the_load_flags(capsys, tmp_path, flag,
                                                            monkeypatch):
    """`run_grid` loads its data with the defaults: a flag it would refuse is not in help,
    and given anyway it is a usage error before anything runs."""
    import lab.experiment as experiment

    monkeypatch.setattr(experiment, "run_grid", lambda *a, **kw: pytest.fail("ran"))
    assert flag not in help_of(capsys, "experiment")
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", flag)
    assert_usage_error(code, err, flag)
    assert not (tmp_path / "e").exists()


def test_experiment_parallel_reaches_run_grid(capsys, tmp_path, monkeypatch):
    import lab.experiment as experiment

    _, kwargs = reached(monkeypatch, experiment, "run_grid", "experiment", "--output-dir",
                        tmp_path / "e", "--parallel", "3", "--loss", "inbatch-none",
                        "--seeds", "0")
    assert kwargs["parallel"] == 3
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--parallel", "0")
    assert_one_line_error(code, err, "argument --parallel", "0")


def test_experiment_takes_no_users_log(capsys, tmp_path):
    """The grid labels each row by --datasets: a log would train under each name."""
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--interactions",
                       "log.csv")
    assert_usage_error(code, err, "--interactions")
    config = tmp_path / "c.json"
    config.write_text('{"interactions": "log.csv", "user_column": "u"}')
    code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--config",
                       config)
    assert_one_line_error(code, err, "--config sets 'interactions'", "tfrs-logq compare")
    assert not (tmp_path / "e").exists()


def test_a_smoke_grid_ends_saying_it_is_not_a_usable_model(capsys, tmp_path, monkeypatch):
    import lab.experiment as experiment

    monkeypatch.setattr(experiment, "run_grid", lambda *a, **kw: None)
    for preset in ("smoke", "cpu"):
        code, _, err = run(capsys, "experiment", "--output-dir", tmp_path / "e", "--preset",
                           preset, "--loss", "inbatch-none", "--seeds", "0")
        assert code == 0 and (SMOKE_LINE in err) == (preset == "smoke"), err


def _fresh(*args):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=env)


def test_python_m_lab_runs_from_the_checkout():
    """The lab is not installed: ``python -m lab`` runs from the repository's root."""
    proc = _fresh("-m", "lab", "experiment", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: python -m lab experiment"), proc.stdout[:300]


def test_the_lab_parser_and_experiments_help_import_no_tensorflow():
    """As ``tfrs-logq``'s: the parser and ``experiment --help`` load no TensorFlow."""
    if _fresh("-c", "import sys, tfrs_logq; print('tensorflow' in sys.modules)").stdout.strip() \
            != "False":
        pytest.skip("`import tfrs_logq` imports TensorFlow itself (tfrs_logq/__init__.py)")
    proc = _fresh("-c", "import sys\nfrom lab import cli\n"
                        "for path in ([], ['experiment']):\n"
                        "    try:\n        cli.main(path + ['--help'])\n"
                        "    except SystemExit:\n        pass\n"
                        "print('tensorflow' in sys.modules)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"
