"""``python -m lab experiment``: the paper's grid and its Table 1 (`lab.experiment`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from lab.cli import PROG
from tfrs_logq.cli._common import default_split, warn_if_smoke
from tfrs_logq.cli._flags import add_flags, add_train_flags, flag, training_overrides
from tfrs_logq.pipelines.datasets import DATASETS
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.sasrec.config import OBJECTIVES, TrainConfig


@dataclasses.dataclass
class ExperimentFlags:
    output_dir: str = flag(metavar="DIR")
    """where runs/, results.csv, table.md and table.png go"""
    datasets: tuple[str, ...] = flag((TrainConfig.dataset,), choices=DATASETS)
    """datasets"""
    splits: Optional[tuple[str, ...]] = flag(
        None, choices=SPLITS, default_text="temporal, gsasrec with --data-format sasrec")
    """splits"""
    losses: tuple[str, ...] = flag(
        ("inbatch-none", "inbatch-logq-official", "inbatch-corrected", "mns-none",
         "mns-logq-official", "mns-corrected", "full-softmax"), choices=OBJECTIVES)
    """losses"""
    seeds: tuple[int, ...] = flag((0, 1, 2), at_least=0)
    """non-negative seeds"""
    config: Optional[str] = flag(None, metavar="FILE")
    """JSON object of TrainConfig fields (and "preset"); flags override it"""
    parallel: int = flag(1, at_least=1)
    """runs trained at once, each in its own process (fills a GPU with small models)"""
    json: bool = False
    """print one JSON line per run, no progress bars"""


_OTHER_DATA = ("interactions", "examples", "user_column", "item_column", "time_column",
               "log_format")


def populate(p) -> None:
    # `run_grid` loads the data with the defaults: no data-loading flags it would refuse.
    add_flags(p, ExperimentFlags, only=("output_dir", "datasets", "splits", "losses", "seeds"))
    # The grid runs over --datasets: a user's log or an ExampleGen artifact would train
    # the same data under each dataset's name (`compare` takes a log).
    add_train_flags(p, skip=("dataset", "split", "loss", "seed") + _OTHER_DATA,
                    meta={"preset": {"default_text": "cpu"}})
    add_flags(p, ExperimentFlags, only=("config", "parallel", "json"))


def run(args) -> int:
    from lab.experiment import run_grid

    overrides = training_overrides(args)
    given = [k for k in _OTHER_DATA if overrides.get(k)]
    if given:
        raise ValueError(f"--config sets {given[0]!r}: experiment trains the built-in "
                         "--datasets; compare a user's log with `tfrs-logq compare`.")
    preset = overrides.pop("preset", None) or "cpu"
    data_dir = overrides.pop("data_dir", None)
    splits = args.splits or [default_split(overrides.get("data_format"))]
    run_grid(args.output_dir, args.datasets, splits, args.losses, args.seeds, preset,
             data_dir=data_dir, verbose=0 if args.json else 2, parallel=args.parallel,
             **overrides)
    print(f"wrote {os.path.join(args.output_dir, 'results.csv')}, table.md and table.png")
    warn_if_smoke(preset, PROG)
    return 0
