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


# The examples each of these docstrings (a module's: all of its examples) runs at least:
# a docstring whose examples are dropped or skipped fails. Each is run here, once.
MIN_EXAMPLES = {
    "tfrs_logq.tasks": 3,
    "tfrs_logq.tasks.CorrectedRetrieval": 3,
    "tfrs_logq.proposal": 6,
    "tfrs_logq.losses": 1,
    "tfrs_logq.metrics": 3,
    "tfrs_logq._util.atomic": 1,
}


def _module_of(docstring: str):
    """The module in MODULES that holds ``docstring`` (a module's or a member's name)."""
    return max((m for m in MODULES if docstring == m or docstring.startswith(m + ".")),
               key=len, default=None)


def test_the_examples_are_found():
    assert {d: _module_of(d) for d in MIN_EXAMPLES if _module_of(d) is None} == {}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    attempted, failed = {}, 0
    environ = dict(os.environ)  # an example may set variables (tfrs_logq._util.cache does)
    try:
        for test in doctest.DocTestFinder().find(module, name):
            result = runner.run(test)
            attempted[test.name] = result.attempted
            failed += result.failed
    finally:
        os.environ.clear()
        os.environ.update(environ)
    total = sum(attempted.values())
    assert total > 0, f"{name} has '>>>' lines but no example ran"
    assert failed == 0, f"{failed} of {total} examples of {name} failed"
    for docstring, least in MIN_EXAMPLES.items():
        if _module_of(docstring) == name:
            got = total if docstring == name else attempted.get(docstring, 0)
            assert got >= least, f"{docstring}: {got} examples ran, {least} expected"
