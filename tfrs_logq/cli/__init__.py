"""The `tfrs-logq` command line: one module per command, each with its flags (``Flags``, a
dataclass tyro parses) and its handler (``run``); the work itself is done by the library.

- `app`: the command tree (`COMMANDS`, one `tyro.cli` call: `parse`), `main`, logging,
  one-line errors and exit codes (2 for an error a user can fix, 3 when ``pipeline run``'s
  Evaluator does not bless the model, 130 on Ctrl-C).
- `_flags`: what the flag dataclasses share: ``--verbose``, bounds (`check`), the fields
  a user gave (`given`).
- `_common`: what several commands share (the exit statuses, data loading flags, the
  default split, ...).
- ``demo``, ``data``, ``train``, ``compare``, ``diagnose``, ``export``, ``serve``,
  ``evaluate``, ``pipeline``: the commands. (The SASRec grid behind the project's findings,
  ``experiment``, is the repository's ``python -m lab``, not installed; it runs its own
  commands through `main`.)

`main` and `parse` are the public entry points (the ``tfrs-logq`` console
script is ``tfrs_logq.cli:main``; ``python -m tfrs_logq.cli`` runs it too).
"""

from tfrs_logq.cli import _quiet
from tfrs_logq.cli._common import NOT_BLESSED_EXIT, PROG, SMOKE_WARNING
from tfrs_logq.cli.app import _one_line, main, parse  # noqa: F401 (_one_line: tests)

# TF 2.21's start-up lines ignore TF_CPP_MIN_LOG_LEVEL (which `main` sets unless --verbose):
# they are filtered at tensorflow's first import (`_quiet`).
_quiet.install()

__all__ = ["NOT_BLESSED_EXIT", "PROG", "SMOKE_WARNING", "main", "parse"]
