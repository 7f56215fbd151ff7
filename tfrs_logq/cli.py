"""The `tfrs-logq` command line.

Flags are built from the config dataclasses (`TrainConfig` for ``train`` and
``experiment``, `DemoConfig` for ``demo``, `ServerOptions` for ``serve``) and the
module constants (presets, losses, datasets, splits, data formats, strategies,
precision policies), so help, defaults and code cannot drift apart; ``--help``
shows every default. Every flag takes both spellings, ``--data-dir`` and
``--data_dir``; help shows one: dashes, except TF Serving's own names
(``--model_base_path``, ``--model_name``, ``--port``, ``--rest_api_port``, ...).

Building the parser imports no TensorFlow: a command's flags are added when that
command is parsed or its help printed, and TensorFlow's start-up logs are
silenced before anything imports it (``--verbose`` keeps them). Errors a user
can fix (bad flags, data, files, ports, servers) end the command with one line,
``tfrs-logq: error: ...`` on stderr, and exit status 2; ``--verbose`` adds the
traceback. ``pipeline run`` exits 3, with one line, when its Evaluator does not bless
the model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import traceback
import typing
from typing import Callable, Optional, Sequence

PROG = "tfrs-logq"
# TF Serving's flag names, kept as its model server spells them.
TF_SERVING_STYLE = "_"


# ------------------------------------------------------------------------ value types


def _int_at_least(low: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            kind = "a positive" if low == 1 else "a non-negative" if low == 0 else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {kind} integer, got {text}")
        return value

    convert.__name__ = "integer"
    return convert


def _float_in(low: float, high: Optional[float] = None, low_inclusive: bool = False):
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        ok = (value >= low if low_inclusive else value > low) and (high is None or value < high)
        if not ok:
            left = "[" if low_inclusive else "("
            right = f"{high})" if high is not None else "inf)"
            raise argparse.ArgumentTypeError(f"must be in {left}{low}, {right}, got {text}")
        return value

    convert.__name__ = "number"
    return convert


def _comma_list(choices: Optional[Sequence[str]] = None, item=str):
    def convert(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError("must name at least one value")
        out = []
        for part in parts:
            if choices is not None and part not in choices:
                raise argparse.ArgumentTypeError(
                    f"{part!r} is not one of {', '.join(choices)}")
            try:
                out.append(item(part))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{part}: {exc}") from None
        return out

    convert.__name__ = "list"
    return convert


# ------------------------------------------------------------------- parser machinery


class _HelpFormatter(argparse.HelpFormatter):
    """Shows every default, and one spelling of each flag."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34, width=100)

    def _get_help_string(self, action):
        text = action.help or ""
        if ("%(default)" in text or "default:" in text or action.default is None
                or action.default is argparse.SUPPRESS):
            return text
        if isinstance(action.default, (list, tuple)):
            return f"{text} (default: {','.join(map(str, action.default))})"
        return f"{text} (default: %(default)s)"

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = [s for s in action.option_strings if s not in getattr(action, "hidden", ())]
        if action.nargs == 0:
            return ", ".join(shown)
        return f"{', '.join(shown)} {self._format_args(action, action.dest.upper())}"


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose arguments are added on first use by ``populate``,
    so building the command tree imports nothing a command's flags need."""

    def __init__(self, *args, populate: Optional[Callable] = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._populate = populate

    def _ensure_populated(self) -> None:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)

    def parse_known_args(self, args=None, namespace=None):
        self._ensure_populated()
        return super().parse_known_args(args, namespace)

    def format_help(self):
        self._ensure_populated()
        return super().format_help()

    def format_usage(self):
        self._ensure_populated()
        return super().format_usage()


class _Switch(argparse.Action):
    """``--x`` / ``--no-x`` in every spelling; the value is None when neither is given,
    so a config file or preset still applies."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        strings = []
        for flag in option_strings:
            body = flag[2:]
            seps = "_" if "_" in body else "-" if "-" in body else "-_"
            strings += [flag, *(f"--no{sep}{body}" for sep in seps)]
        kwargs["nargs"] = 0
        super().__init__(strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string[2:].startswith(("no-", "no_")))

    def format_usage(self):
        return " | ".join(s for s in self.option_strings if s not in getattr(self, "hidden", ()))


def _add(parser, name: str, *, style: str = "-", aliases: Sequence[str] = (), **kwargs):
    """Adds ``--name`` spelt in ``style`` (shown), its other spelling and ``aliases``
    with their other spellings (accepted, not shown)."""
    body = name.lstrip("-").replace("-", style).replace("_", style)
    canonical = f"--{body}"
    names = [canonical]
    for alias in (canonical, *aliases):
        a = alias.lstrip("-")
        for spelt in (a.replace("_", "-"), a.replace("-", "_")):
            if f"--{spelt}" not in names:
                names.append(f"--{spelt}")
    action = parser.add_argument(*names, **kwargs)
    shown = {canonical}
    if isinstance(action, _Switch):
        shown.add(f"--no{style}{body}")
    action.hidden = set(action.option_strings) - shown
    return action


def _add_verbose(parser, top: bool = False) -> None:
    _add(parser, "verbose", action="store_true",
         default=False if top else argparse.SUPPRESS,
         help="show tracebacks and TensorFlow's start-up logs (default: off)")


# ----------------------------------------------------------- flags from the dataclasses


def _field_types(cls) -> dict:
    return typing.get_type_hints(cls)


def _base_type(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return args[0]
    return hint


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


_TRAIN_HELP = {
    "dataset": "dataset to train on",
    "split": "evaluation split: leave-one-out (loo), gSASRec's validation users (gsasrec) "
             "or global temporal (needs timestamps)",
    "loss": "training objective: the paper's losses",
    "data_dir": "directory holding the data files, searched at its top level and one level "
                "down; never falls back elsewhere",
    "data_format": "ML-1M source: MovieLens's ratings.dat (timestamps) or SASRec's "
                   "ml-1m.txt (order only; no download exists)",
    "max_length": "longest history the model reads",
    "embedding_dim": "embedding size",
    "num_blocks": "self-attention blocks",
    "num_heads": "attention heads",
    "dropout": "dropout rate",
    "num_negatives": "sampled negatives per target",
    "batch_size": "users per batch (per replica)",
    "learning_rate": "Adam's learning rate",
    "steps_per_epoch": "training steps between validations",
    "max_epochs": "most epochs",
    "patience": "epochs without a better validation NDCG@10 before stopping",
    "max_validation_users": "validate each epoch on a seeded sample of this many users",
    "test_window": "also score every test user after each of the last N epochs; the result's "
                   "test_window is their mean (0: off)",
    "temporal_fraction": "temporal split: fraction of interactions for test, and again for "
                         "validation",
    "seed": "random seed",
    "strategy": "tf.distribute strategy (auto: TPU, multi-worker, several GPUs, else default)",
    "cross_replica_negatives": "draw in-batch negatives from the targets of all replicas",
    "mixed_precision": "mixed-precision policy",
    "jit_compile": "compile the training step with XLA",
    "share_item_embeddings": "score with the input item embeddings (weight tying)",
    "length_buckets": "speed only: run the SASRec blocks on this many groups of "
                      "similar-length sequences, each without its padding columns "
                      "(1 under --xla and on TPU)",
    "preset": "a set of defaults: smoke (minutes on 2 CPU cores), cpu (a fixed CPU budget), "
              "long (the paper's model, 80 epochs at most, patience 10), fixed (long run "
              "to its end, scored over its last 20 epochs), paper (the paper's protocol, "
              "for a GPU); flags and --config override it",
    "examples": "train on this ExampleGen artifact of `tfrs-logq pipeline run` "
                "(PIPELINE_ROOT/ExampleGen) instead of loading the data file; its dataset and "
                "split are used",
    "log_q": "take log Q (training item counts) from this Statistics artifact "
             "(PIPELINE_ROOT/Statistics) instead of counting them",
}
_TRAIN_METAVARS = {"examples": "DIR", "log_q": "DIR"}
_TRAIN_FLAG_NAMES = {"jit_compile": ("xla", ("jit-compile",))}
_NON_NEGATIVE = {"seed", "patience", "test_window"}
_FLOAT_RANGES = {"dropout": (0.0, 1.0, True), "temporal_fraction": (0.0, 0.5, False)}
_DATA_FIELDS = ("dataset", "split", "data_dir", "data_format", "temporal_fraction", "examples",
                "log_q")


def _train_modules():
    """`tfrs_logq.training` and the losses: what train/experiment flags are built from."""
    from tfrs_logq import training
    from tfrs_logq.objectives import OBJECTIVES

    return training, OBJECTIVES


def _train_choices() -> dict:
    from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
    from tfrs_logq.pipelines.splits import SPLITS

    training, objectives = _train_modules()
    choices = {"dataset": DATASETS, "split": SPLITS, "loss": objectives,
               "data_format": ML1M_FORMATS, "strategy": training.STRATEGIES,
               "preset": tuple(training.PRESETS)}
    policies = getattr(training, "MIXED_PRECISION_POLICIES", None)
    if policies is not None:
        choices["mixed_precision"] = policies
    return choices


def _field_spec(name: str, hint, choices: dict) -> dict:
    """argparse keywords (type, choices, action) for one dataclass field."""
    kind = _base_type(hint)
    if kind is bool:
        return {"action": _Switch}
    if name in choices:
        return {"choices": tuple(choices[name]), "metavar": "{" + ",".join(choices[name]) + "}"}
    if kind is int:
        return {"type": _int_at_least(0 if name in _NON_NEGATIVE else 1), "metavar": "N"}
    if kind is float:
        low, high, inclusive = _FLOAT_RANGES.get(name, (0.0, None, False))
        return {"type": _float_in(low, high, inclusive), "metavar": "X"}
    return {"type": str, "metavar": _TRAIN_METAVARS.get(name, name.split("_")[-1].upper())}


def _train_default_text(name: str, default, presets: dict, experiment: bool) -> str:
    from tfrs_logq.pipelines.datasets import DEFAULT_TEMPORAL_FRACTION

    special = {
        "data_dir": "$TFRS_LOGQ_DATA_DIR, else the download cache",
        "data_format": "whichever the data directory holds",
        "temporal_fraction": ", ".join(f"{v} for {k}" for k, v in
                                       DEFAULT_TEMPORAL_FRACTION.items()),
        "max_validation_users": "all",
        "preset": "cpu" if experiment else "none (the defaults shown)",
        "examples": "none: the data file, loaded in memory",
        "log_q": "counted from the training split",
    }
    if isinstance(default, bool):
        text = "on" if default else "off"
    elif default is None and name in special:
        text = special[name]
    else:
        text = _show(default)
    by_preset = [f"{p}: {_show(v[name])}" for p, v in presets.items() if name in v]
    if by_preset:
        text += "; " + ", ".join(by_preset)
    return f"(default: {text})".replace("%", "%%")


def _add_train_fields(parser, experiment: bool) -> None:
    training, _ = _train_modules()
    choices = _train_choices()
    hints = _field_types(training.TrainConfig)
    groups = {"data": parser.add_argument_group("data"),
              "model": parser.add_argument_group("model and training")}
    skip = {"dataset", "split", "loss", "seed"} if experiment else set()
    for field in dataclasses.fields(training.TrainConfig):
        if field.name in skip:
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        flag, aliases = _TRAIN_FLAG_NAMES.get(field.name, (field.name, ()))
        if flag != field.name:
            aliases = (*aliases, field.name)
        help_text = _TRAIN_HELP.get(field.name, f"TrainConfig.{field.name}")
        group = groups["data" if field.name in _DATA_FIELDS else "model"]
        default_text = _train_default_text(field.name, default, training.PRESETS, experiment)
        _add(group, flag, aliases=aliases, dest=field.name, default=None,
             help=f"{help_text} {default_text}",
             **_field_spec(field.name, hints[field.name], choices))
    _add_load_options(groups["data"])
    _add(parser, "config", default=None, metavar="FILE",
         help="JSON object of TrainConfig fields (and \"preset\"); flags override it "
              "(default: none)")


def _add_load_options(group) -> None:
    _add(group, "skip-bad-lines", action="store_true",
         help="skip malformed lines of the data file and report how many")
    _add(group, "no-cache", action="store_true",
         help="neither read nor write the preprocessed-data cache ($TFRS_LOGQ_CACHE_DIR)")
    _add(group, "no-download", action="store_true",
         help="never download; fail when no local copy exists")


def _add_data_flags(parser, dataset_default_text: str, split_default_text: str):
    """Data flags of commands without TrainConfig flags (data stats, evaluate)."""
    from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
    from tfrs_logq.pipelines.splits import SPLITS

    group = parser.add_argument_group("data")
    _add(group, "dataset", choices=DATASETS, default=None,
         help=f"dataset (default: {dataset_default_text})")
    _add(group, "split", choices=SPLITS, default=None,
         help=f"{_TRAIN_HELP['split']} (default: {split_default_text})")
    _add(group, "data-dir", default=None, metavar="DIR",
         help=f"{_TRAIN_HELP['data_dir']} (default: $TFRS_LOGQ_DATA_DIR, else the download "
              "cache)")
    _add(group, "data-format", aliases=("format",), choices=ML1M_FORMATS, default=None,
         help=f"{_TRAIN_HELP['data_format']} (default: whichever the data directory holds)")
    _add_load_options(group)
    return group


# ----------------------------------------------------------------------- the commands


def _populate_demo(p) -> None:
    from tfrs_logq.demo import DemoConfig
    from tfrs_logq.losses import CORRECTIONS

    help_text = {
        "num_items": "catalog size of the synthetic stream",
        "num_users": "users of the synthetic stream",
        "batch_size": "in-batch negatives per step",
        "steps": "training steps per correction",
        "embedding_dim": "embedding size",
        "learning_rate": "Adam's learning rate",
        "num_eval": "held-out targets for Recall@k",
        "frequency": "where log Q comes from: an in-graph count-min sketch updated while "
                     "training, or the generator's true unigram Q",
        "corrections": "comma-separated corrections to compare",
        "seed": "random seed",
    }
    choices = {"frequency": ("count-min", "true")}
    hints = _field_types(DemoConfig)
    _add(p, "output-dir", default="demo_output", metavar="DIR",
         help="where results.csv and recall.png go")
    for field in dataclasses.fields(DemoConfig):
        spec = _field_spec(field.name, hints[field.name], choices)
        if field.name == "corrections":
            spec = {"type": _comma_list(CORRECTIONS), "metavar": "LIST"}
        _add(p, field.name, dest=field.name, default=field.default,
             help=help_text.get(field.name, f"DemoConfig.{field.name}"), **spec)
    _add(p, "json", action="store_true", help="print the results as one JSON object")
    _add_verbose(p)
    p.set_defaults(run=_demo)


def _populate_data_stats(p) -> None:
    from tfrs_logq.config import TrainConfig

    defaults = TrainConfig()
    group = _add_data_flags(p, defaults.dataset, defaults.split)
    from tfrs_logq.pipelines.datasets import DEFAULT_TEMPORAL_FRACTION

    _add(group, "temporal-fraction", aliases=("fraction",), dest="temporal_fraction",
         type=_float_in(0.0, 0.5), default=None, metavar="X",
         help=f"{_TRAIN_HELP['temporal_fraction']} (default: "
              + ", ".join(f"{v} for {k}" for k, v in DEFAULT_TEMPORAL_FRACTION.items()) + ")")
    _add(p, "json", action="store_true", help="print one JSON object")
    _add_verbose(p)
    p.set_defaults(run=_data_stats, train_defaults=(defaults.dataset, defaults.split))


def _populate_train(p) -> None:
    _add(p, "model-dir", required=True, metavar="DIR",
         help="where the run goes (config.json, best weights, metrics.json, logs)")
    _add_train_fields(p, experiment=False)
    _add(p, "overwrite", action="store_true",
         help="replace a run of another config (or a finished one) in --model-dir; without "
              "it such a directory is refused, and an interrupted run of the same config "
              "resumes")
    _add(p, "json", action="store_true", help="print the metrics as one JSON object")
    _add_verbose(p)
    p.set_defaults(run=_train)


def _populate_diagnose(p) -> None:
    from tfrs_logq.diagnose import SAMPLERS
    from tfrs_logq.losses import CORRECTIONS

    source = p.add_mutually_exclusive_group(required=True)
    _add(source, "model-dir", metavar="DIR",
         help="a `tfrs-logq train` run (default: none; this or --synthetic-items is required)")
    _add(source, "synthetic-items", type=_int_at_least(2), metavar="N",
         help="the synthetic stream's ground-truth model with N items (default: none)")
    _add(p, "data-dir", metavar="DIR", help="data of --model-dir (default: its saved data_dir)")
    _add(p, "queries", type=_int_at_least(1), default=256, metavar="N",
         help="queries (test users of --model-dir, users of the stream)")
    _add(p, "samplers", type=_comma_list(SAMPLERS), default="in-batch", metavar="LIST",
         help="comma-separated samplers")
    _add(p, "num-negatives", type=_comma_list(item=_int_at_least(1)), default="16,64,256",
         metavar="LIST", help="comma-separated numbers of negatives k")
    _add(p, "corrections", type=_comma_list(CORRECTIONS), default=",".join(CORRECTIONS),
         metavar="LIST", help="comma-separated corrections")
    _add(p, "draws", type=_int_at_least(2), default=200, metavar="T",
         help="Monte Carlo draws of the negatives per sampler and k")
    _add(p, "exact", action="store_true",
         help="enumerate every draw instead of Monte Carlo (tiny catalogs only)")
    _add(p, "seed", type=_int_at_least(0), default=0, help="seed of queries and draws")
    _add(p, "output-dir", metavar="DIR",
         help="write diagnose.json, diagnose.md and diagnose.png there (default: none, "
              "print only)")
    _add(p, "json", action="store_true", help="print the result as one JSON object")
    _add_verbose(p)
    p.set_defaults(run=_diagnose)


def _populate_experiment(p) -> None:
    from tfrs_logq.pipelines.datasets import DATASETS
    from tfrs_logq.pipelines.splits import SPLITS

    training, objectives = _train_modules()
    defaults = training.TrainConfig()
    _add(p, "output-dir", required=True, metavar="DIR",
         help="where runs/, results.csv, table.md and table.png go")
    _add(p, "datasets", type=_comma_list(DATASETS), default=defaults.dataset, metavar="LIST",
         help="comma-separated datasets")
    _add(p, "splits", type=_comma_list(SPLITS), default=defaults.split, metavar="LIST",
         help="comma-separated splits")
    _add(p, "losses", type=_comma_list(objectives), metavar="LIST",
         default="inbatch-none,inbatch-logq,inbatch-corrected,mns-none,mns-logq,"
                 "mns-corrected,full-softmax",
         help="comma-separated losses")
    _add(p, "seeds", type=_comma_list(item=_int_at_least(0)), default="0,1,2", metavar="LIST",
         help="comma-separated non-negative seeds")
    _add_train_fields(p, experiment=True)
    _add(p, "parallel", type=_int_at_least(1), default=1, metavar="N",
         help="runs trained at once, each in its own process (fills a GPU with small models)")
    _add(p, "json", action="store_true", help="print one JSON line per run, no progress bars")
    _add_verbose(p)
    p.set_defaults(run=_experiment)


def _populate_export(p) -> None:
    from tfrs_logq.serving.export import INDEXES

    _add(p, "model-dir", required=True, metavar="DIR", help="the output of `tfrs-logq train`")
    _add(p, "model_base_path", style=TF_SERVING_STYLE, required=True, metavar="DIR",
         help="TF Serving's base path: the directory of integer versions this export adds to")
    _add(p, "model_name", style=TF_SERVING_STYLE, required=True, metavar="NAME",
         help="the servable's name")
    _add(p, "version", type=_int_at_least(1), default=None, metavar="N",
         help="integer version (default: the next free one)")
    _add(p, "index", choices=INDEXES, default=INDEXES[0],
         help="scann: ScaNN index (needs the ScaNN ops to serve); brute-force: exact, stock "
              "TensorFlow ops only")
    _add(p, "k", type=_int_at_least(1), default=100, metavar="N",
         help="results of serving_default (top_k takes k per request)")
    _add_verbose(p)
    p.set_defaults(run=_export)


_SERVE_HELP = {
    "model_name": "the servable's name, as clients ask for it",
    "model_base_path": "TF Serving's base path: the directory of integer versions",
    "port": "gRPC port (0: any free port)",
    "rest_api_port": "REST port (0: any free port)",
    "host": "address to bind (loopback only unless told)",
    "file_system_poll_wait_seconds": "seconds between looks for a new version",
    "max_batch_size": "most rows batched into one model call",
    "batch_timeout_micros": "longest wait for a batch to fill",
    "max_request_rows": "most rows in one request",
    "max_request_bytes": "largest request body",
    "num_threads": "gRPC worker threads",
    "rest_api_num_threads": "REST worker threads (connections beyond them wait, not fail)",
    "rest_api_timeout_in_ms": "REST: longest a client may take to send a request (its "
                              "headers, then its body), in ms",
    "drain_timeout_in_ms": "on SIGTERM or SIGINT, longest wait for requests in flight to "
                           "finish before exiting, in ms",
    "request_timeout_in_ms": "longest a request waits for its batch's result, in ms (then "
                             "DEADLINE_EXCEEDED / HTTP 504)",
}
_SERVE_NON_NEGATIVE = {"port", "rest_api_port", "batch_timeout_micros"}


def _populate_serve(p) -> None:
    from tfrs_logq.serving.server import ServerOptions

    hints = _field_types(ServerOptions)
    for field in dataclasses.fields(ServerOptions):
        required = field.default is dataclasses.MISSING and \
            field.default_factory is dataclasses.MISSING
        spec = _field_spec(field.name, hints[field.name], {})
        if field.name in _SERVE_NON_NEGATIVE:
            spec["type"] = _int_at_least(0)
        kwargs = {"required": True} if required else {"default": field.default}
        _add(p, field.name, style=TF_SERVING_STYLE, dest=field.name,
             help=_SERVE_HELP.get(field.name, f"ServerOptions.{field.name}"), **spec, **kwargs)
    _add_verbose(p)
    p.set_defaults(run=_serve, server_fields=[f.name for f in dataclasses.fields(ServerOptions)])


def _populate_evaluate(p) -> None:
    _add(p, "server", required=True, metavar="HOST:PORT", help="the gRPC endpoint")
    _add(p, "model_name", style=TF_SERVING_STYLE, required=True, metavar="NAME",
         help="the servable's name")
    _add(p, "model-dir", required=True, metavar="DIR",
         help="the training output of the served model (its data, and the exact figures)")
    _add_data_flags(p, "the model's", "the model's")
    _add(p, "max-targets", type=_int_at_least(1), default=None, metavar="N",
         help="evaluate a seeded sample of this many test targets (default: all)")
    _add(p, "timeout", type=_float_in(0.0), default=10.0, metavar="SECONDS",
         help="how long to wait for the server to answer at start")
    _add(p, "json", action="store_true", help="print one JSON object")
    _add_verbose(p)
    p.set_defaults(run=_evaluate)


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
                out[name.strip()] = _float_in(0.0, None, True)(value.strip())
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


def _populate_pipeline_run(p) -> None:
    from tfrs_logq.config import OBJECTIVES, PRESETS, TrainConfig
    from tfrs_logq.pipelines.beam import COMPONENTS, METRICS, SOURCE_FORMATS
    from tfrs_logq.pipelines.beam.exporter import INDEXES
    from tfrs_logq.pipelines.beam.runner import DEFAULT_NUM_WORKERS, RUNNERS
    from tfrs_logq.pipelines.datasets import DATASETS, DEFAULT_TEMPORAL_FRACTION
    from tfrs_logq.pipelines.splits import SPLITS

    defaults = TrainConfig()
    _add(p, "pipeline-root", required=True, metavar="DIR",
         help="where the components' artifacts go (DIR/ExampleGen, DIR/Statistics, "
              "DIR/Trainer, ..., each with a manifest.json); current ones are skipped")
    group = p.add_argument_group("data")
    _add(group, "dataset", choices=(*DATASETS, "synthetic"), default=None,
         help=f"dataset (default: {defaults.dataset}; with --input, none); synthetic draws "
              "the synthetic stream's model in the workers (--synthetic-*; ExampleGen and "
              "Statistics only)")
    _add(group, "data-dir", default=None, metavar="DIR",
         help=f"{_TRAIN_HELP['data_dir']} (default: $TFRS_LOGQ_DATA_DIR, else the download "
              "cache)")
    _add(group, "input", default=None, metavar="FILE",
         help="read this file instead of finding the dataset's (needs --data-format) "
              "(default: none)")
    _add(group, "data-format", aliases=("format",), choices=SOURCE_FORMATS,
         default=None,
         help="the file's format: ratings (user::item::rating::ts), sasrec (user item), csv "
              "(user,item,timestamp) or steam (Steam reviews) (default: for ml-1m whichever "
              "the data directory holds)")
    _add(group, "split", choices=SPLITS, default=defaults.split,
         help=_TRAIN_HELP["split"])
    _add(group, "temporal-fraction", aliases=("fraction",), dest="temporal_fraction",
         type=_float_in(0.0, 0.5), default=None, metavar="X",
         help=f"{_TRAIN_HELP['temporal_fraction']} (default: "
              + ", ".join(f"{v} for {k}" for k, v in DEFAULT_TEMPORAL_FRACTION.items())
              + ", else 0.1)")
    _add(group, "skip-bad-lines", action="store_true",
         help="drop malformed lines of the data file and count them in the manifest")
    _add(group, "no-download", action="store_true",
         help="never download; fail when no local copy exists")
    synthetic = p.add_argument_group("--dataset synthetic")
    _add(synthetic, "synthetic-users", type=_int_at_least(1), default=10_000, metavar="N",
         help="users (each: the history, a validation and a test item)")
    _add(synthetic, "synthetic-items", type=_int_at_least(1), default=5_000, metavar="N",
         help="items (Zipf popularity in 50 topics)")
    _add(synthetic, "synthetic-history-length", type=_int_at_least(1), default=20,
         metavar="N", help="training items per user")
    _add(synthetic, "synthetic-seed", type=_int_at_least(0), default=0, metavar="N",
         help="seed of every draw (the same seed gives the same artifacts on any number "
              "of workers)")
    _add(synthetic, "synthetic-users-per-chunk", type=_int_at_least(1), default=2_000,
         metavar="N", help="users drawn as one Beam element")
    beam = p.add_argument_group("beam (Beam's own flags go after --: tfrs-logq pipeline run "
                                "... --runner DataflowRunner -- --project P --region R "
                                "--temp_location gs://B/tmp --sdk_container_image IMAGE)")
    _add(beam, "runner", choices=RUNNERS, default=RUNNERS[0],
         help="Beam runner: FnApiRunner runs here (direct_running_mode=multi_processing); "
              "PortableRunner needs --job_endpoint, FlinkRunner --flink_master or "
              "--job_endpoint, SparkRunner --spark_master_url or --job_endpoint, "
              "DataflowRunner --project, --region, --temp_location, --sdk_container_image "
              "(checked before anything runs)")
    _add(beam, "force-local-root", action="store_true",
         help="with a non-local runner, accept a --pipeline-root (and --input) on a local "
              "filesystem: it is mounted at the same path on every worker")
    _add(beam, "statistics", choices=("exact", "count-min"), default=None,
         help="Statistics: exact counts and the sketch, or (synthetic data only) the "
              "count-min sketch alone, counted per chunk (default: exact; count-min for "
              "synthetic)")
    _add(beam, "num-workers", type=_int_at_least(1), default=DEFAULT_NUM_WORKERS, metavar="N",
         help="worker processes (direct_num_workers)")
    _add(beam, "num-shards", type=_int_at_least(1), default=4, metavar="N",
         help="TFRecord files of ExampleGen")
    _add(beam, "sketch-depth", type=_int_at_least(1), default=4, metavar="N",
         help="rows of the count-min sketch of Statistics")
    _add(beam, "sketch-width", type=_int_at_least(1), default=1 << 20, metavar="N",
         help="counters per row of the count-min sketch")
    _add(beam, "sketch-seed", type=int, default=0, metavar="N",
         help="hash seed of the count-min sketch (as CountMinSketch's seed)")
    training = p.add_argument_group("Trainer (tfrs-logq train --examples DIR/ExampleGen "
                                    "--log-q DIR/Statistics)")
    _add(training, "preset", choices=tuple(PRESETS), default=None,
         help="training preset: smoke trains for seconds to minutes on 2 CPU cores (what "
              "`make pipeline` runs: a check of the pipeline, not a usable model); cpu or "
              "long train a usable model in hours (default: smoke)")
    _add(training, "loss", choices=OBJECTIVES, default=None,
         help=f"{_TRAIN_HELP['loss']} (default: {defaults.loss})")
    _add(training, "seed", type=_int_at_least(0), default=None, metavar="N",
         help=f"{_TRAIN_HELP['seed']} (default: {defaults.seed})")
    _add(training, "train-config", default=None, metavar="FILE",
         help="JSON object of other TrainConfig fields (and \"preset\"), as `train --config`; "
              "--preset, --loss and --seed override it (default: none)")
    serving = p.add_argument_group("Exporter, BulkInferrer, Evaluator, Pusher")
    _add(serving, "index", choices=INDEXES, default=INDEXES[0],
         help="the export's index: scann, or brute-force (exact, stock TensorFlow ops)")
    _add(serving, "top-k", type=_int_at_least(1), default=1000, metavar="K",
         help="items BulkInferrer lists per test target (at least the largest cut-off, 1000, "
              "unless the catalog is smaller)")
    _add(serving, "threshold", dest="thresholds", type=_thresholds(METRICS), default=None,
         metavar="METRIC=MIN,...",
         help=f"bless only if every named overall figure ({', '.join(METRICS)}) is at least "
              "its minimum (default: none)")
    _add(serving, "baseline", default=None, metavar="DIR",
         help="an Evaluator artifact of the same data (say, the pushed model's, copied "
              "aside); bless only if no overall figure is below the baseline's by more than "
              "--baseline-tolerance (default: none)")
    _add(serving, "baseline-tolerance", type=_float_in(0.0, None, True), default=0.0,
         metavar="X", help="how far below the baseline a figure may be")
    _add(serving, "serving-base-path", default=None, metavar="DIR",
         help="Pusher copies a blessed export here as the next integer version (TF "
              "Serving's --model_base_path) (default: none, no Pusher)")
    _add(p, "stop-after", choices=COMPONENTS, default=COMPONENTS[-1],
         help="run the components up to this one (the run exits 3 when the Evaluator ran "
              "and did not bless the model)")
    _add(p, "force", action="store_true", help="rebuild every component, current or not")
    _add(p, "json", action="store_true", help="print one JSON object")
    _add_verbose(p)
    p.set_defaults(run=_pipeline_run, train_defaults=(defaults.dataset, defaults.split))


def build_parser() -> argparse.ArgumentParser:
    """The `tfrs-logq` parser; each command's flags are added when first used."""
    from tfrs_logq._version import __version__

    parser = _Parser(
        prog=PROG,
        description="Corrected logQ correction of sampled softmax for TFRS retrieval.",
        epilog="Every flag also takes its other spelling (--data-dir or --data_dir). "
               "`tfrs-logq COMMAND --help` lists a command's flags and their defaults.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_verbose(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    sub.add_parser("demo", populate=_populate_demo,
                   help="train none/logq/corrected on the synthetic stream; compare Recall@k")
    sub.add_parser("study", populate=lambda p: __import__(
        "tfrs_logq.study", fromlist=["populate_parser"]).populate_parser(p),
                   help="the large-catalog study on the synthetic stream (issue 26)")
    data = sub.add_parser("data", help="dataset tools")
    _add_verbose(data)
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND",
                                   parser_class=_Parser)
    data_sub.add_parser("stats", populate=_populate_data_stats,
                        help="the file used, users, items, interactions and split sizes")
    sub.add_parser("train", populate=_populate_train,
                   help="train SASRec with one of the paper's losses")
    sub.add_parser("experiment", populate=_populate_experiment,
                   help="run the paper's grid and write its Table 1")
    sub.add_parser("diagnose", populate=_populate_diagnose,
                   help="gradient bias of none/logq/corrected against the full softmax")
    sub.add_parser("export", populate=_populate_export,
                   help="export a trained model as a TF Serving SavedModel")
    sub.add_parser("serve", populate=_populate_serve,
                   help="serve exports with TF Serving's gRPC and REST APIs")
    sub.add_parser("evaluate", populate=_populate_evaluate,
                   help="Recall@k through a TF Serving endpoint, beside the exact figures")
    pipeline = sub.add_parser("pipeline", help="the batch pipeline on Apache Beam")
    _add_verbose(pipeline)
    pipeline_sub = pipeline.add_subparsers(dest="pipeline_command", required=True,
                                           metavar="COMMAND", parser_class=_Parser)
    pipeline_sub.add_parser("run", populate=_populate_pipeline_run,
                            help="ExampleGen, Statistics, Trainer, Exporter, BulkInferrer, "
                                 "Evaluator and Pusher into --pipeline-root, skipping current "
                                 "components")
    return parser


# --------------------------------------------------------------------------- handlers


def _load_options(args) -> dict:
    return {"skip_bad_lines": args.skip_bad_lines, "use_cache": not args.no_cache,
            "download_ok": not args.no_download}


def _data_record(interactions) -> dict:
    return {"source": interactions.source, "data_format": interactions.data_format,
            "rows": interactions.num_rows, "skipped_lines": interactions.skipped_lines}


def _demo(args) -> int:
    from tfrs_logq.demo import DemoConfig, run_demo

    config = DemoConfig(**{f.name: getattr(args, f.name)
                           for f in dataclasses.fields(DemoConfig)})
    config.corrections = tuple(config.corrections)
    verbose = 2 if args.json or not sys.stdout.isatty() else 1
    run_demo(config, args.output_dir, verbose=0 if args.json else verbose, as_json=args.json)
    return 0


def _data_stats(args) -> int:
    from tfrs_logq.pipelines.datasets import load_split

    dataset = args.dataset or args.train_defaults[0]
    split_name = args.split or args.train_defaults[1]
    split = load_split(dataset, split_name, args.data_dir, data_format=args.data_format,
                       temporal_fraction=args.temporal_fraction, **_load_options(args))
    inter = split.interactions
    result = {"dataset": dataset, "split": split_name, **_data_record(inter), **split.stats()}
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


def _config_file(path: str, fields: dict, choices: dict) -> dict:
    """The ``--config`` JSON object, checked field by field as the flags are."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"--config {path}: no such file") from None
    except OSError as exc:
        raise OSError(f"--config {path}: cannot read it ({exc.strerror})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config {path} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--config {path} must be a JSON object of training options, got "
                         f"{type(value).__name__}")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"--config {path}: unknown options {unknown}; expected some of "
                         f"{sorted(fields)}")
    for name, item in value.items():
        if item is None:
            continue
        kind = _base_type(fields[name])
        spec = _field_spec(name, fields[name], choices)
        ok = (isinstance(item, bool) if kind is bool else
              isinstance(item, int) and not isinstance(item, bool) if kind is int else
              isinstance(item, (int, float)) and not isinstance(item, bool) if kind is float
              else isinstance(item, str))
        problem = None if ok else f"must be {kind.__name__}, got {json.dumps(item)}"
        if ok and "choices" in spec and item not in spec["choices"]:
            problem = f"must be one of {list(spec['choices'])}, got {json.dumps(item)}"
        if ok and problem is None and "type" in spec and kind in (int, float):
            try:
                spec["type"](str(item))
            except argparse.ArgumentTypeError as exc:
                problem = str(exc)
        if problem:
            raise ValueError(f"--config {path}: {name} {problem}")
    return value


def _training_overrides(args) -> dict:
    """``--config`` then the flags given, over the preset (resolved by `resolve_config`)."""
    training, _ = _train_modules()
    fields = _field_types(training.TrainConfig)
    overrides = {}
    if args.config:
        overrides.update(_config_file(args.config, fields, _train_choices()))
    for name in fields:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return overrides


def _train(args) -> int:
    from tfrs_logq.pipelines.datasets import load_split

    training, _ = _train_modules()
    overrides = _training_overrides(args)
    config = training.resolve_config(**overrides)
    if config.examples:  # the ExampleGen artifact decides the data and split
        config = training.examples_config(config, explicit=set(overrides))
        split = training.load_split(config)
    else:
        split = load_split(config.dataset, config.split, config.data_dir,
                           data_format=config.data_format,
                           temporal_fraction=config.temporal_fraction, **_load_options(args))
    if config.dataset == "ml-1m" and not config.examples:
        # record the file format used, for export and evaluate
        config = dataclasses.replace(config, data_format=split.interactions.data_format)
    kwargs = {"overwrite": True} if args.overwrite else {}
    result = training.train(config, args.model_dir, verbose=0 if args.json else "auto",
                            split=split, **kwargs)
    result = {**result, "data": _data_record(split.interactions)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    _warn_if_smoke(config.preset)
    return 0


def _diagnose(args) -> int:
    from tfrs_logq import diagnose as diag

    if args.model_dir:
        _read_model_config(args.model_dir)
        inputs = diag.model_dir_inputs(args.model_dir, args.queries, seed=args.seed,
                                       data_dir=args.data_dir)
        source = {"model_dir": os.path.abspath(args.model_dir)}
    else:
        inputs = diag.synthetic_inputs(args.synthetic_items, args.queries, seed=args.seed)
        source = {"synthetic_items": args.synthetic_items}
    result = diag.diagnose(*inputs, samplers=args.samplers, num_negatives=args.num_negatives,
                           corrections=args.corrections, num_draws=args.draws, seed=args.seed,
                           exact=args.exact)
    result.pop("_per_query")
    result = {**source, **result}
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        for name, write in (("diagnose.json", lambda f: json.dump(result, f, indent=2)),
                            ("diagnose.md", lambda f: f.write(diag.format_table(result) + "\n"))):
            tmp = os.path.join(args.output_dir, f".{name}.tmp")
            with open(tmp, "w") as f:
                write(f)
            os.replace(tmp, os.path.join(args.output_dir, name))
        png = os.path.join(args.output_dir, "diagnose.png")
        diag.plot(result, png + ".tmp.png")
        os.replace(png + ".tmp.png", png)
    print(json.dumps(result) if args.json else diag.format_table(result))
    return 0


def _experiment(args) -> int:
    import inspect

    from tfrs_logq.experiment import run_grid

    overrides = _training_overrides(args)
    preset = overrides.pop("preset", None) or "cpu"
    data_dir = overrides.pop("data_dir", None)
    unchanged = {"skip_bad_lines": False, "use_cache": True, "download_ok": True}
    load_options = {k: v for k, v in _load_options(args).items() if v != unchanged[k]}
    if load_options:
        if "load_options" not in inspect.signature(run_grid).parameters:
            raise ValueError("experiment does not take --skip-bad-lines, --no-cache or "
                             "--no-download yet; run `tfrs-logq data stats` or `train` with "
                             "them, or fix the data file.")
        overrides["load_options"] = load_options
    run_grid(args.output_dir, args.datasets, args.splits, args.losses, args.seeds, preset,
             data_dir=data_dir, verbose=0 if args.json else 2, parallel=args.parallel,
             **overrides)
    print(f"wrote {os.path.join(args.output_dir, 'results.csv')}, table.md and table.png")
    _warn_if_smoke(preset)
    return 0


def _export(args) -> int:
    base = args.model_base_path
    if os.path.exists(base) and not os.path.isdir(base):
        raise NotADirectoryError(
            f"--model_base_path {base} is a file, not a directory: give the directory that "
            "holds (or will hold) the model's integer versions.")
    _read_model_config(args.model_dir)
    from tfrs_logq.serving.export import check_model_name, export_version

    check_model_name(args.model_name)
    old_layout = os.path.join(base, args.model_name)
    if os.path.isdir(old_layout) and any(d.isdigit() for d in os.listdir(old_layout)):
        print(f"tfrs-logq: warning: --model_base_path is TF Serving's base path (the directory "
              f"of versions) since 0.2; {old_layout} holds versions of the old layout "
              f"(BASE/NAME/VERSION), so this version goes there too. Pass --model_base_path "
              f"{old_layout} to silence this.", file=sys.stderr)
        base = old_layout
    path = export_version(args.model_dir, base, version=args.version, index=args.index,
                          default_k=args.k)
    print(path)
    return 0


def _check_port(host: str, port: int, flag: str) -> None:
    """Fails when something listens on ``host:port`` (a second server would share it)."""
    import errno
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(errno.EADDRINUSE,
                              f"{flag} {port} is already in use on {host}: stop the server "
                              "that holds it, or choose another port (0 picks a free one)"
                              ) from None
            raise OSError(exc.errno, f"{flag} {port}: cannot bind {host}:{port} "
                                     f"({exc.strerror})") from None


def _serve(args) -> int:
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    # Checks the name (as export does), the ports (0-65535), the counts and timeouts.
    options = ServerOptions(**{name: getattr(args, name) for name in args.server_fields})
    base = args.model_base_path
    if not os.path.isdir(base):
        raise FileNotFoundError(
            f"--model_base_path {base} does not exist or is not a directory: give TF Serving's "
            "base path, the directory that holds the integer versions `tfrs-logq export "
            "--model_base_path` writes.")
    if not any(d.isdigit() and os.path.isdir(os.path.join(base, d)) for d in os.listdir(base)):
        # TF Serving's own words; the server keeps polling and serves the first version.
        print(f"No versions of servable {args.model_name} found under base path {base}. "
              "Did you forget to name your leaf directory as a number (eg. '/1/')?",
              file=sys.stderr, flush=True)
    _check_port(args.host, args.port, "--port")
    _check_port(args.host, args.rest_api_port, "--rest_api_port")
    _log_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    server = ModelServer(options).start()
    print(f"serving {args.model_name} from {args.model_base_path}: gRPC {args.host}:"
          f"{server.port}, REST {args.host}:{server.rest_port}", flush=True)
    server.serve_until_signal()  # SIGTERM/SIGINT: drain requests in flight, log, exit 0
    return 0


def _read_model_config(model_dir: str) -> dict:
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"--model-dir {model_dir} does not exist: give the directory "
                                "`tfrs-logq train --model-dir` wrote.")
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--model-dir {model_dir} holds no config.json: it is not a "
                                "training output (give the directory `tfrs-logq train "
                                "--model-dir` wrote).")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): the training output is "
                         "damaged; train again.") from None


def _evaluate(args) -> int:
    from tfrs_logq.serving.evaluation import evaluate_through_server

    _read_model_config(args.model_dir)  # a directory that is no training output: one line
    result = evaluate_through_server(
        args.server, args.model_name, args.model_dir, dataset=args.dataset, split=args.split,
        data_dir=args.data_dir, data_format=args.data_format, max_targets=args.max_targets,
        timeout=args.timeout, load_options=_load_options(args))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


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
    root, origin = datasets.data_root(args.data_dir)
    found = datasets._candidates(root, "steam")
    path = datasets._one(found, "steam", root, origin) if found else datasets._fetch_or_explain(
        datasets.STEAM_URL, datasets.STEAM_SHA256, "steam_reviews.json.gz", "steam", root,
        origin, not args.no_download)
    return path, "csv" if ".csv" in os.path.basename(path) else "steam", dataset


def _pipeline_train_options(args) -> tuple[str, dict]:
    """``(preset, TrainConfig fields)`` of the Trainer: --train-config, then the flags."""
    options: dict = {}
    if args.train_config:
        training, _ = _train_modules()
        options = _config_file(args.train_config, _field_types(training.TrainConfig),
                               _train_choices())
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


def _pipeline_run(args) -> int:
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
        _warn_if_smoke(preset)
    return _blessing_status(results)


SMOKE_WARNING = ("smoke preset: a plumbing check, not a usable model; use --preset cpu for a "
                 "useful one")


def _warn_if_smoke(preset: Optional[str]) -> None:
    """One line on stderr when a run trained with the smoke preset (its recall is near
    random: the README's walkthrough measured test Recall@10 0.0023 on ML-1M)."""
    if preset == "smoke":
        print(f"{PROG}: warning: {SMOKE_WARNING}", file=sys.stderr)


# `pipeline run`'s exit status when the Evaluator did not bless the model (2 is an error).
NOT_BLESSED_EXIT = 3


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


# ------------------------------------------------------------------- output and errors


class _StderrHandler(logging.Handler):
    """Writes to the current ``sys.stderr`` (which tests and callers may replace)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 (logging must not raise)
            self.handleError(record)


_log_handler = _StderrHandler()


def _quiet_tensorflow(verbose: bool) -> None:
    """Silences TensorFlow's (and gRPC's) start-up logs; must run before TF is imported."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ INFO, WARNING and ERROR
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    for name in ("tensorflow", "absl", "h5py"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _configure_logging(verbose: bool) -> None:
    _log_handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    logger = logging.getLogger("tfrs_logq")
    if _log_handler not in logger.handlers:
        logger.addHandler(_log_handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


_EXTRAS = {"scann": "scann", "tensorflow_serving": "serving", "grpc": "serving",
           "tensorflow_datasets": "data", "apache_beam": "beam"}


def _is_user_error(exc: BaseException) -> bool:
    """Errors with a message a user can act on (not bugs)."""
    known: list = [ValueError, OSError, ImportError]
    server = sys.modules.get("tfrs_logq.serving.server")
    if server is not None:
        known.append(server.ServingError)
    grpc = sys.modules.get("grpc")
    if grpc is not None:
        known.append(grpc.RpcError)
    return isinstance(exc, tuple(known))


def _one_line(exc: BaseException) -> str:
    grpc = sys.modules.get("grpc")
    if grpc is not None and isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"the server answered {exc.code().name}: {exc.details()}"
    if isinstance(exc, ImportError):
        extra = _EXTRAS.get((exc.name or "").split(".")[0])
        if extra:
            return f"{exc}: install it with pip install 'tfrs-logq[{extra}]'"
    if isinstance(exc, OSError) and exc.strerror and exc.filename and len(exc.args) == 2:
        return f"{exc.strerror}: {exc.filename}"
    if isinstance(exc, OSError) and exc.strerror and len(exc.args) == 2:
        return str(exc.strerror)
    text = str(exc) or type(exc).__name__
    return " ".join(text.split("\n")).strip()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    _quiet_tensorflow(verbose)  # before any command imports TensorFlow
    beam_args: list = []
    if "--" in argv:  # `pipeline run ... -- BEAM FLAGS`: Beam's own pipeline options
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if beam_args:
        if getattr(args, "pipeline_command", None) != "run":
            parser.error("only `pipeline run` takes Beam pipeline options after --")
        args.beam_args = beam_args
    verbose = bool(getattr(args, "verbose", False))
    _configure_logging(verbose)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not _is_user_error(exc):
            raise
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
