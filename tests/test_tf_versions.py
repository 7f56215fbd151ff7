"""TensorFlow 2.20 and 2.21: importing tfrs_logq never needs ScaNN, and where ScaNN cannot
load (TF 2.21, or not installed) `export --index scann` fails in one line that says why and
what to do, while a brute-force export still trains, exports and answers queries.

`make test` runs this file in the main .venv (TF 2.20, ScaNN installed) and in .venv-tf221
(TF 2.21, no ScaNN)."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq import cli
from tfrs_logq.serving import export as export_lib


def _scann_loads() -> bool:
    try:
        from scann import scann_ops  # noqa: F401
    except Exception:
        return False
    return True


def _faiss_imports() -> bool:
    try:
        import faiss  # noqa: F401
    except Exception:
        return False
    return True


def test_tensorflow_version_is_a_supported_one():
    major_minor = tuple(int(x) for x in tf.__version__.split(".")[:2])
    assert major_minor in ((2, 20), (2, 21)), tf.__version__


def test_importing_the_package_and_the_serving_modules_never_needs_scann():
    script = ("import sys; sys.modules['scann'] = None\n"
              "import tfrs_logq, tfrs_logq.losses, tfrs_logq.tasks\n"
              "import tfrs_logq.serving.export, tfrs_logq.serving.server\n"
              "print('OK')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-2000:]


def test_scann_unavailable_gives_one_line_that_says_why_and_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "scann", None)  # as where the import fails
    with pytest.raises(ImportError) as info:
        export_lib.scann_ops_or_error()
    line = cli._one_line(info.value)
    assert "\n" not in line
    for fragment in (f"TensorFlow {tf.__version__}", "TensorFlow 2.20",
                     "tfrs-logq[scann]", "--index brute-force"):
        assert fragment in line, line


@pytest.fixture
def smoke_model(smoke_runs):
    """conftest's smoke run of seed 0 (inbatch-corrected, one epoch), trained once per
    test run: (a directory to export under, the model directory)."""
    return smoke_runs["root"], smoke_runs[0]


def test_brute_force_export_answers_queries(smoke_model, capsys):
    root, model_dir = smoke_model
    base = root / "served"
    code = cli.main(["export", "--model-dir", model_dir, "--model_base_path", str(base),
                     "--model_name", "m", "--index", "brute-force", "--k", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    loaded = tf.saved_model.load(out.strip())
    result = loaded.signatures["serving_default"](history=tf.constant([[100, 101, 0]], tf.int64))
    ids, scores = result["item_ids"].numpy(), result["scores"].numpy()
    assert ids.shape == (1, 5) and (np.diff(scores[0]) <= 1e-6).all()
    assert not set(ids[0].tolist()) & {100, 101}  # the history is left out


def test_scann_export_fails_in_one_line_where_scann_cannot_load(smoke_model, capsys):
    if _scann_loads():
        pytest.skip(f"ScaNN loads with TensorFlow {tf.__version__}: no failure to check")
    root, model_dir = smoke_model
    base = root / "served-scann"
    code = cli.main(["export", "--model-dir", model_dir, "--model_base_path", str(base),
                     "--model_name", "m", "--index", "scann", "--k", "5"])
    out, err = capsys.readouterr()
    lines = [x for x in err.strip().splitlines() if x.startswith("tfrs-logq: error")]
    assert code == 2 and len(lines) == 1, err
    assert "TensorFlow 2.20" in lines[0] and "--index brute-force" in lines[0]


def test_the_default_index_is_scann_where_it_loads_else_brute_force(smoke_model, capsys,
                                                                     caplog):
    """`export`'s default, ``--index auto``: what the environment can serve, said in a line
    where ScaNN cannot load (a newcomer's `make demo` environment is TensorFlow 2.21)."""
    import json
    import logging

    root, model_dir = smoke_model
    base = root / "served-auto"
    with caplog.at_level(logging.WARNING, logger="tfrs_logq.serving.export"):
        code = cli.main(["export", "--model-dir", model_dir, "--model_base_path", str(base),
                         "--model_name", "m", "--k", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    with open(f"{out.strip()}/assets/export.json") as f:
        kind = json.load(f)["index"]
    said = [r.getMessage() for r in caplog.records if "--index auto" in r.getMessage()]
    if _scann_loads():
        assert kind == "scann" and not said
    elif _faiss_imports():  # the serving extra: an approximate index all the same
        assert kind == "faiss" and len(said) == 1 and "faiss" in said[0]
    else:
        assert kind == "brute-force" and len(said) == 1 and "brute force" in said[0]
    assert export_lib.resolve_index("brute-force") == "brute-force"
    with pytest.raises(ValueError, match="index"):
        export_lib.resolve_index("annoy")


def test_pipeline_index_scann_is_refused_before_any_component_runs(tmp_path, monkeypatch,
                                                                   capsys, data_dir):
    monkeypatch.setitem(sys.modules, "scann", None)  # as where the import fails
    root = tmp_path / "pipe"
    code = cli.main(["pipeline", "run", "--pipeline-root", str(root), "--dataset", "ml-1m",
                     "--data-dir", data_dir, "--index", "scann"])
    err = capsys.readouterr().err
    assert code == 2 and "--index scann needs ScaNN" in err, err
    assert not root.exists() or not any(root.iterdir())
