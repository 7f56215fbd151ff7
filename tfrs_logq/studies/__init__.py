"""What a user runs on top of the library and the trainers: the comparison of standard
against corrected logQ on a user's log (`load_plan`, `run_compare`; ``tfrs-logq compare``),
the demo (`DemoConfig`, `run_demo`) and the gradient-bias diagnostic (``tfrs-logq
diagnose``). The public names are listed in `tfrs_logq._api` (docs/api.md)."""

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.studies")
