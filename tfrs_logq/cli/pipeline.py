"""``tfrs-logq pipeline run``: the batch pipeline on Apache Beam
(`tfrs_logq.pipelines.beam.pipeline.run_pipeline`). Exits 3, with one line, when its
Evaluator does not bless the model."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Sequence

from tfrs_logq.cli._common import (
    NOT_BLESSED_EXIT,
    PROG,
    add_flag,
    add_verbose,
    float_in,
    int_at_least,
    warn_if_smoke,
)
from tfrs_logq.cli._dataclass_flags import (
    config_file,
    train_help,
    train_value,
)


def _thresholds(metrics: Sequence[str]):
    """``METRIC=MIN,...`` -> ``{metric: min}``."""

    def convert(text: str) -> dict:
        out = {}
        for part in [p.strip() for p in text.split(",") if p.strip()]:
            name, sep, value = part.partition("=")
            if not sep or name.strip() not in metrics:
                raise argparse.ArgumentTypeError(
                    f"{part!r} is not METRIC=MIN with METRIC one of {', '.join(metrics)}")
            try:
                out[name.strip()] = float_in(0.0, None, True)(value.strip())
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{name.strip()}: {exc}") from None
            if out[name.strip()] > 1.0:
                raise argparse.ArgumentTypeError(f"{name.strip()}: must be at most 1, got "
                                                 f"{value.strip()}")
        if not out:
            raise argparse.ArgumentTypeError("must name at least one METRIC=MIN")
        return out

    convert.__name__ = "thresholds"
    return convert


def populate(p) -> None:
    from tfrs_logq.pipelines.beam import COMPONENTS, METRICS, SOURCE_FORMATS
    from tfrs_logq.pipelines.beam.exporter import INDEXES
    from tfrs_logq.pipelines.beam.runner import DEFAULT_NUM_WORKERS, RUNNERS
    from tfrs_logq.pipelines.datasets import DATASETS, DEFAULT_TEMPORAL_FRACTION
    from tfrs_logq.pipelines.splits import SPLITS
    from tfrs_logq.sasrec.config import OBJECTIVES, PRESETS, TrainConfig

    defaults = TrainConfig()
    add_flag(p, "pipeline-root", required=True, metavar="DIR",
             help="where the components' artifacts go (DIR/ExampleGen, DIR/Statistics, "
                  "DIR/Trainer, ..., each with a manifest.json); current ones are skipped")
    group = p.add_argument_group("data")
    add_flag(group, "dataset", choices=(*DATASETS, "synthetic"), default=None,
             help=f"dataset (default: {defaults.dataset}; with --input, none); synthetic draws "
                  "the synthetic stream's model in the workers (--synthetic-*; ExampleGen and "
                  "Statistics only)")
    add_flag(group, "data-dir", default=None, metavar="DIR",
             help=f"{train_help('data_dir')} (default: $TFRS_LOGQ_DATA_DIR, else the download "
                  "cache)")
    add_flag(group, "input", default=None, metavar="FILE",
             help="read this file instead of finding the dataset's (needs --data-format) "
                  "(default: none)")
    add_flag(group, "data-format", aliases=("format",), choices=SOURCE_FORMATS,
             default=None,
             help="the file's format: ratings (user::item::rating::ts), sasrec (user item), csv "
                  "(user,item,timestamp) or steam (Steam reviews) (default: for ml-1m whichever "
                  "the data directory holds)")
    add_flag(group, "split", choices=SPLITS, default=defaults.split,
             help=train_help("split"))
    add_flag(group, "temporal-fraction", aliases=("fraction",), dest="temporal_fraction",
             type=train_value("temporal_fraction", float), default=None, metavar="X",
             help=f"{train_help('temporal_fraction')} (default: "
                  + ", ".join(f"{v} for {k}" for k, v in DEFAULT_TEMPORAL_FRACTION.items())
                  + ", else 0.1)")
    add_flag(group, "skip-bad-lines", action="store_true",
             help="drop malformed lines of the data file and count them in the manifest")
    add_flag(group, "no-download", action="store_true",
             help="never download; fail when no local copy exists")
    synthetic = p.add_argument_group("--dataset synthetic")
    add_flag(synthetic, "synthetic-users", type=int_at_least(1), default=10_000, metavar="N",
             help="users (each: the history, a validation and a test item)")
    add_flag(synthetic, "synthetic-items", type=int_at_least(1), default=5_000, metavar="N",
             help="items (Zipf popularity in 50 topics)")
    add_flag(synthetic, "synthetic-history-length", type=int_at_least(1), default=20,
             metavar="N", help="training items per user")
    add_flag(synthetic, "synthetic-seed", type=int_at_least(0), default=0, metavar="N",
             help="seed of every draw (the same seed gives the same artifacts on any number "
                  "of workers)")
    add_flag(synthetic, "synthetic-users-per-chunk", type=int_at_least(1), default=2_000,
             metavar="N", help="users drawn as one Beam element")
    beam = p.add_argument_group("beam (Beam's own flags go after --: tfrs-logq pipeline run "
                                "... --runner DataflowRunner -- --project P --region R "
                                "--temp_location gs://B/tmp --sdk_container_image IMAGE)")
    add_flag(beam, "runner", choices=RUNNERS, default=RUNNERS[0],
             help="Beam runner: FnApiRunner runs here (direct_running_mode=multi_processing); "
                  "PortableRunner needs --job_endpoint, FlinkRunner --flink_master or "
                  "--job_endpoint, SparkRunner --spark_master_url or --job_endpoint, "
                  "DataflowRunner --project, --region, --temp_location, --sdk_container_image "
                  "(checked before anything runs)")
    add_flag(beam, "force-local-root", action="store_true",
             help="with a non-local runner, accept a --pipeline-root (and --input) on a local "
                  "filesystem: it is mounted at the same path on every worker")
    add_flag(beam, "statistics", choices=("exact", "count-min"), default=None,
             help="Statistics: exact counts and the sketch, or (synthetic data only) the "
                  "count-min sketch alone, counted per chunk (default: exact; count-min for "
                  "synthetic)")
    add_flag(beam, "num-workers", type=int_at_least(1), default=DEFAULT_NUM_WORKERS, metavar="N",
             help="worker processes (direct_num_workers)")
    add_flag(beam, "num-shards", type=int_at_least(1), default=4, metavar="N",
             help="TFRecord files of ExampleGen")
    add_flag(beam, "sketch-depth", type=int_at_least(1), default=4, metavar="N",
             help="rows of the count-min sketch of Statistics")
    add_flag(beam, "sketch-width", type=int_at_least(1), default=1 << 20, metavar="N",
             help="counters per row of the count-min sketch")
    add_flag(beam, "sketch-seed", type=int, default=0, metavar="N",
             help="hash seed of the count-min sketch (as CountMinSketch's seed)")
    training = p.add_argument_group("Trainer (tfrs-logq train --examples DIR/ExampleGen "
                                    "--log-q DIR/Statistics)")
    add_flag(training, "preset", choices=tuple(PRESETS), default=None,
             help="training preset: smoke trains for seconds to minutes on 2 CPU cores (what "
                  "`make pipeline` runs: a check of the pipeline, not a usable model); cpu or "
                  "long train a usable model in hours (default: smoke)")
    add_flag(training, "loss", choices=OBJECTIVES, default=None,
             help=f"{train_help('loss')} (default: {defaults.loss})")
    add_flag(training, "seed", type=train_value("seed", int), default=None, metavar="N",
             help=f"{train_help('seed')} (default: {defaults.seed})")
    add_flag(training, "train-config", default=None, metavar="FILE",
             help="JSON object of other TrainConfig fields (and \"preset\"), as `train --config`; "
                  "--preset, --loss and --seed override it (default: none)")
    serving = p.add_argument_group("Exporter, BulkInferrer, Evaluator, Pusher")
    add_flag(serving, "index", choices=INDEXES, default=INDEXES[0],
             help="the export's index: scann, or brute-force (exact, stock TensorFlow ops)")
    add_flag(serving, "top-k", type=int_at_least(1), default=1000, metavar="K",
             help="items BulkInferrer lists per test target (at least the largest cut-off, 1000, "
                  "unless the catalog is smaller)")
    add_flag(serving, "threshold", dest="thresholds", type=_thresholds(METRICS), default=None,
             metavar="METRIC=MIN,...",
             help=f"bless only if every named overall figure ({', '.join(METRICS)}) is at least "
                  "its minimum (default: none)")
    add_flag(serving, "baseline", default=None, metavar="DIR",
             help="an Evaluator artifact of the same data (say, the pushed model's, copied "
                  "aside); bless only if no overall figure is below the baseline's by more than "
                  "--baseline-tolerance (default: none)")
    add_flag(serving, "baseline-tolerance", type=float_in(0.0, None, True), default=0.0,
             metavar="X", help="how far below the baseline a figure may be")
    add_flag(serving, "serving-base-path", default=None, metavar="DIR",
             help="Pusher copies a blessed export here as the next integer version (TF "
                  "Serving's --model_base_path) (default: none, no Pusher)")
    add_flag(p, "stop-after", choices=COMPONENTS, default=COMPONENTS[-1],
             help="run the components up to this one (the run exits 3 when the Evaluator ran "
                  "and did not bless the model)")
    add_flag(p, "force", action="store_true", help="rebuild every component, current or not")
    add_flag(p, "json", action="store_true", help="print one JSON object")
    add_verbose(p)
    p.set_defaults(run=run, train_defaults=(defaults.dataset, defaults.split))


def _pipeline_input(args) -> tuple[str, str, str]:
    """``(file, format, dataset name)`` of ``pipeline run``, found as ``data stats`` finds it."""
    from tfrs_logq.pipelines import datasets

    if args.input is not None:
        if args.data_format is None:
            raise ValueError("--input needs --data-format (one of ratings, sasrec, csv, "
                             "steam).")
        if not os.path.isfile(args.input):
            raise FileNotFoundError(f"--input {args.input}: no such file")
        return args.input, args.data_format, args.dataset or ""
    dataset = args.dataset or args.train_defaults[0]
    if dataset == "ml-1m":
        if args.data_format not in (None, *datasets.ML1M_FORMATS):
            raise ValueError(f"--data-format for ml-1m is one of {datasets.ML1M_FORMATS}; "
                             f"use --input FILE for a {args.data_format} file.")
        path, fmt = datasets.resolve_ml1m(args.data_dir, args.data_format,
                                          needs_timestamps=args.split == "temporal",
                                          download_ok=not args.no_download)
        return path, fmt, dataset
    if args.data_format is not None:
        raise ValueError(f"--data-format chooses the file of ml-1m or of --input; {dataset} "
                         "has no such choice.")
    path, fmt = datasets.resolve_steam(args.data_dir, download_ok=not args.no_download)
    return path, fmt, dataset


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
        print(f"    {counts.get('index')} index over {counts.get('num_items', 0):,} items: "
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


def run(args) -> int:
    # Beam logs through the root logger at import; keep that off the terminal.
    if not logging.getLogger().handlers:
        logging.getLogger().addHandler(logging.NullHandler())
    from tfrs_logq.pipelines.beam.pipeline import run_pipeline

    synthetic = None
    if args.dataset == "synthetic":
        from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec

        if args.input is not None or args.data_format is not None:
            raise ValueError("--dataset synthetic draws its data; it takes no --input or "
                             "--data-format.")
        synthetic = SyntheticSpec(
            num_users=args.synthetic_users, num_items=args.synthetic_items,
            history_length=args.synthetic_history_length, seed=args.synthetic_seed,
            users_per_chunk=args.synthetic_users_per_chunk)
        path, fmt, dataset = "synthetic", "synthetic", "synthetic"
        if args.stop_after == "Pusher":  # the default: synthetic runs stop after Statistics
            args.stop_after = "Statistics"
    else:
        path, fmt, dataset = _pipeline_input(args)
    preset, train_options = _pipeline_train_options(args)
    results = run_pipeline(
        args.pipeline_root, path, fmt, split=args.split, dataset=dataset,
        beam_args=getattr(args, "beam_args", ()), force_local_root=args.force_local_root,
        synthetic=synthetic, statistics_mode=args.statistics,
        skip_bad_lines=args.skip_bad_lines, temporal_fraction=args.temporal_fraction,
        num_shards=args.num_shards, sketch_depth=args.sketch_depth,
        sketch_width=args.sketch_width, sketch_seed=args.sketch_seed, preset=preset,
        train_options=train_options, index=args.index, top_k=args.top_k,
        thresholds=args.thresholds, baseline=args.baseline,
        baseline_tolerance=args.baseline_tolerance, serving_base_path=args.serving_base_path,
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
        split = "leave-one-out" if args.dataset == "synthetic" else args.split
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


