"""Every docstring example of the package runs (doctest), module by module.

Modules are found by their ``>>>`` lines, so an example added anywhere is run without
a test naming it; a module whose examples are all skipped or absent fails."""

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules_with_examples() -> list[str]:
    found = []
    for top, prefix in (("tfrs_logq", "tfrs_logq"), ("pipelines", "tfrs_logq.pipelines"),
                        ("serving", "tfrs_logq.serving")):
        for parent, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                path = os.path.join(parent, name)
                if not name.endswith(".py"):
                    continue
                with open(path) as f:
                    if ">>>" not in f.read():
                        continue
                rel = os.path.relpath(path, os.path.join(ROOT, top))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found.append(".".join([prefix, *rel]))
    return sorted(found)


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert {"tfrs_logq.tasks", "tfrs_logq.losses", "tfrs_logq.proposal",
            "tfrs_logq.metrics"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    environ = dict(os.environ)  # an example may set variables (tfrs_logq._util.cache does)
    try:
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS
                                 | doctest.NORMALIZE_WHITESPACE)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert result.attempted > 0, f"{name} has '>>>' lines but no example ran"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
