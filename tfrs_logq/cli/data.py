"""``tfrs-logq data stats``: the file a dataset resolves to, its counts and split sizes."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal, Optional

from tyro.conf import arg

from tfrs_logq.cli._common import (
    LoadOptions,
    bad_share,
    default_log_split,
    default_split,
    load_options,
)
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.pipelines.source import DataSource, LogFilters
from tfrs_logq.pipelines.splits import SPLITS


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
class Flags(Verbose):
    """the file used, users, items, interactions and split sizes"""

    json: bool = False
    """print one JSON object"""
    data: Annotated[DataSource, arg(name="data")] = dataclasses.field(
        default_factory=DataSource)
    split: Annotated[SplitOptions, arg(name="split")] = dataclasses.field(
        default_factory=SplitOptions)
    load: Annotated[LoadOptions, arg(name="data loading")] = dataclasses.field(
        default_factory=LoadOptions)
    log: Annotated[LogFilters, arg(name="your log (--interactions)")] = dataclasses.field(
        default_factory=LogFilters)


def load_any_split(args):
    """``(split, name)`` of ``--interactions`` (a user's log: its base name) or of the
    built-in ``--dataset``; the one loader of `data stats`, and of `compare` (whose
    preprocessing flags, where a command has them, are passed on)."""
    if getattr(args, "interactions", None):
        import os

        from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split

        for flag, value in (("--data-dir", getattr(args, "data_dir", None)),
                            ("--data-format", getattr(args, "data_format", None))):
            if value:
                raise ValueError(f"{flag} is --dataset's; --interactions names the log itself "
                                 "(its format: --log-format).")
        for flag, value in (("--user-column", args.user_column),
                            ("--item-column", args.item_column)):
            if not value:
                raise ValueError(f"--interactions needs {flag}.")
        source = UserLogSource(args.interactions, args.user_column, args.item_column,
                               time_column=args.time_column,
                               weight_column=getattr(args, "weight_column", None),
                               format=args.log_format, skip_bad_lines=args.skip_bad_lines,
                               **bad_share(args))
        split_name = args.split or default_log_split(args.time_column)
        knobs = {k: getattr(args, k) for k in ("min_item_interactions", "min_user_interactions",
                                               "deduplicate") if hasattr(args, k)}
        split = load_user_log_split(source, split_name,
                                    temporal_fraction=getattr(args, "temporal_fraction", None),
                                    **knobs)
        return split, os.path.basename(os.path.normpath(args.interactions))
    from tfrs_logq.pipelines.datasets import load_split
    from tfrs_logq.sasrec.config import TrainConfig

    if getattr(args, "max_bad_share", None) is not None:
        raise ValueError("--max-bad-share bounds what --skip-bad-lines skips of --interactions "
                         "(your log); a built-in dataset has no such bound: leave it out.")
    if getattr(args, "weight_column", None):
        raise ValueError("--weight-column names a column of --interactions (your log); the "
                         "built-in datasets have no weight column.")
    dataset = args.dataset or TrainConfig.dataset
    split_name = args.split or default_split(getattr(args, "data_format", None))
    return load_split(dataset, split_name, args.data_dir,
                      data_format=getattr(args, "data_format", None),
                      temporal_fraction=getattr(args, "temporal_fraction", None),
                      **(load_options(args) if hasattr(args, "cache") else
                         {"skip_bad_lines": bool(getattr(args, "skip_bad_lines", False))})), dataset


def time_range_text(first: int, last: int, unit: str = "seconds") -> str:
    """The range as UTC dates (``0001-01-01 00:00:00``, four-digit years), the times read
    in ``unit`` (`tfrs_logq.pipelines.interactions.EPOCH_UNITS`), the log's own."""
    import datetime

    from tfrs_logq.pipelines.interactions import UNIT_PER_SECOND

    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    try:
        shown = [epoch + datetime.timedelta(microseconds=v * 10**6 // UNIT_PER_SECOND[unit])
                 for v in (first, last)]
    except (OverflowError, ValueError):
        return f"{first} .. {last} (epoch {unit}, outside the years 1 to 9999)"
    text = [f"{d.year:04d}-{d.month:02d}-{d.day:02d} {d.hour:02d}:{d.minute:02d}:"
            f"{d.second:02d}" for d in shown]
    return f"{text[0]} .. {text[1]} UTC" + ("" if unit == "seconds" else
                                            f" (the times are epoch {unit})")


def run(args) -> int:
    from tfrs_logq.pipelines.splits import data_stats

    if not getattr(args, "interactions", None):
        given = [n for n in ("min_item_interactions", "min_user_interactions", "deduplicate")
                 if getattr(args, n) != getattr(LogFilters, n)]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} filters --interactions (your "
                             f"log); a built-in dataset is preprocessed as its papers do.")

    split, dataset = load_any_split(args)
    inter = split.interactions
    result = data_stats(split, dataset)  # the same keys for a built-in dataset and a log
    split_name = split.name
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
    print(f"  time range: {time_range_text(*tr, result['time_unit'])}" if tr
          else "  time range: none (no timestamps)")
    dup = result["duplicates"]
    print(f"  duplicates: {dup['rows']:,} rows repeat an earlier row exactly; {dup['pairs']:,} "
          f"repeat an earlier (user, item) pair (--deduplicate keeps the first)")
    print(f"  train: {result['train']['num_interactions']:,} interactions")
    print(f"  validation: {result['validation']['num_targets']:,} targets")
    test = result["test"]
    print(f"  test: {test['num_targets']:,} targets of {test['num_users']:,} users; repeat "
          f"targets {test['repeat_share']:.3f}, cold targets {test['cold_share']:.3f}")
    if "weights" in result:
        w = result["weights"]
        print(f"  weights: min {w['min']:.6g}, mean {w['mean']:.6g}, max {w['max']:.6g}, "
              f"{w['zeros']:,} zero")
    return 0
