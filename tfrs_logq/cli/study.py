"""``tfrs-logq study``: the large-catalog study on the synthetic stream (`tfrs_logq.studies.study`)."""

from __future__ import annotations


def populate(p) -> None:
    from tfrs_logq.cli._common import add_flag
    from tfrs_logq.studies.study import OPTIMIZERS, PRESETS

    add_flag(p, "preset", choices=tuple(PRESETS), default="pilot",
             help="the grid (see PRESETS in tfrs_logq/studies/study.py)")
    add_flag(p, "output-dir", default="study_output", metavar="DIR",
             help="results.csv, table.md and paired.png go here")
    add_flag(p, "seeds", type=int, nargs="+", default=None,
             help="override the preset's seeds (default: the preset's)")
    add_flag(p, "steps", type=int, default=None,
             help="override the preset's steps (default: the preset's)")
    add_flag(p, "eval-at", type=_steps_list, default=None, metavar="STEPS",
             help="also evaluate at these steps, e.g. 3000,10000 (a row each; default: "
                  "the preset's)")
    add_flag(p, "optimizer", choices=OPTIMIZERS, default=None,
             help="override the preset's optimizer (default: the preset's, lazy-adam)")
    add_flag(p, "max-runs", type=int, default=None, metavar="N",
             help="run at most N unfinished runs, then stop (default: all)")
    add_flag(p, "pending", action="store_true",
             help="print the number of unfinished runs and exit")
    p.set_defaults(run=run)


def _steps_list(text: str) -> tuple:
    import argparse

    try:
        steps = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step counts like 3000,10000, received "
                                         f"{text[:80]!r}") from None
    if not steps or min(steps) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive step counts, received {text[:80]!r}")
    return steps


def run(args) -> int:
    from tfrs_logq.studies.study import preset_runs
    from tfrs_logq.studies.study_grid import pending, run_grid

    overrides = {k: getattr(args, k) for k in ("steps", "optimizer", "eval_at")
                 if getattr(args, k) is not None}
    runs = preset_runs(args.preset, args.seeds, **overrides)
    if args.pending:
        print(len(pending(runs, args.output_dir)))
        return 0
    run_grid(runs, args.output_dir, args.max_runs, say=lambda m: print(m, flush=True))
    return 0
