"""``tfrs-logq data stats``: the file a dataset resolves to, its counts and split sizes."""

from __future__ import annotations

import json

from tfrs_logq.cli._common import add_flag, add_verbose, data_record, load_options
from tfrs_logq.cli._dataclass_flags import add_data_flags, train_help, train_value


def populate(p) -> None:
    from tfrs_logq.sasrec.config import TrainConfig

    defaults = TrainConfig()
    group = add_data_flags(p, defaults.dataset, defaults.split)
    from tfrs_logq.pipelines.datasets import DEFAULT_TEMPORAL_FRACTION

    add_flag(group, "temporal-fraction", aliases=("fraction",), dest="temporal_fraction",
             type=train_value("temporal_fraction", float), default=None, metavar="X",
             help=f"{train_help('temporal_fraction')} (default: "
                  + ", ".join(f"{v} for {k}" for k, v in DEFAULT_TEMPORAL_FRACTION.items()) + ")")
    add_flag(p, "json", action="store_true", help="print one JSON object")
    add_verbose(p)
    p.set_defaults(run=run, train_defaults=(defaults.dataset, defaults.split))


def run(args) -> int:
    from tfrs_logq.pipelines.datasets import load_split

    dataset = args.dataset or args.train_defaults[0]
    split_name = args.split or args.train_defaults[1]
    split = load_split(dataset, split_name, args.data_dir, data_format=args.data_format,
                       temporal_fraction=args.temporal_fraction, **load_options(args))
    inter = split.interactions
    result = {"dataset": dataset, "split": split_name, **data_record(inter), **split.stats()}
    if args.json:
        print(json.dumps(result))
        return 0
    tr = result["time_range"]
    skipped = f", {inter.skipped_lines:,} malformed lines skipped" \
        if args.skip_bad_lines or inter.skipped_lines else ""
    print(f"{dataset}, split {split_name}")
    print(f"  source: {inter.source} ({inter.data_format}), {inter.num_rows:,} rows{skipped}")
    print(f"  users {result['num_users']:,}  items {result['num_items']:,}  "
          f"interactions {result['num_interactions']:,}")
    print(f"  time range: {tr[0]} .. {tr[1]}" if tr else "  time range: none (no timestamps)")
    print(f"  train: {result['train']['num_interactions']:,} interactions")
    print(f"  validation: {result['validation']['num_targets']:,} targets")
    print(f"  test: {result['test']['num_targets']:,} targets")
    return 0


