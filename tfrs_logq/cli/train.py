"""``tfrs-logq train``: one training run, ``train sasrec`` (the default;
`tfrs_logq.sasrec.training.train`) or ``train two-tower``, a two-tower retrieval model
(`tfrs_logq.towers.run`)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated, Literal, Optional, Union

from tyro.conf import Suppress, arg, subcommand

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
from tfrs_logq.pipelines.source import DataSource, LogFilters
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.sasrec.config import TrainConfig
from tfrs_logq.towers.config import TwoTowerConfig


@dataclasses.dataclass
class TrainFlags(TrainConfig):
    """TrainConfig's fields (its data source and split: the data flags); a preset sets
    those not given."""

    dataset: Suppress[str] = TrainConfig.dataset
    data_dir: Suppress[Optional[str]] = None
    data_format: Suppress[Optional[str]] = None
    interactions: Suppress[Optional[str]] = None
    user_column: Suppress[Optional[str]] = None
    item_column: Suppress[Optional[str]] = None
    time_column: Suppress[Optional[str]] = None
    log_format: Suppress[Optional[str]] = None
    split: Suppress[str] = TrainConfig.split
    temporal_fraction: Suppress[Optional[float]] = None
    examples: Suppress[Optional[str]] = None
    min_item_interactions: Suppress[int] = TrainConfig.min_item_interactions
    min_user_interactions: Suppress[int] = TrainConfig.min_user_interactions
    deduplicate: Suppress[bool] = TrainConfig.deduplicate


@dataclasses.dataclass
class SASRec:
    """SASRec with one of the paper's losses (the default model): TrainConfig's fields; a
    --preset or --config sets those not given"""

    config: Annotated[Optional[str], arg(metavar="FILE")] = None
    """JSON object of TrainConfig fields (and "preset"); flags override it"""
    training: Annotated[TrainFlags, arg(name="model and training")] = \
        dataclasses.field(default_factory=TrainFlags)

    def __post_init__(self) -> None:
        check(self)  # --config "" names no file


@dataclasses.dataclass
class SplitFlags:
    """The evaluation split (as TrainConfig's fields of these names)."""

    split: Annotated[Optional[Literal[SPLITS]], shown(
        "temporal; gsasrec with --data-format sasrec; loo for a log without --time-column")
    ] = None
    """evaluation split: leave-one-out (loo), gSASRec's validation users (gsasrec) or
    global temporal (needs timestamps)"""
    temporal_fraction: Annotated[Optional[float], arg(metavar="F")] = None
    """temporal split: fraction of interactions for test, and again for validation"""
    examples: Annotated[Optional[str], arg(metavar="DIR")] = None
    """train on this ExampleGen artifact of `tfrs-logq pipeline run`
    (PIPELINE_ROOT/ExampleGen) instead of loading the data file; its dataset and split
    are used"""


@dataclasses.dataclass
class Flags(Verbose):
    """train SASRec (`train sasrec`, the default) or a two-tower model (`train two-tower`)
    with one of the paper's losses"""

    model_dir: Annotated[str, arg(metavar="DIR")]
    """where the run goes (config.json, weights, metrics.json, logs)"""
    overwrite: bool = False
    """replace a run of another config (or a finished one) in --model-dir; without it such
    a directory is refused, and an interrupted run of the same config resumes"""
    json: bool = False
    """print the metrics as one JSON object"""
    mlflow: bool = False
    """two-tower: also log the run to MLflow (MLFLOW_TRACKING_URI; the mlflow extra; on when
    MLFLOW_TRACKING_URI is set)"""
    data: Annotated[DataSource, arg(name="data (--weight-column: two-tower)")] = \
        dataclasses.field(default_factory=DataSource)
    filters: Annotated[LogFilters, arg(name="your log (--interactions)")] = \
        dataclasses.field(default_factory=LogFilters)
    split: Annotated[SplitFlags, arg(name="split")] = dataclasses.field(
        default_factory=SplitFlags)
    load: Annotated[LoadOptions, arg(name="data loading")] = \
        dataclasses.field(default_factory=LoadOptions)
    model: Union[
        Annotated[SASRec, subcommand("sasrec")],
        Annotated[TwoTowerConfig, subcommand("two-tower", description=(
            "a two-tower retrieval model: a query tower over the user's last "
            "--history-length items, an item table; --loss inbatch|mns x "
            "none|logq-tfrs|logq-official|corrected"))],
    ] = dataclasses.field(default_factory=SASRec)

    def __post_init__(self) -> None:
        check(self)  # --model-dir "" names no directory


def _given_training(args) -> dict:
    """The `TrainConfig` fields given as flags (the data source's and the split's among
    them; the data source's weight column is the two-tower's)."""
    source = given(args.flags.data, args.given - {"weight_column"})
    training = (given(args.flags.model.training, args.given)
                if isinstance(args.flags.model, SASRec) else {})
    return {**training, **given(args.flags.split, args.given),
            **given(args.flags.filters, args.given), **source}


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
    if isinstance(args.flags.model, TwoTowerConfig):
        return _run_two_tower(args)
    if args.weight_column:
        raise ValueError("--weight-column weights the two-tower model's loss (train "
                         "two-tower); SASRec trains unweighted: leave it out.")
    if args.mlflow:
        raise ValueError("--mlflow logs train two-tower and compare; train sasrec writes "
                         "TensorBoard logs (MODEL_DIR/logs): leave it out.")
    from tfrs_logq.sasrec import training
    from tfrs_logq.sasrec.config import PRESETS

    overrides = training_overrides(args)
    if overrides.get("interactions"):  # a user's log: no built-in dataset is recorded
        overrides["dataset"] = ""
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
    """``train two-tower``: the data and split flags as for SASRec, the model's own
    (`TwoTowerConfig`'s fields)."""
    from tfrs_logq.sasrec.config import DATA_FIELDS, LOG_FILTERS
    from tfrs_logq.sasrec.run import saved_config
    from tfrs_logq.sasrec.training import load_config_split
    from tfrs_logq.towers.run import train_run
    from tfrs_logq.towers.training import Examples

    config, weight_column = args.flags.model, args.weight_column
    if config.strategy == "multi-worker":  # before the log is read
        from tfrs_logq._util.strategy import check_tf_config

        check_tf_config()
    from tfrs_logq._util.tracking import tracking

    tracked = tracking(args.mlflow)  # one line before the log is read
    overrides = _with_split(_given_training(args))
    data_config = TrainConfig(**overrides).validate()  # a log's columns, one data source
    if weight_column is not None:
        # load_config_split refuses a weight column without --interactions.
        split = load_config_split(data_config, weight_column=weight_column,
                                  skip_bad_lines=args.skip_bad_lines, **bad_share(args))
    else:
        data_config, split = _load(data_config, overrides, args)
    # Built (and the weights checked) before --model-dir is touched.
    examples = Examples(split, config.history_length)
    saved = saved_config(data_config)  # paths made absolute
    data = {k: saved[k] for k in DATA_FIELDS
            if k not in LOG_FILTERS or saved[k] != getattr(TrainConfig, k)}  # unless given
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
                       on_eval=on_eval, examples=examples, tracking=tracked)
    result = {**{k: v for k, v in result.items() if k != "evaluations"},
              "model": "two-tower", "data": data_record(split.interactions)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
