"""The install line of every page that runs the example installs what the example imports
(``pip install -e keras-logq`` then the example failed with ``No module named
'keras_rs'``). Reads the files only: no backend, no network."""

import ast
import os
import re
import sys
import tomllib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)
REPO = os.path.dirname(PACKAGE)
EXAMPLES = os.path.join(PACKAGE, "examples")
PAGES = [os.path.join(REPO, "README.md"), os.path.join(PACKAGE, "README.md"),
         os.path.join(REPO, "docs", "keras3.md")]
# import name -> distribution name, for the example's third-party imports
DISTRIBUTIONS = {"keras": "keras", "numpy": "numpy", "keras_rs": "keras-rs"}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def _pyproject():
    with open(os.path.join(PACKAGE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _installed_by(extras: tuple) -> set:
    project = _pyproject()
    names = {_requirement_name(r) for r in project["dependencies"]}
    for extra in extras:
        names |= {_requirement_name(r) for r in project["optional-dependencies"][extra]}
    return names


def _third_party_imports(path: str) -> set:
    tree = ast.parse(open(path).read())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "keras_logq"}


def _install_lines(page: str) -> list:
    return [line for line in open(page).read().splitlines()
            if re.search(r"pip install\b.*keras-logq", line)]


def _extras(line: str) -> tuple:
    match = re.search(r"keras-logq\[([^\]]+)\]", line)
    return tuple(e.strip() for e in match.group(1).split(",")) if match else ()


EXAMPLE_FILES = sorted(os.path.join(EXAMPLES, f) for f in os.listdir(EXAMPLES)
                       if f.endswith(".py"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_every_documented_install_line_covers_the_examples_imports(page):
    lines = _install_lines(page)
    assert lines, f"{page}: no `pip install ... keras-logq` line"
    for line in lines:
        installed = _installed_by(_extras(line))
        for example in EXAMPLE_FILES:
            for module in _third_party_imports(example):
                assert module in DISTRIBUTIONS, f"{example}: unknown import {module!r}"
                assert DISTRIBUTIONS[module] in installed, (
                    f"{os.path.relpath(page, REPO)}: {line.strip()!r} does not install "
                    f"{DISTRIBUTIONS[module]!r}, which {os.path.basename(example)} imports"
                )


def test_the_examples_extra_exists_and_the_core_stays_small():
    project = _pyproject()
    assert "keras-rs" in {_requirement_name(r)
                          for r in project["optional-dependencies"]["examples"]}
    assert {_requirement_name(r) for r in project["dependencies"]} == {"keras", "numpy"}


def test_the_check_sees_a_bare_install_line_as_incomplete():
    """The old line, ``pip install -e keras-logq``, misses keras-rs."""
    installed = _installed_by(_extras("pip install -e keras-logq"))
    needed = {DISTRIBUTIONS[m] for e in EXAMPLE_FILES for m in _third_party_imports(e)}
    assert "keras-rs" in needed and "keras-rs" not in installed
