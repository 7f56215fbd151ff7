"""What a user runs on top of the library and the trainers: the comparison of standard
against corrected logQ on a user's log (`load_plan`, `run_compare`; ``tfrs-logq compare``),
the demo (`DemoConfig`, `run_demo`) and the gradient-bias diagnostic (``tfrs-logq
diagnose``). The public names are listed in `tfrs_logq._api` (docs/api.md)."""

from typing import TYPE_CHECKING

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.studies")

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.studies.compare.builtin import run_compare as run_compare
    from tfrs_logq.studies.compare.plan import Plan as Plan
    from tfrs_logq.studies.compare.plan import load_plan as load_plan
    from tfrs_logq.studies.demo import DemoConfig as DemoConfig
    from tfrs_logq.studies.demo import run_demo as run_demo
