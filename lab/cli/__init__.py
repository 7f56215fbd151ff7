"""``python -m lab``: the lab's command, ``experiment``, with the flags, help, one-line
errors and exit statuses of ``tfrs-logq`` (`tfrs_logq.cli.app`): one module per command,
each with its flags (``Flags``) and its handler (``run``)."""

from __future__ import annotations

from typing import Annotated, Optional, Sequence, Union

from tyro.conf import Suppress, subcommand

from tfrs_logq.cli import app  # tfrs_logq.cli filters TF 2.21's start-up lines (`_quiet`)

PROG = "python -m lab"

from lab.cli import experiment  # noqa: E402 (it reads PROG)

COMMANDS = Union[Annotated[experiment.Flags, subcommand("experiment")], Annotated[None, Suppress]]


def main(argv: Optional[Sequence[str]] = None) -> int:
    return app.main(argv, commands=COMMANDS, prog=PROG,
                    description="The experiments behind tfrs-logq's findings, run from a "
                                "checkout (not installed).")


__all__ = ["COMMANDS", "PROG", "main"]
