"""Writes what the public API's table (`tfrs_logq._api.PUBLIC`) determines:

- docs/api.md: per package, each name with the first paragraph of its docstring (a
  constant: its value);
- each package's ``__init__.py``, its ``if TYPE_CHECKING:`` block: one import per name of
  the package's row, so that static tools (mypy, pyright, IDEs) resolve the names the
  package loads lazily at run time (`tfrs_logq._api.exports`). The block is never run, so
  ``import tfrs_logq`` still loads no TensorFlow.

    .venv/bin/python tools/api_page.py          # rewrite docs/api.md and the blocks
    .venv/bin/python tools/api_page.py --check  # exit 1 if any of them differs

Rerun it after editing the table. tests/test_public_api.py runs the check.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "api.md")

HEAD = """# The public API

These are the names tfrs-logq supports, by the package you import them from
(`from tfrs_logq import CorrectedRetrieval`, `from tfrs_logq.pipelines import
load_user_log_split`). The modules behind them, and every name not listed here, are the
implementation: they may move or change in any release. The list is one table in the code,
`tfrs_logq/_api.py`; each package's `__all__` comes from it, this page and each package's
`if TYPE_CHECKING:` imports (which let mypy, pyright and IDEs see the names) are written from
it (`tools/api_page.py`), and `tests/test_public_api.py` checks that they agree and that every
name imports (without TensorFlow until first use) and is documented.

Besides these: the command line `tfrs-logq` ([cli.md](cli.md); `tfrs_logq.cli.main` is its
entry point) and the Keras 3 package `keras_logq` ([keras3.md](keras3.md)).
"""

TITLES = {
    "tfrs_logq": "the task, losses, proposal, samplers, estimators, model pieces, optimizer, "
                 "metrics, statistics",
    "tfrs_logq.pipelines": "the data layer",
    "tfrs_logq.pipelines.beam": "the Beam batch pipeline ([pipeline.md](pipeline.md))",
    "tfrs_logq.sasrec": "SASRec and its trainer",
    "tfrs_logq.towers": "the two-tower trainer",
    "tfrs_logq.serving": "export, server and client",
    "tfrs_logq.studies": "compare and the demo",
}


def summary(obj, limit: int = 110) -> str:
    """The first paragraph of ``obj``'s docstring on one line, cut at ``limit``; a
    constant's value."""
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return f"`{obj!r}`"
    first = " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())
    if len(first) > limit:
        first = first[:limit - 3].rsplit(" ", 1)[0] + " ..."
    return first.replace("|", "\\|")


def render() -> str:
    sys.path.insert(0, ROOT)
    from tfrs_logq import _api

    out = [HEAD]
    for package, table in _api.PUBLIC.items():
        out.append(f"## `{package}`: {TITLES[package]}\n\n| name | what it is |\n|---|---|")
        for name, module in table.items():
            out.append(f"| `{name}` | {summary(getattr(importlib.import_module(module), name))} |")
        out.append("")
    return "\n".join(out)


# The first line of the generated block in a package's __init__.py; the block is it and the
# indented lines after it.
BLOCK_START = "if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py\n"
BLOCK_COMMENT = ("# The public names for static tools (mypy, pyright, IDEs); at run time "
                 "they load on\n# first use, through __getattr__.\n")
TYPING_IMPORT = "from typing import TYPE_CHECKING\n"
LINE_LENGTH = 100  # pyproject.toml's [tool.ruff]


def init_path(package: str) -> str:
    """The ``__init__.py`` of ``package`` in the checkout: pipelines/ and serving/ are
    installed as ``tfrs_logq.pipelines`` and ``tfrs_logq.serving``."""
    parts = package.split(".")
    if parts[1:2] in (["pipelines"], ["serving"]):
        parts = parts[1:]
    return os.path.join(ROOT, *parts, "__init__.py")


def _member_key(name: str) -> tuple:
    """ruff's isort order of imported names: constants, classes, then the rest."""
    kind = 0 if len(name) > 1 and name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name.lower(), name


def static_imports(table: dict) -> str:
    """The ``if TYPE_CHECKING:`` block importing each ``{name: module}`` of ``table``
    (``name as name``: a re-export to the type checkers), sorted as ruff's isort sorts."""
    lines = [BLOCK_START]
    for name, module in sorted(table.items(), key=lambda item: (item[1], _member_key(item[0]))):
        line = f"    from {module} import {name} as {name}\n"
        if len(line) - 1 > LINE_LENGTH:
            line = f"    from {module} import (\n        {name} as {name},\n    )\n"
        lines.append(line)
    return "".join(lines)


def with_static_imports(text: str, table: dict) -> str:
    """``text`` (an ``__init__.py``) with its generated block replaced by the one of
    ``table``; without one, the block is added at the end, with the ``TYPE_CHECKING``
    import before the first first-party import."""
    block = static_imports(table)
    if BLOCK_START not in text:
        if TYPING_IMPORT not in text:
            anchor = "from tfrs_logq import _api\n"
            if anchor not in text:
                raise ValueError(f"no {anchor.strip()!r} line to put {TYPING_IMPORT.strip()!r} "
                                 f"before")
            text = text.replace(anchor, TYPING_IMPORT + "\n" + anchor, 1)
        return text.rstrip("\n") + "\n\n" + BLOCK_COMMENT + block
    start = text.index(BLOCK_START)
    end = start + len(BLOCK_START)
    while end < len(text) and text.startswith("    ", end):
        end = text.index("\n", end) + 1 if "\n" in text[end:] else len(text)
    return text[:start] + block + text[end:]


def write_static_imports(check: bool) -> list:
    """Rewrites (``check``: only compares) each package's block; returns the stale files."""
    sys.path.insert(0, ROOT)
    from tfrs_logq import _api

    stale = []
    for package, table in _api.PUBLIC.items():
        path = init_path(package)
        with open(path) as f:
            text = f.read()
        wanted = with_static_imports(text, table)
        if wanted != text:
            stale.append(os.path.relpath(path, ROOT))
            if not check:
                with open(path, "w") as f:
                    f.write(wanted)
    return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page or a package's block differs")
    check = parser.parse_args().check
    stale = write_static_imports(check)
    text = render()
    with open(PAGE) as f:
        if f.read() != text:
            stale.append(os.path.relpath(PAGE, ROOT))
    if check:
        for path in stale:
            print(f"{path} is stale: run tools/api_page.py", file=sys.stderr)
        return 1 if stale else 0
    with open(PAGE, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
