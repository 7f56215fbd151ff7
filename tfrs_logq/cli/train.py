"""``tfrs-logq train``: one SASRec training run (`tfrs_logq.sasrec.training.train`)."""

from __future__ import annotations

import dataclasses
import json

from tfrs_logq.cli._common import add_flag, add_verbose, data_record, load_options, warn_if_smoke
from tfrs_logq.cli._dataclass_flags import add_train_fields, training_overrides


def populate(p) -> None:
    add_flag(p, "model-dir", required=True, metavar="DIR",
             help="where the run goes (config.json, best weights, metrics.json, logs)")
    add_train_fields(p, experiment=False)
    add_flag(p, "overwrite", action="store_true",
             help="replace a run of another config (or a finished one) in --model-dir; without "
                  "it such a directory is refused, and an interrupted run of the same config "
                  "resumes")
    add_flag(p, "json", action="store_true", help="print the metrics as one JSON object")
    add_verbose(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tfrs_logq.pipelines.datasets import load_split
    from tfrs_logq.sasrec import training

    overrides = training_overrides(args)
    config = training.resolve_config(**overrides)
    if config.examples:  # the ExampleGen artifact decides the data and split
        config = training.examples_config(config, explicit=set(overrides))
        split = training.load_split(config)
    else:
        split = load_split(config.dataset, config.split, config.data_dir,
                           data_format=config.data_format,
                           temporal_fraction=config.temporal_fraction, **load_options(args))
    if config.dataset == "ml-1m" and not config.examples:
        # record the file format used, for export and evaluate
        config = dataclasses.replace(config, data_format=split.interactions.data_format)
    kwargs = {"overwrite": True} if args.overwrite else {}
    result = training.train(config, args.model_dir, verbose=0 if args.json else "auto",
                            split=split, **kwargs)
    result = {**result, "data": data_record(split.interactions)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    warn_if_smoke(config.preset)
    return 0


