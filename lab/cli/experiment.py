"""``python -m lab experiment``: the paper's grid and its Table 1 (`lab.experiment`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal, Optional

from tyro.conf import Suppress, arg

from lab.cli import PROG
from tfrs_logq.cli._common import config_file, default_split, warn_if_smoke
from tfrs_logq.cli._flags import Verbose, check, given, shown
from tfrs_logq.pipelines.datasets import DATASETS
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.sasrec.config import OBJECTIVES, TrainConfig

_GRID = ("dataset", "split", "loss", "seed")  # each run's own, from --datasets ... --seeds
_OTHER_DATA = ("interactions", "examples", "user_column", "item_column", "time_column",
               "log_format")


@dataclasses.dataclass
class GridTraining(TrainConfig):
    """TrainConfig's model and training fields; --datasets, --splits, --loss and --seeds
    set each run's data, split, loss and seed."""

    # `run_grid` loads the data with the defaults (no data-loading flags it would refuse),
    # and runs over --datasets: a user's log or an ExampleGen artifact would train the
    # same data under each dataset's name (`compare` takes a log).

    dataset: Suppress[str] = TrainConfig.dataset
    split: Suppress[str] = TrainConfig.split
    loss: Suppress[str] = TrainConfig.loss
    seed: Suppress[int] = TrainConfig.seed
    interactions: Suppress[Optional[str]] = None
    examples: Suppress[Optional[str]] = None
    user_column: Suppress[Optional[str]] = None
    item_column: Suppress[Optional[str]] = None
    time_column: Suppress[Optional[str]] = None
    log_format: Suppress[Optional[str]] = None


@dataclasses.dataclass
class Flags(Verbose):
    """run the paper's grid and write its Table 1"""

    output_dir: Annotated[str, arg(metavar="DIR")]
    """where runs/, results.csv, table.md and table.png go"""
    datasets: tuple[Literal[DATASETS], ...] = (TrainConfig.dataset,)
    """datasets"""
    splits: Annotated[Optional[tuple[Literal[SPLITS], ...]], shown(
        "temporal, gsasrec with --data-format sasrec")] = None
    """splits"""
    loss: tuple[Literal[OBJECTIVES], ...] = (
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
    training: Annotated[GridTraining, arg(name="model and training")] = dataclasses.field(
        default_factory=GridTraining)

    def __post_init__(self) -> None:
        check(self, at_least={"seeds": 0, "parallel": 1})


def run(args) -> int:
    from lab.experiment import run_grid

    # --loss and --seeds name the grid's runs: TrainConfig's loss and seed (hidden) are not
    # given by them, and a --config's dataset, split, loss or seed gives way to the grid's.
    overrides = {**(config_file(args.config) if args.config else {}),
                 **given(args.flags.training, args.given - set(_GRID))}
    for name in _GRID:
        overrides.pop(name, None)
    other = [k for k in _OTHER_DATA if overrides.get(k)]
    if other:
        raise ValueError(f"--config sets {other[0]!r}: experiment trains the built-in "
                         "--datasets; compare a user's log with `tfrs-logq compare`.")
    preset = overrides.pop("preset", None) or "cpu"
    data_dir = overrides.pop("data_dir", None)
    splits = list(args.splits or [default_split(overrides.get("data_format"))])
    run_grid(args.output_dir, list(args.datasets), splits, list(args.loss), list(args.seeds),
             preset,
             data_dir=data_dir, verbose=0 if args.json else 2, parallel=args.parallel,
             **overrides)
    print(f"wrote {os.path.join(args.output_dir, 'results.csv')}, table.md and table.png")
    warn_if_smoke(preset, PROG)
    return 0
