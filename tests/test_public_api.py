"""The public API drawn in one table (`tfrs_logq._api.PUBLIC`): docs/api.md lists the same
names under the same packages, each package's ``__all__`` is its row of the table and its
``if TYPE_CHECKING:`` block imports the same row for static tools, every name is the object
its module defines, documented, and importing the packages loads no TensorFlow until a name
is used."""

import ast
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

from tfrs_logq import _api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _documented() -> dict:
    """``{package: [names]}`` as docs/api.md lists them (``## `package```, then table rows)."""
    listed: dict = {}
    package = None
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        for line in f:
            heading = re.match(r"## `([\w.]+)`", line)
            if heading:
                package = heading.group(1)
                listed[package] = []
            row = re.match(r"\| `(\w+)` \|", line)
            if row and package:
                listed[package].append(row.group(1))
    return listed


def test_the_page_lists_the_table_and_is_the_generators_output():
    assert _documented() == {package: list(names) for package, names in _api.PUBLIC.items()}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "api_page.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, "docs/api.md is stale: run tools/api_page.py" + proc.stderr


def _api_page():
    spec = importlib.util.spec_from_file_location("api_page", os.path.join(ROOT, "tools",
                                                                           "api_page.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _type_checking_imports(text: str) -> dict:
    """``{name: module}`` that the ``if TYPE_CHECKING:`` blocks of ``text`` import."""
    imported: dict = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.dump(statement)
                for alias in statement.names:
                    assert alias.asname == alias.name, alias.name  # a re-export: `X as X`
                    imported[alias.name] = statement.module
    return imported


@pytest.mark.parametrize("package", sorted(_api.PUBLIC))
def test_each_package_imports_its_row_for_static_tools_as_the_tool_writes_it(package):
    api_page = _api_page()
    with open(api_page.init_path(package)) as f:
        text = f.read()
    assert _type_checking_imports(text) == _api.PUBLIC[package], (
        f"{package}: run tools/api_page.py")
    assert api_page.with_static_imports(text, _api.PUBLIC[package]) == text


def test_the_tool_rewrites_a_stale_block_and_adds_a_missing_one():
    api_page = _api_page()
    table = {"load_run": "tfrs_logq.towers.run", "TwoTowerConfig": "tfrs_logq.towers.config"}
    bare = '"""Doc."""\n\nfrom tfrs_logq import _api\n\nx = _api.exports("p")\n'
    added = api_page.with_static_imports(bare, table)
    assert added.startswith('"""Doc."""\n\nfrom typing import TYPE_CHECKING\n\nfrom tfrs_logq')
    assert _type_checking_imports(added) == table
    # A name added to the table (another one removed) is rewritten in place; the rest stays.
    grown = {"load_run": "tfrs_logq.towers.run", "train_run": "tfrs_logq.towers.run"}
    rewritten = api_page.with_static_imports(added + "y = 1\n", grown)
    assert _type_checking_imports(rewritten) == grown
    assert rewritten.endswith("    from tfrs_logq.towers.run import train_run as train_run\n"
                              "y = 1\n")
    assert api_page.with_static_imports(rewritten, grown) == rewritten


@pytest.mark.parametrize("package", sorted(_api.PUBLIC))
def test_each_package_exports_its_row_and_each_name_is_its_modules_documented_object(package):
    module = importlib.import_module(package)
    extra = {"tfrs_logq": ["__version__"], "tfrs_logq.pipelines.beam": ["SOURCE_FORMATS"]}.get(
        package, [])
    assert module.__all__ == sorted([*_api.PUBLIC[package], *extra])
    for name, defining in _api.PUBLIC[package].items():
        obj = getattr(module, name)
        assert obj is getattr(importlib.import_module(defining), name), name
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = inspect.getdoc(obj) or ""
            assert doc.strip() and not doc.startswith(f"{name}("), f"{package}.{name}: no docstring"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_a_name_is_listed_once_and_never_shadows_a_module():
    names = [n for table in _api.PUBLIC.values() for n in table]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for package, table in _api.PUBLIC.items():
        parts = package.split(".")
        # pipelines/ and serving/ are installed as tfrs_logq.pipelines and .serving.
        folder = (os.path.join(ROOT, *parts[1:]) if parts[1:2] in (["pipelines"], ["serving"])
                  else os.path.join(ROOT, *parts))
        assert os.path.isfile(os.path.join(folder, "__init__.py")), folder
        for name in table:
            path = os.path.join(folder, name)
            assert not os.path.exists(path + ".py") and not os.path.isdir(path), (package, name)


def test_the_version_and_the_corrections():
    import tfrs_logq
    from tfrs_logq._version import __version__

    assert tfrs_logq.__version__ == __version__ and __version__.count(".") >= 2
    assert tfrs_logq.CORRECTIONS == ("none", "logq-tfrs", "logq-official", "corrected")


def test_the_modules_stay_reachable_as_attributes():
    import tfrs_logq

    assert tfrs_logq.losses is importlib.import_module("tfrs_logq.losses")
    with pytest.raises(AttributeError):
        tfrs_logq.no_such_module  # noqa: B018


def test_importing_the_packages_loads_no_tensorflow():
    code = ("import sys\nimport tfrs_logq, tfrs_logq.pipelines, tfrs_logq.serving, "
            "tfrs_logq.sasrec, tfrs_logq.towers, tfrs_logq.studies, tfrs_logq.pipelines.beam\n"
            "print(sorted(tfrs_logq.__all__)[:2], 'tensorflow' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("False"), proc.stdout
