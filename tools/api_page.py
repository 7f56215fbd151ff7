"""Writes docs/api.md from the public API's table (`tfrs_logq._api.PUBLIC`): per package, each
name with the first paragraph of its docstring (a constant: its value).

    .venv/bin/python tools/api_page.py          # rewrite docs/api.md
    .venv/bin/python tools/api_page.py --check  # exit 1 if docs/api.md differs

tests/test_public_api.py runs the check.
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
`tfrs_logq/_api.py`; each package's `__all__` comes from it, this page is written from it
(`tools/api_page.py`), and `tests/test_public_api.py` checks that they agree and that every
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    text = render()
    if parser.parse_args().check:
        with open(PAGE) as f:
            return 0 if f.read() == text else 1
    with open(PAGE, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
