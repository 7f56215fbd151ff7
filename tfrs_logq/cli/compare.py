"""``tfrs-logq compare``: standard against corrected logQ on your own log, paired by seed
(`tfrs_logq.studies.compare`)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated, Literal, Optional

from tyro.conf import Suppress, arg

from tfrs_logq.cli._common import default_log_split
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.pipelines.source import DataSource, LogFilters
from tfrs_logq.studies._grid import check_output_dir
from tfrs_logq.towers.config import TwoTowerConfig


@dataclasses.dataclass(frozen=True)
class TwoTowerFlags(TwoTowerConfig):
    """Each run's `TwoTowerConfig` (--loss and --seeds list the runs'): --steps,
    --eval-every and --exclude-seen for every model, --batch-size and --history-length for
    --model-fn too, the others for the two-tower alone."""

    loss: Suppress[str] = TwoTowerConfig.loss
    seed: Suppress[int] = TwoTowerConfig.seed


@dataclasses.dataclass
class CompareFlags(Verbose):
    """standard against corrected logQ on your own log: paired seeds, intervals, a verdict"""

    split: Annotated[Optional[Literal["temporal", "loo", "gsasrec"]], shown(
        "temporal; loo for a log without --time-column")] = None
    """the evaluation split (temporal needs --time-column)"""
    model: Literal["two-tower", "sasrec"] = "two-tower"
    """the model family"""
    model_fn: Annotated[Optional[str], arg(metavar="MODULE:FUNCTION"), shown(
        "none: --model")] = None
    """your own TFRS model instead of --model: a function model_fn(task) returning a
    compiled tfrs.Model whose compute_loss returns task(...) with candidate_ids; trained on
    your log's {"user_id", "item_id"} examples (text ids), the module looked up from the
    current directory too (docs/compare.md)"""
    query_model: str = "query_model"
    """--model-fn: the model's attribute that embeds a query (called with user ids)"""
    candidate_model: str = "candidate_model"
    """--model-fn: the model's attribute that embeds a candidate (called with item ids)"""
    loss: tuple[str, ...] = ("inbatch-logq-tfrs", "inbatch-logq-official", "inbatch-corrected")
    """the losses compared (the first is the baseline unless --baseline); two-tower:
    inbatch|mns x none|logq-tfrs|logq-official|corrected"""
    baseline: Annotated[Optional[str], shown("the first of --loss")] = None
    """the loss the others are paired against"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """seeds: one pair per seed"""
    window: Annotated[Optional[int], shown("3, or every evaluation when fewer")] = None
    """a run's result: the mean of its last this many evaluations"""
    preset: Literal["smoke", "cpu", "long", "fixed", "paper"] = "cpu"
    """SASRec's architecture (--model sasrec); --steps, --eval-every and --window replace
    its epochs"""
    temporal_fraction: Annotated[Optional[float], arg(metavar="F"), shown("0.1")] = None
    """--split temporal: the latest this fraction of interactions is the test split"""
    margin: Annotated[str, arg(metavar="M")] = "0.002"
    """the equivalence margin: an interval inside ±M reads "no difference larger than
    M"; an absolute difference (0.002) or a percentage of the reference's value (2%)"""
    primary_metric: Annotated[Optional[str], arg(metavar="METRIC"), shown("recall@100")] = None
    """the primary comparison's metric, named before the runs (recall@K or K): the
    verdict's first sentence answers it at 5 %, the others are secondary (Holm)"""
    primary_baseline: Annotated[Optional[str], arg(metavar="LOSS"),
                                shown("logq-tfrs, else --baseline")] = None
    """the loss you run now, which the corrected loss is judged against (a loss of
    --loss or its form, logq-tfrs)"""
    report_only: bool = False
    """rebuild report.md and the charts from --output-dir's results.csv (no training)"""
    output_dir: Annotated[str, arg(metavar="DIR")] = "compare_output"
    """results.csv, curves.csv, report.md and the charts go here"""
    max_runs: Annotated[Optional[int], shown("all")] = None
    """train at most N unfinished runs, then stop (a rerun goes on)"""
    json: bool = False
    """print one JSON object (the plan and the results' rows); progress goes to stderr"""
    skip_bad_lines: bool = False
    """--interactions: skip malformed rows and count them (default: the first one is an
    error)"""
    max_bad_share: Annotated[Optional[float], arg(metavar="S"), shown("0.01")] = None
    """with --skip-bad-lines, the largest share of your log's lines it may skip; more is an
    error"""
    served_index: bool = True
    """measure the index `export --index auto` would serve (ScaNN, else faiss) on the final
    model of each loss at the first seed: the report says how far a served Recall@k can
    move from its exact figure (--no-served-index: skip it)"""
    data: Annotated[DataSource, arg(name="data")] = dataclasses.field(
        default_factory=DataSource)
    filters: Annotated[LogFilters, arg(name="your log (--interactions)")] = dataclasses.field(
        default_factory=LogFilters)
    model_config: Annotated[TwoTowerFlags, arg(name="model")] = dataclasses.field(
        default_factory=TwoTowerFlags)

    def __post_init__(self) -> None:
        check(self, at_least={"seeds": 0, "window": 1, "max_runs": 0},
              above={"temporal_fraction": 0},
              at_most={"seeds": 2**32 - 1, "max_bad_share": 1})


Flags = CompareFlags


def run(args) -> int:
    from tfrs_logq.studies.compare import Plan, run_compare
    from tfrs_logq.studies.compare_report import Margin
    from tfrs_logq.towers.config import TwoTowerConfig

    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else \
        (lambda m: print(m, flush=True))
    margin = Margin(args.margin)
    check_output_dir(args.output_dir)
    if args.report_only:
        from tfrs_logq.studies.compare import report_only

        ignored = [n for n in ("interactions", "dataset", "loss", "seeds", "model", "steps",
                               "baseline", "window", "exclude_seen", "model_fn",
                               "served_index")
                   if getattr(args, n) != _default(n)]
        if ignored:
            raise ValueError(f"--report-only rebuilds the report of --output-dir from its "
                             f"results.csv and plan.json, and takes --margin and --primary-* "
                             f"only; "
                             f"--{ignored[0].replace('_', '-')} belongs to a comparison run.")
        text = report_only(args.output_dir, say=say, margin=margin,
                           primary=(args.primary_metric, args.primary_baseline))
        if args.json:
            print(json.dumps({"output_dir": args.output_dir, "report": text}))
        return 0
    if args.model_fn:
        return _run_model_fn(args, say, margin)
    unused = [n for n in _MODEL_FN_ONLY if getattr(args, n) != _default(n)]
    if unused:
        raise ValueError(f"--{unused[0].replace('_', '-')} is a flag of --model-fn (your own "
                         f"model).")
    if args.model == "sasrec" and not args.exclude_seen:
        raise ValueError("--no-exclude-seen is a two-tower flag: SASRec is evaluated "
                         "exclude-seen, as its export serves by default.")
    config = TwoTowerConfig(**{**dataclasses.asdict(args.flags.model_config), "loss": (
        "inbatch-corrected" if args.model == "sasrec" else args.loss[0])})
    from tfrs_logq.cli.data import load_any_split

    if bool(args.interactions) == bool(args.dataset):
        raise ValueError("give either --interactions (with --user-column and --item-column) "
                         "or --dataset.")
    _refuse_unused(args)
    if args.split is None:  # as `train` and `data stats`: a log without times has no temporal
        args.split = default_log_split(args.time_column) if args.interactions else "temporal"
    # The plan is checked (losses, baseline, window) before the data is read.
    window = args.window or min(3, len(config.eval_steps))
    plan = Plan(losses=tuple(args.loss), seeds=tuple(args.seeds), config=config,
                window=window, baseline=args.baseline or "", model=args.model,
                sasrec_preset=args.preset)
    split, name = load_any_split(args)
    plan = dataclasses.replace(
        plan, source=f"{name}, split {args.split}"
        + (f", weighted by {args.weight_column}" if args.weight_column else ""),
        data=_data_identity(args, split))
    rows = run_compare(plan, split, args.output_dir, say=say, max_runs=args.max_runs,
                       margin=margin, primary=(args.primary_metric, args.primary_baseline),
                       served_index=_served_index(args))
    if args.json:
        from tfrs_logq.studies.compare import load_plan

        plan = load_plan(args.output_dir)  # the seeds and losses of every run of the directory
        print(json.dumps({"output_dir": args.output_dir, "plan": plan.fixed_fields(),
                          "losses": list(plan.losses), "seeds": list(plan.seeds),
                          "results": rows}))
    return 0


def _run_model_fn(args, say, margin) -> int:
    """``--model-fn``: the user's own TFRS model on the log (`tfrs_logq.compare_model`)."""
    from tfrs_logq.cli.data import load_any_split
    from tfrs_logq.studies.user_model import compare_split, load_model_fn

    given = [n for n in ("model", "preset", *_TWO_TOWER_ONLY)
             if n not in _MODEL_FN_TAKES and getattr(args, n) != _default(n)]
    if given:
        raise ValueError(f"{_flag(given[0])} is a flag of the built-in models; "
                         f"with --model-fn your model_fn builds the model (and compiles "
                         f"its optimizer).")
    if args.weight_column:
        raise ValueError("--weight-column weights the built-in two-tower's loss; --model-fn "
                         "trains your model unweighted: leave it out.")
    if bool(args.interactions) == bool(args.dataset):
        raise ValueError("give either --interactions (with --user-column and --item-column) "
                         "or --dataset.")
    _refuse_unused(args)
    model_fn = load_model_fn(args.model_fn, "--model-fn")  # before the log is read
    if args.split is None:
        args.split = default_log_split(args.time_column) if args.interactions else "temporal"
    split, name = load_any_split(args)
    rows = compare_split(
        model_fn, split, history_length=args.history_length, exclude_seen=args.exclude_seen,
        data_identity=_data_identity(args, split), model_fn_flag="--model-fn",
        query_model=args.query_model, candidate_model=args.candidate_model,
        losses=tuple(args.loss), seeds=tuple(args.seeds), steps=args.steps,
        eval_every=args.eval_every, window=args.window, batch_size=args.batch_size,
        baseline=args.baseline, output_dir=args.output_dir, margin=margin,
        primary_metric=args.primary_metric, primary_baseline=args.primary_baseline,
        max_runs=args.max_runs, source=f"{name}, split {args.split}", say=say,
        served_index=_served_index(args))
    if args.json:
        from tfrs_logq.studies.compare import load_plan

        plan = load_plan(args.output_dir)
        print(json.dumps({"output_dir": args.output_dir, "plan": plan.fixed_fields(),
                          "losses": list(plan.losses), "seeds": list(plan.seeds),
                          "results": rows}))
    return 0


def _served_index(args):
    """The hook measuring the index `export --index auto` would serve, unless
    --no-served-index (`tfrs_logq.serving.served_recall`)."""
    if not args.served_index:
        return None
    from tfrs_logq.serving.served_recall import served_recall

    return served_recall


# The flags only a user's log takes (their defaults), and those only the two-tower takes.
_LOG_ONLY = ("user_column", "item_column", "time_column", "weight_column", "log_format",
             "min_item_interactions", "min_user_interactions", "deduplicate")
_TWO_TOWER_ONLY = ("batch_size", "embedding_dim", "history_length", "num_negatives",
                   "learning_rate", "optimizer")
# What --model-fn takes of those (the batch, the history a request sends), and its own.
_MODEL_FN_TAKES = ("batch_size", "history_length")
_MODEL_FN_ONLY = ("query_model", "candidate_model")


def _flag(name: str) -> str:
    """The flag of a field (TwoTowerConfig's num_negatives is --uniform-negatives)."""
    return "--" + {"num_negatives": "uniform_negatives"}.get(name, name).replace("_", "-")


def _default(name: str):
    """The default of a flag of compare's dataclasses."""
    for flags_class in (DataSource, LogFilters, CompareFlags, TwoTowerFlags):
        if name in flags_class.__dataclass_fields__:
            field = flags_class.__dataclass_fields__[name]
            return (field.default_factory() if field.default is dataclasses.MISSING
                    else field.default)
    raise KeyError(name)


def _refuse_unused(args) -> None:
    """A flag the chosen data source or model does not read is an error, not ignored."""
    def given(name):
        return getattr(args, name) != _default(name)

    if args.dataset:
        unused = [n for n in _LOG_ONLY if given(n)]
        if unused:
            raise ValueError(f"--{unused[0].replace('_', '-')} is a flag of --interactions "
                             f"(your log); --dataset {args.dataset} does not take it.")
    if args.model == "sasrec":
        unused = [n for n in _TWO_TOWER_ONLY if given(n)]
        if unused:
            raise ValueError(f"{_flag(unused[0])} is a two-tower flag; "
                             f"--model sasrec takes its model from --preset.")


def _data_identity(args, split) -> dict:
    """What makes two runs' data the same: the file (absolute path) or dataset, every
    preprocessing flag, the split and its fraction, the split's size and a hash of its
    arrays (a file edited in place differs there, whatever its size)."""
    import os

    inter = split.interactions
    identity = {"path": os.path.abspath(args.interactions) if args.interactions else None,
                "dataset": args.dataset, "split": args.split,
                "data_dir": os.path.abspath(args.data_dir) if args.data_dir else None,
                "rows": int(inter.num_rows), "interactions": int(len(inter)),
                "users": int(inter.num_users), "items": int(inter.num_items),
                "skipped_lines": int(inter.skipped_lines)}
    identity.update({n: getattr(args, n) for n in _LOG_ONLY})
    from tfrs_logq.pipelines import datasets, user_log
    from tfrs_logq.studies.compare import split_fingerprint

    default = (datasets.DEFAULT_TEMPORAL_FRACTION[args.dataset] if args.dataset
               else user_log.DEFAULT_TEMPORAL_FRACTION)  # as the loaders resolve None
    identity["temporal_fraction"] = ((args.temporal_fraction or default)
                                     if args.split == "temporal" else None)
    identity["fingerprint"] = split_fingerprint(split)
    if args.interactions and args.log_format == inter.data_format:  # as the extensions say
        identity["log_format"] = None
    return identity
