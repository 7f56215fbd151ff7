"""``tfrs-logq compare``: standard against corrected logQ on your own log, paired by seed
(`tfrs_logq.studies.compare`), with the built-in two-tower model (``compare two-tower``, the
default), SASRec (``compare sasrec``) or your own TFRS model (``compare tfrs-model
--model-fn MODULE:FUNCTION``)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Annotated, Literal, Optional, Union

from tyro.conf import Suppress, arg, subcommand

from tfrs_logq.cli._common import default_log_split
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.pipelines.source import DataSource, LogFilters
from tfrs_logq.studies._grid import check_output_dir
from tfrs_logq.towers.config import TwoTowerConfig


@dataclasses.dataclass(frozen=True)
class TwoTowerFlags(TwoTowerConfig):
    """the built-in two-tower model (the default): each run's TwoTowerConfig (--loss and
    --seeds list the runs')"""

    loss: Suppress[str] = TwoTowerConfig.loss
    seed: Suppress[int] = TwoTowerConfig.seed


@dataclasses.dataclass
class SASRecFlags:
    """SASRec with the paper's losses (tfrs-logq train's names): its architecture from
    --preset; --steps, --eval-every and --window replace the preset's epochs"""

    preset: Literal["smoke", "cpu", "long", "fixed", "paper"] = "cpu"
    """SASRec's architecture"""
    steps: int = TwoTowerConfig.steps
    """training steps (fixed: no early stopping)"""
    eval_every: int = TwoTowerConfig.eval_every
    """evaluate the test split every this many steps (and at the last step)"""

    def __post_init__(self) -> None:
        check(self, at_least={"steps": 1, "eval_every": 1})


@dataclasses.dataclass
class TFRSModelFlags:
    """your own TFRS model (docs/compare.md): a function model_fn(task) returning a compiled
    tfrs.Model whose compute_loss returns task(...) with candidate_ids; trained on your log's
    {"user_id", "item_id"} examples (text ids)"""

    model_fn: Annotated[str, arg(metavar="MODULE:FUNCTION")]
    """the function building your model, its module looked up from the current directory
    too"""
    query_model: str = "query_model"
    """the model's attribute that embeds a query (called with user ids)"""
    candidate_model: str = "candidate_model"
    """the model's attribute that embeds a candidate (called with item ids)"""
    steps: int = TwoTowerConfig.steps
    """training steps (fixed: no early stopping)"""
    batch_size: int = TwoTowerConfig.batch_size
    """training examples per step"""
    history_length: int = TwoTowerConfig.history_length
    """the history a test request sends: its last this many items, left out of the ranking
    with --exclude-seen"""
    eval_every: int = TwoTowerConfig.eval_every
    """evaluate the test split every this many steps (and at the last step)"""
    exclude_seen: bool = TwoTowerConfig.exclude_seen
    """the evaluation policy, as the served top_k's exclude_history: leave the items of the
    history a request sends out of the ranking (off: they are ranked)"""

    def __post_init__(self) -> None:
        check(self, at_least={"steps": 1, "eval_every": 1, "batch_size": 2,
                              "history_length": 1})


# The model a comparison trains: the subcommand, named as the plan names it.
MODELS = {TwoTowerFlags: "two-tower", SASRecFlags: "sasrec", TFRSModelFlags: "tfrs-model"}


@dataclasses.dataclass
class CompareFlags(Verbose):
    """standard against corrected logQ on your own log: paired seeds, intervals, a verdict"""

    split: Annotated[Optional[Literal["temporal", "loo", "gsasrec"]], shown(
        "temporal; loo for a log without --time-column")] = None
    """the evaluation split (temporal needs --time-column)"""
    loss: tuple[str, ...] = ("inbatch-logq-tfrs", "inbatch-logq-official", "inbatch-corrected")
    """the losses compared (the first is the baseline unless --baseline); two-tower:
    inbatch|mns x none|logq-tfrs|logq-official|corrected"""
    baseline: Annotated[Optional[str], shown("the first of --loss")] = None
    """the loss the others are paired against"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """seeds: one pair per seed"""
    window: Annotated[Optional[int], shown("3, or every evaluation when fewer")] = None
    """a run's result: the mean of its last this many evaluations"""
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
    run_index: Annotated[Optional[str], arg(metavar="I"), shown(
        "JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID where set, else every run")] = None
    """spread the comparison over --run-count processes sharing --output-dir: this one
    trains run k of the plan (seed by seed, the losses in order) where k mod N is I
    (docs/compare.md, Across machines)"""
    run_count: Annotated[Optional[str], arg(metavar="N"), shown(
        "TFRS_LOGQ_RUN_COUNT or SLURM_ARRAY_TASK_COUNT where set")] = None
    """the number of processes sharing the comparison (with --run-index, or a scheduler's
    index)"""
    json: bool = False
    """print one JSON object (the plan and the results' rows); progress goes to stderr"""
    skip_bad_lines: bool = False
    """--interactions: skip malformed rows and count them (default: the first one is an
    error)"""
    max_bad_share: Annotated[Optional[float], arg(metavar="S"), shown("0.01")] = None
    """with --skip-bad-lines, the largest share of your log's lines it may skip; more is an
    error"""
    mlflow: bool = False
    """also log the comparison to MLflow (MLFLOW_TRACKING_URI; the mlflow extra): a parent
    run, a child run a loss and seed (on when MLFLOW_TRACKING_URI is set)"""
    served_index: bool = True
    """measure the index `export --index auto` would serve (ScaNN, else faiss) on the final
    model of each loss at the first seed: the report says how far a served Recall@k can
    move from its exact figure (--no-served-index: skip it)"""
    data: Annotated[DataSource, arg(name="data")] = dataclasses.field(
        default_factory=DataSource)
    filters: Annotated[LogFilters, arg(name="your log (--interactions)")] = dataclasses.field(
        default_factory=LogFilters)
    model: Union[
        Annotated[TwoTowerFlags, subcommand("two-tower")],
        Annotated[SASRecFlags, subcommand("sasrec")],
        Annotated[TFRSModelFlags, subcommand("tfrs-model")],
    ] = dataclasses.field(default_factory=TwoTowerFlags)

    def __post_init__(self) -> None:
        check(self, at_least={"seeds": 0, "window": 1, "max_runs": 0},
              above={"temporal_fraction": 0},
              at_most={"seeds": 2**32 - 1, "max_bad_share": 1})
        for name in ("seeds", "loss"):  # a run named twice would be one run, silently
            values = getattr(self, name)
            twice = [v for i, v in enumerate(values) if v in values[:i]]
            if twice:
                raise ValueError(f"argument --{name}: {twice[0]} is given twice")


Flags = CompareFlags


def run(args) -> int:
    from tfrs_logq.studies.compare.builtin import run_compare
    from tfrs_logq.studies.compare.plan import Plan
    from tfrs_logq.studies.compare.report import Margin
    from tfrs_logq.towers.config import TwoTowerConfig

    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else \
        (lambda m: print(m, flush=True))
    margin = Margin(args.margin)
    check_output_dir(args.output_dir)
    if args.report_only:
        from tfrs_logq.studies.compare.report import report_only

        if _named_model(args):
            raise ValueError(f"--report-only reads the model from --output-dir's plan.json: "
                             f"leave out `{_named_model(args)}` (tfrs-logq compare "
                             f"--report-only --output-dir DIR).")
        ignored = sorted(args.given - _REPORT_TAKES)
        if ignored:
            raise ValueError(f"--report-only rebuilds the report of --output-dir from its "
                             f"results.csv and plan.json, and takes --margin and --primary-* "
                             f"only; --{ignored[0].replace('_', '-')} belongs to a comparison "
                             f"run.")
        text = report_only(args.output_dir, say=say, margin=margin,
                           primary=(args.primary_metric, args.primary_baseline))
        if args.json:
            from tfrs_logq.studies._grid import read_rows
            from tfrs_logq.studies.compare.plan import load_plan, missing_runs

            left = missing_runs(load_plan(args.output_dir),
                                read_rows(os.path.join(args.output_dir, "results.csv")))
            print(json.dumps({"output_dir": args.output_dir, "report": text,
                              "missing": [[loss, seed] for loss, seed in left]}))
        return 0
    share = _share(args)  # before any work: a bad index or count is one line
    from tfrs_logq._util.tracking import tracking

    args.tracking = tracking(args.mlflow)  # one line before the log is read
    model = MODELS[type(args.flags.model)]
    if model == "tfrs-model":
        from tfrs_logq.studies.compare.plan import spread

        with spread(share):  # compare_split reaches run_plan, which reads it
            return _run_model_fn(args, say, margin)
    given = {k: v for k, v in dataclasses.asdict(args.flags.model).items()
             if k in TwoTowerConfig.__dataclass_fields__ and k not in ("loss", "seed")}
    config = TwoTowerConfig(**given, loss="inbatch-corrected" if model == "sasrec"
                            else args.loss[0])
    from tfrs_logq.cli.data import load_any_split

    _refuse_unused(args)
    if args.split is None:  # as `train` and `data stats`: a log without times has no temporal
        args.split = default_log_split(args.time_column) if args.interactions else "temporal"
    # The plan is checked (losses, baseline, window) before the data is read.
    window = args.window or min(3, len(config.eval_steps))
    plan = Plan(losses=tuple(args.loss), seeds=tuple(args.seeds), config=config,
                window=window, baseline=args.baseline or "", model=model,
                sasrec_preset=getattr(args, "preset", "cpu"))
    began = time.perf_counter()
    split, name = load_any_split(args)
    say(f"compare: read and split {name} in {time.perf_counter() - began:.1f} s")
    plan = dataclasses.replace(
        plan, source=f"{name}, split {args.split}"
        + (f", weighted by {args.weight_column}" if args.weight_column else ""),
        data=_data_identity(args, split))
    rows = run_compare(plan, split, args.output_dir, say=say, max_runs=args.max_runs,
                       margin=margin, primary=(args.primary_metric, args.primary_baseline),
                       served_index=_served_index(args), share=share,
                       tracking=args.tracking)
    if args.json:
        from tfrs_logq.studies.compare.plan import load_plan

        plan = load_plan(args.output_dir)  # the seeds and losses of every run of the directory
        print(json.dumps({"output_dir": args.output_dir, "plan": plan.fixed_fields(),
                          "losses": list(plan.losses), "seeds": list(plan.seeds),
                          "results": rows}))
    return 0


def _run_model_fn(args, say, margin) -> int:
    """``--model-fn``: the user's own TFRS model on the log (`tfrs_logq.compare_model`)."""
    from tfrs_logq.cli.data import load_any_split
    from tfrs_logq.studies.compare.model_fn import (
        check_arguments,
        compare_split,
        load_model_fn,
    )

    if args.weight_column:
        raise ValueError("--weight-column weights the built-in two-tower's loss (compare "
                         "two-tower); your model trains unweighted: leave it out.")
    _refuse_unused(args)
    # The plan's settings and the model's module before the log is read.
    check_arguments(losses=tuple(args.loss), seeds=tuple(args.seeds), steps=args.steps,
                    eval_every=args.eval_every, window=args.window,
                    batch_size=args.batch_size, baseline=args.baseline)
    model_fn = load_model_fn(args.model_fn, "--model-fn")
    if args.split is None:
        args.split = default_log_split(args.time_column) if args.interactions else "temporal"
    began = time.perf_counter()
    split, name = load_any_split(args)
    say(f"compare: read and split {name} in {time.perf_counter() - began:.1f} s")
    rows = compare_split(
        model_fn, split, history_length=args.history_length, exclude_seen=args.exclude_seen,
        data_identity=_data_identity(args, split), model_fn_flag="--model-fn",
        query_model=args.query_model, candidate_model=args.candidate_model,
        losses=tuple(args.loss), seeds=tuple(args.seeds), steps=args.steps,
        eval_every=args.eval_every, window=args.window, batch_size=args.batch_size,
        baseline=args.baseline, output_dir=args.output_dir, margin=margin,
        primary_metric=args.primary_metric, primary_baseline=args.primary_baseline,
        max_runs=args.max_runs, source=f"{name}, split {args.split}", say=say,
        served_index=_served_index(args), tracking=args.tracking)
    if args.json:
        from tfrs_logq.studies.compare.plan import load_plan

        plan = load_plan(args.output_dir)
        print(json.dumps({"output_dir": args.output_dir, "plan": plan.fixed_fields(),
                          "losses": list(plan.losses), "seeds": list(plan.seeds),
                          "results": rows}))
    return 0


def _share(args):
    """This process's share of a comparison spread over processes (`resolve_share`: the
    flags, else a Kubernetes Indexed Job's or a Slurm array's variables), said in one line
    on stderr; None: every run here."""
    from tfrs_logq.studies.compare.plan import resolve_share

    share = resolve_share(args.run_index, args.run_count)
    if share is not None:
        print(share.describe(), file=sys.stderr, flush=True)
    return share


def _served_index(args):
    """The hook measuring the index `export --index auto` would serve, unless
    --no-served-index (`tfrs_logq.serving.served_recall`)."""
    if not args.served_index:
        return None
    from tfrs_logq.serving.served_recall import served_recall

    return served_recall


# The flags only a user's log takes (their defaults); those --report-only takes.
_LOG_ONLY = ("user_column", "item_column", "time_column", "weight_column", "log_format",
             "min_item_interactions", "min_user_interactions", "deduplicate")
_REPORT_TAKES = {"report_only", "output_dir", "margin", "primary_metric", "primary_baseline",
                 "json", "verbose"}


def _named_model(args) -> str:
    """The model subcommand given (``compare sasrec``), or "" for the default two-tower."""
    return "" if args.flags.model == TwoTowerFlags() else MODELS[type(args.flags.model)]


def _default(name: str):
    """The default of a field of the data source's dataclasses."""
    for flags_class in (DataSource, LogFilters):
        if name in flags_class.__dataclass_fields__:
            field = flags_class.__dataclass_fields__[name]
            return (field.default_factory() if field.default is dataclasses.MISSING
                    else field.default)
    raise KeyError(name)


def _refuse_unused(args) -> None:
    """One data source, and no flag of a user's log with --dataset (not ignored)."""
    def given(name):
        return getattr(args, name) != _default(name)

    if bool(args.interactions) == bool(args.dataset):
        raise ValueError("give either --interactions (with --user-column and --item-column) "
                         "or --dataset.")
    if args.dataset:
        unused = [n for n in _LOG_ONLY if given(n)]
        if unused:
            raise ValueError(f"--{unused[0].replace('_', '-')} is a flag of --interactions "
                             f"(your log); --dataset {args.dataset} does not take it.")


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
    from tfrs_logq.studies.compare.plan import split_fingerprint

    default = (datasets.DEFAULT_TEMPORAL_FRACTION[args.dataset] if args.dataset
               else user_log.DEFAULT_TEMPORAL_FRACTION)  # as the loaders resolve None
    identity["temporal_fraction"] = ((args.temporal_fraction or default)
                                     if args.split == "temporal" else None)
    identity["fingerprint"] = split_fingerprint(split)
    if args.interactions and args.log_format == inter.data_format:  # as the extensions say
        identity["log_format"] = None
    return identity
