"""The package's layers (docs/layout.md), as import-linter contracts in pyproject.toml,
checked on the package laid out as installed (tools/installed_layout.py): every import
statement, lazy ones inside functions included, and chains of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(tmp_path, edit=None):
    layout = tmp_path / "layout"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "installed_layout.py"),
                    str(layout)], check=True)
    if edit:
        edit(layout / "tfrs_logq")
    return subprocess.run([LINT_IMPORTS, os.path.join(ROOT, "pyproject.toml")],
                          capture_output=True, text=True, cwd=layout, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(layout)})


@pytest.fixture(scope="module")
def layout_result(tmp_path_factory):
    return _lint(tmp_path_factory.mktemp("lint"))


def test_every_contract_is_kept(layout_result):
    assert layout_result.returncode == 0, layout_result.stdout[-4000:]
    assert "0 broken" in layout_result.stdout
    # The contracts saw the whole package, pipelines/ and serving/ included.
    assert "Analyzed 1" in layout_result.stdout  # over a hundred files


@pytest.mark.parametrize("module, line", [
    ("losses.py", "import tfrs_logq.sasrec.training\n"),           # library -> trainer
    ("sasrec/training.py", "from tfrs_logq.studies import compare\n"),  # trainer -> studies
    ("losses.py", "def f():\n    import lab.experiment\n"),     # the library -> the lab
    ("pipelines/splits.py", "def f():\n    import tfrs_logq.serving.server\n"),  # lazy
    ("serving/export.py", "import tfrs_logq.cli\n"),                # anything -> the CLI
    ("tasks.py", "import apache_beam\n"),                            # the library -> Beam
    # compare's layers: the runs never reach the report, even lazily; the report never
    # reaches a user's model
    ("studies/compare/runner.py",
     "def f():\n    from tfrs_logq.studies.compare.report import write_report\n"),
    ("studies/compare/report.py", "import tfrs_logq.studies.compare.model_fn\n"),
])
def test_an_upward_or_forbidden_import_breaks_a_contract(tmp_path, module, line):
    def add(package):
        with open(package / module, "a") as f:
            f.write("\n" + line)

    result = _lint(tmp_path, add)
    assert result.returncode != 0 and " broken" in result.stdout.split("Contracts:")[-1], (
        result.stdout[-3000:])


_LOADED = """
import importlib, json, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps(sorted(n for n in ("tensorflow", "tf_keras") if n in sys.modules)))
"""


def test_the_metric_formulas_and_utilities_load_no_tensorflow():
    """Recall/NDCG (the serving client, Beam workers), the comparison's statistics, atomic
    writes and the cache location: their TF functions import TensorFlow when called, not
    when loaded."""
    modules = ["tfrs_logq.metrics", "tfrs_logq.studies.compare.stats",
               "tfrs_logq._util.atomic", "tfrs_logq._util.cache",
               "tfrs_logq._util.hostinfo", "tfrs_logq.pipelines.beam.evaluation"]
    result = subprocess.run([sys.executable, "-c", _LOADED, *modules], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
