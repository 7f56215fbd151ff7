"""``python -m lab study``: the large-catalog study on the synthetic stream (`lab.study`)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Optional

from lab.study import OPTIMIZERS, PRESETS
from tfrs_logq.cli._flags import add_flags, flag


@dataclasses.dataclass
class StudyFlags:
    preset: str = flag("pilot", choices=tuple(PRESETS))
    """the grid (PRESETS in lab/study.py)"""
    output_dir: str = flag("study_output", metavar="DIR")
    """results.csv, table.md and paired.png go here"""
    seeds: Optional[tuple[int, ...]] = flag(None, at_least=0, default_text="the preset's")
    """override the preset's seeds"""
    steps: Optional[int] = flag(None, at_least=1, default_text="the preset's")
    """override the preset's steps"""
    eval_at: Optional[tuple[int, ...]] = flag(None, at_least=1, metavar="STEPS",
                                              default_text="the preset's")
    """also evaluate at these steps, e.g. 3000,10000 (a row each)"""
    optimizer: Optional[str] = flag(None, choices=OPTIMIZERS,
                                    default_text="the preset's, lazy-adam")
    """override the preset's optimizer"""
    max_runs: Optional[int] = flag(None, at_least=0, default_text="all")
    """run at most N unfinished runs, then stop"""
    pending: bool = False
    """print the number of unfinished runs and exit"""
    json: bool = False
    """print one JSON object (the runs, those pending, the results' rows); progress goes
    to stderr"""


def populate(p) -> None:
    add_flags(p, StudyFlags)


def run(args) -> int:
    from lab.study import preset_runs
    from lab.study_grid import pending, run_grid

    overrides = {k: getattr(args, k) for k in ("steps", "optimizer") if getattr(args, k)}
    if args.eval_at:
        overrides["eval_at"] = tuple(args.eval_at)
    runs = preset_runs(args.preset, args.seeds, **overrides)
    if args.pending:
        left = len(pending(runs, args.output_dir))
        print(json.dumps({"runs": len(runs), "pending": left}) if args.json else left)
        return 0
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else \
        (lambda m: print(m, flush=True))
    rows = run_grid(runs, args.output_dir, args.max_runs, say=say)
    if args.json:
        print(json.dumps({"output_dir": args.output_dir, "runs": len(runs),
                          "pending": len(pending(runs, args.output_dir)), "results": rows}))
    return 0
