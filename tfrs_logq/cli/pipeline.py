"""``tfrs-logq pipeline run``: the batch pipeline on Apache Beam
(`tfrs_logq.pipelines.beam.pipeline.run_pipeline`). Exits 3, with one line, when its
Evaluator does not bless the model."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from typing import Annotated, Literal, Optional

from tyro.conf import Suppress, arg

from tfrs_logq.cli._common import (
    NOT_BLESSED_EXIT,
    PROG,
    LoadOptions,
    bad_share,
    config_file,
    default_log_split,
    default_split,
    warn_if_smoke,
)
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.pipelines.beam import COMPONENTS, METRICS
from tfrs_logq.pipelines.beam.exporter import INDEXES
from tfrs_logq.pipelines.beam.runner import DEFAULT_NUM_WORKERS, RUNNERS
from tfrs_logq.pipelines.datasets import DATASETS
from tfrs_logq.pipelines.source import SOURCE_GROUP, DataSource, LogFilters
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.sasrec.config import OBJECTIVES, PRESETS, TrainConfig


def _thresholds(parts) -> dict:
    """``("METRIC=MIN", ...)`` -> ``{metric: min}``, each minimum in [0, 1]."""
    out = {}
    for part in parts:
        name, sep, value = (s.strip() for s in part.partition("="))
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or name not in METRICS:
            raise ValueError(f"argument --threshold: {part!r} is not METRIC=MIN with METRIC "
                             f"one of {', '.join(METRICS)}")
        if not 0.0 <= out[name] <= 1.0:
            raise ValueError(f"argument --threshold: {name}: must be at least 0 and at most "
                             f"1, got {value}")
    return out


_BEAM = ("beam (Beam's own flags go after --: tfrs-logq pipeline run ... --runner "
         "DataflowRunner -- --project P --region R --temp_location gs://B/tmp "
         "--sdk_container_image IMAGE)")
_TRAINER = "Trainer (tfrs-logq train --examples DIR/ExampleGen --log-q DIR/Statistics)"
_SERVING = "Exporter, BulkInferrer, Evaluator, Pusher"


@dataclasses.dataclass
class SplitOptions:
    split: Annotated[Optional[Literal[SPLITS]], shown(
        "temporal; gsasrec with --data-format sasrec; loo for a log without --time-column"
    )] = None
    """evaluation split: leave-one-out (loo), gSASRec's validation users (gsasrec) or
    global temporal (needs timestamps)"""
    temporal_fraction: Annotated[Optional[float], shown("0.1; 0.01 for steam")] = None
    """temporal split: fraction of interactions for test, and again for validation"""

    def __post_init__(self) -> None:
        check(self, above={"temporal_fraction": 0})


@dataclasses.dataclass
class TrainerOptions:
    preset: Annotated[Optional[Literal[tuple(PRESETS)]], shown("smoke")] = None
    """the Trainer's preset (as train --preset)"""
    loss: Annotated[Optional[Literal[OBJECTIVES]], shown(TrainConfig.loss)] = None
    """training objective: the paper's losses"""
    seed: Annotated[Optional[int], shown("0")] = None
    """random seed"""

    def __post_init__(self) -> None:
        check(self, at_least={"seed": 0})


@dataclasses.dataclass
class PipelineSource(DataSource):
    """A built-in dataset (--dataset), synthetic data (--dataset synthetic), or your own
    log (--interactions with --user-column and --item-column)."""

    dataset: Annotated[Optional[Literal[(*DATASETS, "synthetic")]], SOURCE_GROUP] = None
    """a built-in dataset, instead of --interactions; synthetic draws the synthetic
    stream's model in the workers (--synthetic-*; ExampleGen and Statistics only) (unset:
    ml-1m, unless --interactions)"""


@dataclasses.dataclass
class PipelineLoadOptions(LoadOptions):  # ExampleGen reads the file: no preprocessed cache
    cache: Suppress[bool] = True


@dataclasses.dataclass
class SyntheticFlags:
    synthetic_users: int = 10_000
    """users (each: the history, a validation and a test item)"""
    synthetic_items: int = 5_000
    """items (Zipf popularity in 50 topics)"""
    synthetic_history_length: int = 20
    """training items per user"""
    synthetic_seed: int = 0
    """seed of every draw (the same seed gives the same artifacts on any number of
    workers)"""
    synthetic_users_per_chunk: int = 2_000
    """users drawn as one Beam element"""

    def __post_init__(self) -> None:
        check(self, at_least={"synthetic_users": 1, "synthetic_items": 1, "synthetic_seed": 0,
                              "synthetic_history_length": 1, "synthetic_users_per_chunk": 1})


@dataclasses.dataclass
class BeamFlags:
    runner: Literal[RUNNERS] = RUNNERS[0]
    """Beam runner: FnApiRunner runs here (direct_running_mode=multi_processing);
    PortableRunner needs --job_endpoint, FlinkRunner --flink_master or --job_endpoint,
    SparkRunner --spark_master_url or --job_endpoint, DataflowRunner --project, --region,
    --temp_location, --sdk_container_image (checked before anything runs)"""
    force_local_root: bool = False
    """with a non-local runner, accept a --pipeline-root (and the data's path) on a local
    filesystem: it is mounted at the same path on every worker"""
    statistics: Annotated[Optional[Literal["exact", "count-min"]], shown(
        "exact; count-min for synthetic")] = None
    """Statistics: exact counts and the sketch, or (synthetic data only) the count-min
    sketch alone, counted per chunk"""
    num_workers: int = DEFAULT_NUM_WORKERS
    """worker processes (direct_num_workers)"""
    num_shards: int = 4
    """TFRecord files of ExampleGen"""
    sketch_depth: int = 4
    """rows of the count-min sketch of Statistics"""
    sketch_width: int = 1 << 20
    """counters per row of the count-min sketch"""
    sketch_seed: int = 0
    """hash seed of the count-min sketch (as CountMinSketch's seed)"""

    def __post_init__(self) -> None:
        check(self, at_least={"num_workers": 1, "num_shards": 1, "sketch_depth": 1,
                              "sketch_width": 1})


@dataclasses.dataclass
class ServingFlags:
    index: Literal[INDEXES] = INDEXES[0]
    """the export's index: scann, faiss (searched by tfrs-logq serve), brute-force (exact,
    stock TensorFlow ops), or auto (scann where ScaNN loads, else faiss where it imports,
    else brute-force)"""
    top_k: Annotated[int, arg(metavar="K")] = 1000
    """items BulkInferrer lists per test target (at least the largest cut-off, 1000, unless
    the catalog is smaller)"""
    thresholds: Annotated[Optional[tuple[str, ...]], arg(name="threshold",
                                                          metavar="METRIC=MIN")] = None
    """bless only if every named overall figure (recall@10, ..., ndcg@20) is at least its
    minimum"""
    baseline: Annotated[Optional[str], arg(metavar="DIR")] = None
    """an Evaluator artifact of the same data (say, the pushed model's, copied aside);
    bless only if no overall figure is below the baseline's by more than
    --baseline-tolerance"""
    baseline_tolerance: float = 0.0
    """how far below the baseline a figure may be"""
    model_base_path: Annotated[Optional[str], arg(
        metavar="DIR", aliases=("--model_base_path",)), shown("none, no Pusher")] = None
    """TF Serving's base path: Pusher copies a blessed export here as the next integer
    version"""

    def __post_init__(self) -> None:
        check(self, at_least={"top_k": 1, "baseline_tolerance": 0})
        if self.thresholds is not None:
            self.thresholds = _thresholds(self.thresholds)


@dataclasses.dataclass
class Flags(Verbose):
    """ExampleGen, Statistics, Trainer, Exporter, BulkInferrer, Evaluator and Pusher into
    --pipeline-root, skipping current components"""

    pipeline_root: Annotated[str, arg(metavar="DIR")]
    """where the components' artifacts go (DIR/ExampleGen, DIR/Statistics, DIR/Trainer,
    ..., each with a manifest.json); current ones are skipped"""
    train_config: Annotated[Optional[str], arg(metavar="FILE")] = None
    """the Trainer's JSON object of other TrainConfig fields (and "preset"), as `train
    --config`; --preset, --loss and --seed override it"""
    stop_after: Literal[COMPONENTS] = COMPONENTS[-1]
    """run the components up to this one (the run exits 3 when the Evaluator ran and did
    not bless the model)"""
    force: bool = False
    """rebuild every component, current or not"""
    json: bool = False
    """print one JSON object"""
    data: Annotated[PipelineSource, arg(name="data (--weight-column: not taken)")] = \
        dataclasses.field(default_factory=PipelineSource)
    split: Annotated[SplitOptions, arg(name="split")] = dataclasses.field(
        default_factory=SplitOptions)
    load: Annotated[PipelineLoadOptions, arg(name="data loading")] = dataclasses.field(
        default_factory=PipelineLoadOptions)
    log: Annotated[LogFilters, arg(name="your log (--interactions)")] = dataclasses.field(
        default_factory=LogFilters)
    synthetic: Annotated[SyntheticFlags, arg(name="--dataset synthetic")] = \
        dataclasses.field(default_factory=SyntheticFlags)
    beam: Annotated[BeamFlags, arg(name=_BEAM)] = dataclasses.field(default_factory=BeamFlags)
    trainer: Annotated[TrainerOptions, arg(name=_TRAINER)] = dataclasses.field(
        default_factory=TrainerOptions)
    serving: Annotated[ServingFlags, arg(name=_SERVING)] = dataclasses.field(
        default_factory=ServingFlags)

    def __post_init__(self) -> None:
        # "" is no path: refused here, not after the data is read ("No such file or
        # directory" naming no flag).
        for flag, path, what in (
                ("--pipeline-root", self.pipeline_root, "a directory"),
                ("--train-config", self.train_config, "a JSON file, or leave the flag out"),
                ("--interactions", self.data.interactions, "a file or directory"),
                ("--data-dir", self.data.data_dir, "a directory, or leave the flag out"),
                ("--baseline", self.serving.baseline, "a directory, or leave the flag out"),
                ("--model-base-path", self.serving.model_base_path,
                 "a directory, or leave the flag out")):
            if path is not None and not path.strip():
                raise ValueError(f"argument {flag}: must not be empty; give {what}")


def _pipeline_input(args) -> tuple[str, str, str]:
    """``(file, format, dataset name)`` of a built-in dataset, found as ``data stats`` finds
    it."""
    from tfrs_logq.pipelines import datasets

    dataset = args.dataset or TrainConfig.dataset
    if dataset == "ml-1m":
        path, fmt = datasets.resolve_ml1m(args.data_dir, args.data_format,
                                          needs_timestamps=args.split == "temporal",
                                          download_ok=args.download)
        return path, fmt, dataset
    path, fmt = datasets.resolve_steam(args.data_dir, download_ok=args.download)
    return path, fmt, dataset


def _user_log(args):
    """The `UserLogSource` of ``--interactions`` and its columns (as ``data stats``)."""
    from tfrs_logq.pipelines.user_log import UserLogSource

    return UserLogSource(args.interactions, args.user_column, args.item_column,
                         time_column=args.time_column, format=args.log_format,
                         skip_bad_lines=args.skip_bad_lines, **bad_share(args))


def _pipeline_train_options(args) -> tuple[str, dict]:
    """``(preset, TrainConfig fields)`` of the Trainer: --train-config, then the flags."""
    options: dict = {}
    if args.train_config:
        options = config_file(args.train_config, "--train-config")
        for name in ("examples", "log_q"):
            if options.pop(name, None) is not None:
                raise ValueError(f"--train-config {args.train_config}: {name} is the pipeline's "
                                 "own artifact; leave it out.")
    preset = args.preset or options.pop("preset", None) or "smoke"
    options.pop("preset", None)
    for name in ("loss", "seed"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return preset, {k: v for k, v in options.items() if v is not None}


def _print_component(result, args) -> None:
    print(f"  {result.line()}")
    manifest = result.manifest
    counts = manifest.get("counts", {})
    if result.name == "ExampleGen":
        skipped = counts.get("skipped_lines", 0)
        print(f"    {counts.get('num_users', 0):,} users, {counts.get('num_items', 0):,} "
              f"items, {counts.get('num_interactions', 0):,} interactions from "
              f"{counts.get('num_rows', 0):,} rows"
              + (f", {skipped:,} malformed lines skipped" if skipped or args.skip_bad_lines
                 else ""))
    elif result.name == "Statistics":
        seen = (f"{counts['items_seen']:,} of {counts.get('num_items', 0):,} items seen"
                if "items_seen" in counts else
                f"{counts.get('num_items', 0):,} items (count-min sketch only)")
        print(f"    {counts.get('train_interactions', 0):,} training interactions, {seen}")
    elif result.name == "Trainer":
        params, test = manifest.get("parameters", {}), counts.get("test", {})
        print(f"    {params.get('loss')}, preset {params.get('preset')}, seed "
              f"{params.get('seed')}: {counts.get('epochs')} epochs (best "
              f"{counts.get('best_epoch')}), test recall@10 {test.get('recall@10', 0):.4f}, "
              f"ndcg@10 {test.get('ndcg@10', 0):.4f}")
    elif result.name == "Exporter":
        print(f"    {counts.get('index_description') or counts.get('index') + ' index'} over "
              f"{counts.get('num_items', 0):,} items: "
              f"{os.path.join(result.directory, counts.get('saved_model', ''))}")
    elif result.name == "BulkInferrer":
        print(f"    top {counts.get('k')} of {counts.get('num_predictions', 0):,} test targets "
              "(seen items left out)")
    elif result.name == "Evaluator":
        from tfrs_logq.pipelines.beam.evaluation import METRICS, describe_blessing

        print("    " + ", ".join(f"{m} {counts.get(m, float('nan')):.4f}" for m in METRICS)
              + f" over {counts.get('num_targets', 0):,} targets")
        print(f"    {describe_blessing(manifest.get('blessing', {'checks': []}))}")
    elif result.name == "Pusher":
        if manifest.get("pushed"):
            print(f"    pushed version {manifest.get('pushed_version')}: "
                  f"{manifest.get('pushed_to')}")
        else:
            print(f"    not pushed: {counts.get('reason')}")


# The flags only a user's log (--interactions) reads.
_LOG_ONLY = ("user_column", "item_column", "time_column", "log_format", "max_bad_share",
             *(f.name for f in dataclasses.fields(LogFilters)))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _refuse_unused(args) -> None:
    """A data flag the chosen source does not read is an error, not ignored (what tyro's
    types and the --dataset/--interactions group cannot say)."""
    defaults = {**{f.name: f.default for f in dataclasses.fields(LogFilters)},
                **{f.name: f.default for f in dataclasses.fields(SyntheticFlags)}}

    def given(name: str) -> bool:
        return getattr(args, name) not in (None, defaults.get(name))

    if args.weight_column is not None:
        raise ValueError("--weight-column: the pipeline's Trainer (SASRec) does not weight "
                         "examples; leave it out (train two-tower weights them).")
    synthetic_flags = [f.name for f in dataclasses.fields(SyntheticFlags) if given(f.name)]
    if args.dataset != "synthetic" and synthetic_flags:
        raise ValueError(f"{_flag(synthetic_flags[0])} is a flag of --dataset synthetic.")
    if args.interactions:
        for name in ("data_dir", "data_format"):
            if given(name):
                raise ValueError(f"{_flag(name)} is --dataset's; --interactions names the log "
                                 "itself (its format: --log-format).")
        for name in ("user_column", "item_column"):
            if not getattr(args, name):
                raise ValueError(f"--interactions needs {_flag(name)}.")
        return
    unused = [n for n in _LOG_ONLY if given(n)]
    if unused:
        raise ValueError(f"{_flag(unused[0])} is a flag of --interactions (your log); "
                         f"--dataset {args.dataset or TrainConfig.dataset + ' (the default)'} "
                         "does not take it.")
    if args.dataset == "steam" and args.data_format is not None:
        raise ValueError("--data-format chooses the file of ml-1m; steam has no such "
                         "choice.")
    if args.dataset != "synthetic":
        return
    taken = [flag for flag, value in (("--split", args.split not in (None, "loo")),
                                      ("--temporal-fraction", args.temporal_fraction),
                                      ("--data-dir", args.data_dir),
                                      ("--data-format", args.data_format),
                                      ("--skip-bad-lines", args.skip_bad_lines)) if value]
    if taken:
        raise ValueError(f"--dataset synthetic draws each user's history, validation and test "
                         f"item (leave-one-out, no file): it takes no {taken[0]}.")


def run(args) -> int:
    _refuse_unused(args)
    # Beam logs through the root logger at import; keep that off the terminal.
    if not logging.getLogger().handlers:
        logging.getLogger().addHandler(logging.NullHandler())
    from tfrs_logq.pipelines.beam.pipeline import run_pipeline

    if args.dataset == "synthetic":
        from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec

        data = {"synthetic": SyntheticSpec(
            num_users=args.synthetic_users, num_items=args.synthetic_items,
            history_length=args.synthetic_history_length, seed=args.synthetic_seed,
            users_per_chunk=args.synthetic_users_per_chunk)}
        path = fmt = "synthetic"
        args.split = "loo"
        if args.stop_after == "Pusher":  # the default: synthetic runs stop after Statistics
            args.stop_after = "Statistics"
    elif args.interactions:
        data = {"user_log": _user_log(args), **{f.name: getattr(args, f.name)
                                                for f in dataclasses.fields(LogFilters)}}
        path, fmt = args.interactions, "user-log"
        args.split = args.split or default_log_split(args.time_column)
    else:
        args.split = args.split or default_split(args.data_format)
        path, fmt, dataset = _pipeline_input(args)
        data = {"input_path": path, "data_format": fmt, "dataset": dataset,
                "skip_bad_lines": args.skip_bad_lines}
    preset, train_options = _pipeline_train_options(args)
    if COMPONENTS.index(args.stop_after) >= COMPONENTS.index("Exporter"):
        from tfrs_logq.serving.indexes import check_index_loads

        check_index_loads(args.index)  # before Beam is imported or ExampleGen runs
    results = run_pipeline(
        args.pipeline_root, split=args.split, **data,
        beam_args=getattr(args, "beam_args", ()), force_local_root=args.force_local_root,
        statistics_mode=args.statistics, temporal_fraction=args.temporal_fraction,
        num_shards=args.num_shards, sketch_depth=args.sketch_depth,
        sketch_width=args.sketch_width, sketch_seed=args.sketch_seed, preset=preset,
        train_options=train_options, index=args.index, top_k=args.top_k,
        thresholds=args.thresholds, baseline=args.baseline,
        baseline_tolerance=args.baseline_tolerance, serving_base_path=args.model_base_path,
        stop_after=args.stop_after, runner=args.runner, num_workers=args.num_workers,
        force=args.force, train_verbose=0 if args.json or not sys.stdout.isatty() else 2)
    if args.json:
        print(json.dumps({"pipeline_root": os.path.abspath(args.pipeline_root),
                          "components": [{"name": r.name, "status": r.status, "reason": r.reason,
                                          "directory": r.directory,
                                          "seconds": round(r.seconds, 2),
                                          **{k: r.manifest[k] for k in
                                             ("blessed", "blessing", "pushed", "pushed_version",
                                              "pushed_to") if k in r.manifest},
                                          "counts": r.manifest.get("counts")}
                                         for r in results]}))
    else:
        split = "leave-one-out" if args.split == "loo" else args.split
        print(f"pipeline {os.path.abspath(args.pipeline_root)}: {path} ({fmt}), split {split}")
        for result in results:
            _print_component(result, args)
    if any(r.name == "Trainer" for r in results):
        warn_if_smoke(preset)
    return _blessing_status(results)


def _blessing_status(results) -> int:
    """0, or `NOT_BLESSED_EXIT` with one line on stderr when the Evaluator ran and did not
    bless the model (so a scheduler sees the run fail; Pusher pushed nothing)."""
    evaluator = [r for r in results if r.name == "Evaluator"]
    if not evaluator or evaluator[0].manifest.get("blessed", True):
        return 0
    from tfrs_logq.pipelines.beam.evaluation import describe_blessing

    print(f"{PROG}: the model is {describe_blessing(evaluator[0].manifest['blessing'])}; "
          "nothing pushed (exit status 3)", file=sys.stderr)
    return NOT_BLESSED_EXIT


