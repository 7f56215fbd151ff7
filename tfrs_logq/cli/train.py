"""``tfrs-logq train``: one training run, SASRec (`tfrs_logq.sasrec.training.train`) or,
with ``--model two-tower``, a two-tower retrieval model (`tfrs_logq.towers.run`)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated, Literal, Optional

from tyro.conf import Suppress, arg

from tfrs_logq.cli._common import (
    LoadOptions,
    bad_share,
    config_file,
    data_record,
    default_log_split,
    default_split,
    load_options,
    warn_if_smoke,
)
from tfrs_logq.cli._flags import Verbose, check, given, shown
from tfrs_logq.pipelines.source import DataSource
from tfrs_logq.sasrec.config import TrainConfig

MODELS = ("sasrec", "two-tower")
# TrainConfig's fields a two-tower run takes (the data fields and these); the others are
# SASRec's and refused with --model two-tower.
TWO_TOWER_SHARED = ("loss", "seed", "batch_size", "embedding_dim", "learning_rate")


@dataclasses.dataclass
class TwoTowerFlags:
    """The two-tower model's own flags (not given: TwoTowerConfig's defaults)."""

    steps: Annotated[Optional[int], shown("3000")] = None
    """training steps (fixed length: no early stopping)"""
    history_length: Annotated[Optional[int], shown("50")] = None
    """the query tower reads the user's last this many items"""
    optimizer: Annotated[Optional[Literal["lazy-adam", "adam"]], shown(
        "lazy-adam: a step independent of the catalog")] = None
    """lazy-adam updates only the table rows a batch touches"""
    uniform_negatives: Annotated[Optional[int], shown("1024")] = None
    """uniform negatives shared by the batch, of the mns-* losses"""
    eval_every: Annotated[Optional[int], shown("500")] = None
    """evaluate the test split every this many steps (and at the last)"""
    exclude_seen: bool = True
    """the evaluation policy: leave the items of the history a request sends out of the
    ranking (a repeat target is then a miss); --no-exclude-seen ranks them, as top_k does
    with exclude_history false"""

    def __post_init__(self) -> None:
        check(self, at_least={"steps": 1, "history_length": 1, "eval_every": 1,
                              "uniform_negatives": 1})


@dataclasses.dataclass
class TrainFlags(TrainConfig):
    """TrainConfig's fields (its data source: the data flags); a preset sets those not
    given."""

    dataset: Suppress[str] = TrainConfig.dataset
    data_dir: Suppress[Optional[str]] = None
    data_format: Suppress[Optional[str]] = None
    interactions: Suppress[Optional[str]] = None
    user_column: Suppress[Optional[str]] = None
    item_column: Suppress[Optional[str]] = None
    time_column: Suppress[Optional[str]] = None
    log_format: Suppress[Optional[str]] = None


@dataclasses.dataclass
class Flags(Verbose):
    """train SASRec or a two-tower model with one of the paper's losses"""

    model_dir: Annotated[str, arg(metavar="DIR")]
    """where the run goes (config.json, weights, metrics.json, logs)"""
    model: Literal[MODELS] = "sasrec"
    """the model family: SASRec, or a two-tower model (a query tower over the user's last
    --history-length items, an item table; --loss inbatch|mns x
    none|logq-tfrs|logq-official|corrected)"""
    config: Annotated[Optional[str], arg(metavar="FILE")] = None
    """JSON object of TrainConfig fields (and "preset"); flags override it (SASRec)"""
    overwrite: bool = False
    """replace a run of another config (or a finished one) in --model-dir; without it such
    a directory is refused, and an interrupted run of the same config resumes"""
    json: bool = False
    """print the metrics as one JSON object"""
    data: Annotated[DataSource, arg(name="data (--weight-column: two-tower)")] = \
        dataclasses.field(default_factory=DataSource)
    training: Annotated[TrainFlags, arg(name="model, training and split")] = \
        dataclasses.field(default_factory=TrainFlags)
    two_tower: Annotated[TwoTowerFlags, arg(name="two-tower (--model two-tower)")] = \
        dataclasses.field(default_factory=TwoTowerFlags)
    load: Annotated[LoadOptions, arg(name="data loading")] = \
        dataclasses.field(default_factory=LoadOptions)


def _given_training(args) -> dict:
    """The `TrainConfig` fields given as flags (the data source's among them; its weight
    column is the two-tower's)."""
    source = given(args.flags.data, args.given - {"weight_column"})
    return {**given(args.flags.training, args.given), **source}


def _two_tower_flags(args) -> dict:
    """The two-tower flags given."""
    return given(args.flags.two_tower, args.given)


def training_overrides(args) -> dict:
    """``--config``, then the `TrainConfig` flags given, to go over the preset."""
    overrides = config_file(args.config) if args.config else {}
    return {**overrides, **_given_training(args)}


def _with_split(overrides: dict, preset_fields: dict = {}) -> dict:  # noqa: B006 (read only)
    """``overrides`` with the split a run takes when no flag, file or preset gives one:
    a user's log's temporal (or leave-one-out without times), an ExampleGen artifact's
    own (left unset), else `default_split`."""
    if "split" in {**preset_fields, **overrides} or overrides.get("examples"):
        return overrides
    if overrides.get("interactions"):
        return {**overrides, "split": default_log_split(overrides.get("time_column"))}
    return {**overrides, "split": default_split(overrides.get("data_format"))}


def _load(config, overrides: dict, args):
    """``(config, split)``: the split ``config``'s data fields name (an ExampleGen
    artifact's, which then decides the data fields; a user's log; a built-in dataset,
    read with the load flags, its file format recorded in the config)."""
    from tfrs_logq.pipelines.datasets import load_split
    from tfrs_logq.sasrec import training

    if config.examples:
        config = training.examples_config(config, explicit=set(overrides))
        return config, training.load_config_split(config)
    if config.interactions:
        return config, training.load_config_split(config, skip_bad_lines=args.skip_bad_lines,
                                                  **bad_share(args))
    if args.max_bad_share is not None:
        raise ValueError("--max-bad-share bounds what --skip-bad-lines skips of --interactions "
                         "(your log); a built-in dataset has no such bound: leave it out.")
    split = load_split(config.dataset, config.split, config.data_dir,
                       data_format=config.data_format,
                       temporal_fraction=config.temporal_fraction, **load_options(args))
    if config.dataset == "ml-1m":  # the file format used, for export and evaluate
        config = dataclasses.replace(config, data_format=split.interactions.data_format)
    return config, split


def run(args) -> int:
    if args.model == "two-tower":
        return _run_two_tower(args)
    given = [f"--{k.replace('_', '-')}" for k, v in _two_tower_flags(args).items()
             if v is not None] + (["--weight-column"] if args.weight_column else [])
    if given:
        raise ValueError(f"{given[0]} is a two-tower flag: add --model two-tower, or leave "
                         "it out for SASRec.")
    from tfrs_logq.sasrec import training
    from tfrs_logq.sasrec.config import PRESETS

    overrides = training_overrides(args)
    overrides = _with_split(overrides, PRESETS.get(overrides.get("preset") or "", {}))
    config, split = _load(training.resolve_config(**overrides), overrides, args)
    kwargs = {"overwrite": True} if args.overwrite else {}
    # Keras' progress bar rewrites one line with \r: in a pipe or a log, a line per epoch.
    verbose = 0 if args.json else ("auto" if sys.stdout.isatty() else 2)
    result = training.train(config, args.model_dir, verbose=verbose, split=split, **kwargs)
    result = {**result, "data": data_record(split.interactions)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    warn_if_smoke(config.preset)
    return 0


def _run_two_tower(args) -> int:
    """``train --model two-tower``: the data flags as for SASRec, the model's own
    (`TwoTowerFlags` and `TWO_TOWER_SHARED`); SASRec's other flags are refused."""
    from tfrs_logq.sasrec.config import DATA_FIELDS, TrainConfig
    from tfrs_logq.sasrec.run_directory import saved_config
    from tfrs_logq.sasrec.training import load_config_split
    from tfrs_logq.towers.config import TwoTowerConfig
    from tfrs_logq.towers.run import train_run
    from tfrs_logq.towers.training import Examples

    if args.config:
        raise ValueError("--config holds SASRec's TrainConfig fields: give the two-tower "
                         "model's as flags.")
    flags = _given_training(args)
    sasrec_only = [k for k in flags if k not in DATA_FIELDS and k not in TWO_TOWER_SHARED]
    if sasrec_only:
        raise ValueError(f"--{sasrec_only[0].replace('_', '-')} is a SASRec flag, not taken "
                         "by --model two-tower" + (" (its uniform negatives: "
                         "--uniform-negatives)." if sasrec_only[0] == "num_negatives" else "."))
    model_flags = {k: v for k, v in _two_tower_flags(args).items() if v is not None}
    weight_column = args.weight_column
    if "uniform_negatives" in model_flags:  # TwoTowerConfig's num_negatives
        model_flags["num_negatives"] = model_flags.pop("uniform_negatives")
    config = TwoTowerConfig(**{k: v for k, v in flags.items() if k in TWO_TOWER_SHARED},
                            **model_flags)
    overrides = _with_split({k: v for k, v in flags.items() if k in DATA_FIELDS})
    data_config = TrainConfig(**overrides).validate()  # a log's columns, one data source
    if weight_column is not None:
        if not weight_column.strip():
            raise ValueError("--weight-column is empty: name a column of --interactions, or "
                             "leave the flag out.")
        # load_config_split refuses a weight column without --interactions.
        split = load_config_split(data_config, weight_column=weight_column,
                                  skip_bad_lines=args.skip_bad_lines, **bad_share(args))
    else:
        data_config, split = _load(data_config, overrides, args)
    # Built (and the weights checked) before --model-dir is touched.
    examples = Examples(split, config.history_length)
    saved = saved_config(data_config)  # paths made absolute
    data = {k: saved[k] for k in DATA_FIELDS}
    if data["interactions"]:  # a user's log: no built-in dataset (TrainConfig's default)
        data["dataset"] = None
    # Recorded only when given or nonzero: an unweighted, clean run's config is unchanged.
    if weight_column:
        data["weight_column"] = weight_column
    if split.interactions.skipped_lines:  # what reloads the split skips them again
        data["skipped_lines"] = int(split.interactions.skipped_lines)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else \
        (lambda m: print(m, flush=True))
    when = (f"every {config.eval_every:,} steps" if config.eval_every < config.steps
            else "at the last step")
    say(f"two-tower {config.loss}: {split.num_items:,} items, {config.steps:,} steps of "
        f"{config.batch_size:,}, evaluating the test split {when}"
        + (f"; each example weighted by its {weight_column}" if weight_column else ""))

    def on_eval(row: dict) -> None:
        shown = [k for k in row if k.startswith(("recall@", "ndcg@"))][:4]
        say(f"  step {row['steps']:,}: " + ", ".join(f"{k} {row[k]:.4f}" for k in shown))

    result = train_run(config, split, args.model_dir, data, overwrite=args.overwrite,
                       on_eval=on_eval, examples=examples)
    result = {**{k: v for k, v in result.items() if k != "evaluations"},
              "model": "two-tower", "data": data_record(split.interactions)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
