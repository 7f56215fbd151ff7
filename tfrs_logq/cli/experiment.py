"""``tfrs-logq experiment``: the paper's grid and its Table 1 (`tfrs_logq.studies.experiment`)."""

from __future__ import annotations

import os

from tfrs_logq.cli._common import (
    add_flag,
    add_verbose,
    comma_list,
    int_at_least,
    warn_if_smoke,
)
from tfrs_logq.cli._dataclass_flags import add_train_fields, train_value, training_overrides


def populate(p) -> None:
    from tfrs_logq.pipelines.datasets import DATASETS
    from tfrs_logq.pipelines.splits import SPLITS
    from tfrs_logq.sasrec.config import OBJECTIVES, TrainConfig

    defaults = TrainConfig()
    add_flag(p, "output-dir", required=True, metavar="DIR",
             help="where runs/, results.csv, table.md and table.png go")
    add_flag(p, "datasets", type=comma_list(DATASETS), default=defaults.dataset, metavar="LIST",
             help="comma-separated datasets")
    add_flag(p, "splits", type=comma_list(SPLITS), default=defaults.split, metavar="LIST",
             help="comma-separated splits")
    add_flag(p, "losses", type=comma_list(OBJECTIVES), metavar="LIST",
             default="inbatch-none,inbatch-logq,inbatch-corrected,mns-none,mns-logq,"
                     "mns-corrected,full-softmax",
             help="comma-separated losses")
    add_flag(p, "seeds", type=comma_list(item=train_value("seed", int)), default="0,1,2",
             metavar="LIST", help="comma-separated non-negative seeds")
    add_train_fields(p, experiment=True)
    add_flag(p, "parallel", type=int_at_least(1), default=1, metavar="N",
             help="runs trained at once, each in its own process (fills a GPU with small models)")
    add_flag(p, "json", action="store_true", help="print one JSON line per run, no progress bars")
    add_verbose(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tfrs_logq.studies.experiment import run_grid

    overrides = training_overrides(args)
    preset = overrides.pop("preset", None) or "cpu"
    data_dir = overrides.pop("data_dir", None)
    run_grid(args.output_dir, args.datasets, args.splits, args.losses, args.seeds, preset,
             data_dir=data_dir, verbose=0 if args.json else 2, parallel=args.parallel,
             **overrides)
    print(f"wrote {os.path.join(args.output_dir, 'results.csv')}, table.md and table.png")
    warn_if_smoke(preset)
    return 0


