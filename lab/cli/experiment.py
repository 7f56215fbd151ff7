"""``python -m lab experiment``: the paper's grid and its Table 1 (`lab.experiment`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal, Optional

from tyro.conf import arg

from lab.cli import PROG
from tfrs_logq.cli._common import default_split, warn_if_smoke
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.cli._train_flags import train_options, training_overrides
from tfrs_logq.pipelines.datasets import DATASETS
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.sasrec.config import OBJECTIVES, TrainConfig

_OTHER_DATA = ("interactions", "examples", "user_column", "item_column", "time_column",
               "log_format")
# `run_grid` loads the data with the defaults: no data-loading flags it would refuse. The
# grid runs over --datasets: a user's log or an ExampleGen artifact would train the same
# data under each dataset's name (`compare` takes a log).
_TrainOptions = train_options("TrainOptions", skip=("dataset", "split", "loss", "seed",
                                                    *_OTHER_DATA), preset="cpu")


@dataclasses.dataclass
class Flags(Verbose):
    output_dir: Annotated[str, arg(metavar="DIR")]
    """where runs/, results.csv, table.md and table.png go"""
    datasets: tuple[Literal[DATASETS], ...] = (TrainConfig.dataset,)
    """datasets"""
    splits: Annotated[Optional[tuple[Literal[SPLITS], ...]], shown(
        "temporal, gsasrec with --data-format sasrec")] = None
    """splits"""
    losses: tuple[Literal[OBJECTIVES], ...] = (
        "inbatch-none", "inbatch-logq-official", "inbatch-corrected", "mns-none",
        "mns-logq-official", "mns-corrected", "full-softmax")
    """losses"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """non-negative seeds"""
    config: Annotated[Optional[str], arg(metavar="FILE")] = None
    """JSON object of TrainConfig fields (and "preset"); flags override it"""
    parallel: int = 1
    """runs trained at once, each in its own process (fills a GPU with small models)"""
    json: bool = False
    """print one JSON line per run, no progress bars"""
    training: Annotated[_TrainOptions, arg(name="model and training")] = dataclasses.field(
        default_factory=_TrainOptions)

    def __post_init__(self) -> None:
        check(self, at_least={"seeds": 0, "parallel": 1})


def run(args) -> int:
    from lab.experiment import run_grid

    overrides = training_overrides(args)
    given = [k for k in _OTHER_DATA if overrides.get(k)]
    if given:
        raise ValueError(f"--config sets {given[0]!r}: experiment trains the built-in "
                         "--datasets; compare a user's log with `tfrs-logq compare`.")
    preset = overrides.pop("preset", None) or "cpu"
    data_dir = overrides.pop("data_dir", None)
    splits = list(args.splits or [default_split(overrides.get("data_format"))])
    run_grid(args.output_dir, list(args.datasets), splits, list(args.losses), list(args.seeds),
             preset,
             data_dir=data_dir, verbose=0 if args.json else 2, parallel=args.parallel,
             **overrides)
    print(f"wrote {os.path.join(args.output_dir, 'results.csv')}, table.md and table.png")
    warn_if_smoke(preset, PROG)
    return 0
