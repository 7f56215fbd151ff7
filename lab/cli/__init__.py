"""``python -m lab``: the lab's command, ``experiment``, with the flags,
help, one-line errors and exit statuses of ``tfrs-logq`` (`tfrs_logq.cli.app`): one module
per command, each with its flags (``Flags``) and its handler (``run``)."""

from __future__ import annotations

from typing import Optional, Sequence

from tfrs_logq.cli import app  # tfrs_logq.cli filters TF 2.21's start-up lines (`_quiet`)

PROG = "python -m lab"

# (path, module, help): one module of `lab.cli` per command, as `tfrs_logq.cli.app.COMMANDS`.
COMMANDS = (
    (("experiment",), "experiment", "run the paper's grid and write its Table 1"),
)


def build_parser():
    """The ``python -m lab`` parser; each command's flags are added when first used."""
    return app.build_parser(COMMANDS, package=__name__, prog=PROG,
                            description="The experiments behind tfrs-logq's findings, "
                                        "run from a checkout (not installed).")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return app.main(argv, build=build_parser)


__all__ = ["COMMANDS", "PROG", "build_parser", "main"]
