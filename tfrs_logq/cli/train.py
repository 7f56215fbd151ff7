"""``tfrs-logq train``: one SASRec training run (`tfrs_logq.sasrec.training.train`)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Optional

from tfrs_logq.cli._common import (
    LoadOptions,
    data_record,
    default_split,
    load_options,
    warn_if_smoke,
)
from tfrs_logq.cli._flags import add_flags, add_train_flags, flag, training_overrides


@dataclasses.dataclass
class TrainFlags:
    model_dir: str = flag(metavar="DIR")
    """where the run goes (config.json, best weights, metrics.json, logs)"""
    config: Optional[str] = flag(None, metavar="FILE")
    """JSON object of TrainConfig fields (and "preset"); flags override it"""
    overwrite: bool = False
    """replace a run of another config (or a finished one) in --model-dir; without it such
    a directory is refused, and an interrupted run of the same config resumes"""
    json: bool = False
    """print the metrics as one JSON object"""


def populate(p) -> None:
    add_flags(p, TrainFlags, only=("model_dir",))
    add_train_flags(p)
    add_flags(p, LoadOptions, group="data")
    add_flags(p, TrainFlags, skip=("model_dir",))


def run(args) -> int:
    from tfrs_logq.pipelines.datasets import load_split
    from tfrs_logq.sasrec import training
    from tfrs_logq.sasrec.config import PRESETS

    overrides = training_overrides(args)
    given = {**PRESETS.get(overrides.get("preset") or "", {}), **overrides}
    if "split" not in given and overrides.get("interactions"):  # a user's log
        overrides["split"] = "temporal" if overrides.get("time_column") else "loo"
    elif "split" not in given and not overrides.get("examples"):  # the artifact's, else:
        overrides["split"] = default_split(overrides.get("data_format"))
    config = training.resolve_config(**overrides)
    if config.examples:  # the ExampleGen artifact decides the data and split
        config = training.examples_config(config, explicit=set(overrides))
        split = training.load_config_split(config)
    elif config.interactions:  # a user's log (pipelines.user_log)
        split = training.load_config_split(config)
    else:
        split = load_split(config.dataset, config.split, config.data_dir,
                           data_format=config.data_format,
                           temporal_fraction=config.temporal_fraction, **load_options(args))
    if config.dataset == "ml-1m" and not config.examples and not config.interactions:
        # record the file format used, for export and evaluate
        config = dataclasses.replace(config, data_format=split.interactions.data_format)
    kwargs = {"overwrite": True} if args.overwrite else {}
    # Keras' progress bar rewrites one line with \r: in a pipe or a log, a line per epoch.
    verbose = 0 if args.json else ("auto" if sys.stdout.isatty() else 2)
    result = training.train(config, args.model_dir, verbose=verbose, split=split, **kwargs)
    result = {**result, "data": data_record(split.interactions)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    warn_if_smoke(config.preset)
    return 0
