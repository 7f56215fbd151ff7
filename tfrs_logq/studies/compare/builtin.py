"""`run_compare`: a comparison of the built-in models (``plan.model``: ``"two-tower"`` or
``"sasrec"``), trained by `tfrs_logq.studies.compare.runner` (`builtin_trainer`,
`run_plan`) and reported by `tfrs_logq.studies.compare.report`. A user's own
`tfrs.Model` enters at `tfrs_logq.studies.compare.model_fn.compare_model`, beside it.
"""

from __future__ import annotations

from typing import Callable, Optional

from tfrs_logq.pipelines.splits import Split
from tfrs_logq.studies.compare.plan import (
    Plan,
    RunShare,
)
from tfrs_logq.studies.compare.report import reporter
from tfrs_logq.studies.compare.runner import ServedIndex, builtin_trainer, run_plan


def run_compare(plan: Plan, split: Split, output_dir: str, say: Callable[[str], None] = print,
                max_runs: Optional[int] = None, margin=None,
                primary: Optional[tuple] = None,
                served_index: Optional[ServedIndex] = None,
                share: Optional[RunShare] = None, tracking=None) -> list[dict]:
    """Trains the plan's unfinished runs into ``output_dir`` (seed by seed, so that an
    interrupted comparison holds whole pairs), then writes the report. Returns the rows
    of results.csv. One process per directory (`RunLock`), unless ``share``: this
    process's `RunShare` of a comparison spread over processes (`run_plan`).
    ``served_index``: `run_plan`'s hook (None: the served index is not measured);
    ``tracking``: its MLflow runs (`run_plan`)."""
    return run_plan(plan, output_dir, builtin_trainer(plan, split, say), say=say,
                    max_runs=max_runs, served_index=served_index, share=share,
                    report=reporter(margin, primary), tracking=tracking)


__all__ = ["run_compare"]
