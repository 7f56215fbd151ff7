"""`tfrs-logq compare tfrs-model --model-fn`: a user's module that cannot build the model is one
line and exit 2 (the traceback with --verbose), a bad setting is refused before the log is
read, and a rerun into the directory of a comparison whose model was edited is refused,
naming what changed and --output-dir."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from cli_process import cli_in_process

GOOD = '''
import tensorflow as tf
import tensorflow_recommenders as tfrs

USERS = [f"u{{u}}" for u in range(60)]
ITEMS = [f"item-{{i}}" for i in range(40)]


class LogModel(tfrs.Model):
    def __init__(self, task):
        super().__init__()
        self.query_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
            tf.keras.layers.Embedding(len(USERS) + 1, 8){extra}])
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
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
    return model
'''


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "log.csv"
    rng = np.random.default_rng(2)
    lines = ["user_id,item_id,ts"]
    for u in range(60):
        for t in range(8):
            lines.append(f"u{u},item-{int(rng.choice(np.arange(u % 4, 40, 4)))},{u * 100 + t}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The current directory (tmp_path), where the user's modules are written; each module
    imported afresh, as by a new process."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    names: list = []

    def write(name: str, text: str) -> None:
        sys.modules.pop(name, None)
        names.append(name)
        (tmp_path / f"{name}.py").write_text(text)

    yield write
    for name in names:
        sys.modules.pop(name, None)


def _compare(capsys, log_csv, *flags, seeds=("0",)):
    return cli_in_process(capsys, "compare", "tfrs-model", "--interactions", log_csv,
                          "--user-column", "user_id", "--item-column", "item_id",
                          "--time-column", "ts", "--loss", "inbatch-logq-tfrs",
                          "inbatch-corrected", "--seeds", *seeds, "--steps", "2",
                          "--eval-every", "2", "--window", "1", "--batch-size", "32",
                          "--no-served-index", *flags)


def _one_error(proc) -> str:
    """The one error line of a refused command (the log's summary line aside)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()
             and not line.startswith("tfrs-logq: log: ")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("tfrs-logq: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = lines
    return errors[0]


BROKEN = {
    "raises": (GOOD.format(extra="") + "\n\ndef broken(task):\n    raise RuntimeError('no "
               "vocabulary yet')\n", "broken", "raised RuntimeError: no vocabulary yet"),
    "two_arguments": (GOOD.format(extra="") + "\n\ndef broken(task, vocabulary):\n    return "
                      "build(task)\n", "broken", "takes (task, vocabulary)"),
    "no_arguments": (GOOD.format(extra="") + "\n\ndef broken():\n    return build(None)\n",
                     "broken", "takes no arguments"),
    "syntax_error": ("def broken(task):\n    return (task\n", "broken",
                     "has a syntax error"),
    "import_raises": ("raise RuntimeError('set MY_MODELS_HOME first')\n", "broken",
                      "raised RuntimeError: set MY_MODELS_HOME first"),
    "missing_package": ("import no_such_package_of_theirs\n", "broken",
                        "imports 'no_such_package_of_theirs', which is not installed"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_model_fn_that_cannot_build_the_model_is_one_line_and_exit_2(
        case, log_csv, here, tmp_path, capsys):
    text, function, named = BROKEN[case]
    module = f"user_{case}"
    here(module, text)
    out = tmp_path / "out"
    proc = _compare(capsys, log_csv, "--model-fn", f"{module}:{function}", "--output-dir",
                    str(out))
    line = _one_error(proc)
    assert named in line and f"--model-fn {module}:{function}" in line, line
    assert not out.exists()
    if case == "import_raises":  # --verbose: the user's own traceback, then the line
        verbose = _compare(capsys, log_csv, "--model-fn", f"{module}:{function}",
                           "--output-dir", str(out), "--verbose")
        assert verbose.returncode == 2 and "Traceback" in verbose.stderr
        assert "set MY_MODELS_HOME first" in verbose.stderr.splitlines()[-1]


def test_a_file_name_for_the_module_says_drop_py_and_bad_settings_come_before_the_log(
        log_csv, here, tmp_path, capsys):
    here("my_models", GOOD.format(extra=""))
    line = _one_error(_compare(capsys, log_csv, "--model-fn", "my_models.py:build"))
    assert "drop .py" in line and "--model-fn my_models:build" in line, line
    # A loss of no model, with a log that is not there: the loss is refused first.
    proc = cli_in_process(capsys, "compare", "tfrs-model", "--interactions",
                          str(tmp_path / "no_such_log.csv"), "--user-column", "u",
                          "--item-column", "i", "--model-fn", "my_models:build", "--loss",
                          "inbatch-logq-tfrs", "inbatch-banana")
    line = _one_error(proc)
    assert "inbatch-banana" in line and "no_such_log" not in line, line


def test_a_rerun_after_an_edit_of_the_model_is_refused_naming_architecture_and_output_dir(
        log_csv, here, tmp_path, capsys):
    out = str(tmp_path / "cmp")
    here("edited", GOOD.format(extra=""))
    first = _compare(capsys, log_csv, "--model-fn", "edited:build", "--output-dir", out)
    assert first.returncode == 0, first.stderr[-3000:]
    here("edited", GOOD.format(extra=", tf.keras.layers.Dense(8)"))
    line = _one_error(_compare(capsys, log_csv, "--model-fn", "edited:build", "--output-dir",
                               out, seeds=("0", "1")))
    assert "source and architecture changed" in line and "new --output-dir" in line, line
