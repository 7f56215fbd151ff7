"""Flags built from the config dataclasses (`TrainConfig` above all) and the module
constants (presets, losses, datasets, splits, data formats, strategies, precision
policies), so help, defaults and code cannot drift apart; and ``--config``, a JSON
object of `TrainConfig` fields checked as the flags are.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing

from tfrs_logq.cli._common import Switch, add_flag, float_in, int_at_least

# ----------------------------------------------------------- flags from the dataclasses


def field_types(cls) -> dict:
    return typing.get_type_hints(cls)


def base_type(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return args[0]
    return hint


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


TRAIN_HELP = {
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


def train_modules():
    """`tfrs_logq.training` and the losses: what train/experiment flags are built from."""
    from tfrs_logq import training
    from tfrs_logq.objectives import OBJECTIVES

    return training, OBJECTIVES


def train_choices() -> dict:
    from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
    from tfrs_logq.pipelines.splits import SPLITS

    training, objectives = train_modules()
    choices = {"dataset": DATASETS, "split": SPLITS, "loss": objectives,
               "data_format": ML1M_FORMATS, "strategy": training.STRATEGIES,
               "preset": tuple(training.PRESETS)}
    policies = getattr(training, "MIXED_PRECISION_POLICIES", None)
    if policies is not None:
        choices["mixed_precision"] = policies
    return choices


def field_spec(name: str, hint, choices: dict) -> dict:
    """argparse keywords (type, choices, action) for one dataclass field."""
    kind = base_type(hint)
    if kind is bool:
        return {"action": Switch}
    if name in choices:
        return {"choices": tuple(choices[name]), "metavar": "{" + ",".join(choices[name]) + "}"}
    if kind is int:
        return {"type": int_at_least(0 if name in _NON_NEGATIVE else 1), "metavar": "N"}
    if kind is float:
        low, high, inclusive = _FLOAT_RANGES.get(name, (0.0, None, False))
        return {"type": float_in(low, high, inclusive), "metavar": "X"}
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


def add_train_fields(parser, experiment: bool) -> None:
    training, _ = train_modules()
    choices = train_choices()
    hints = field_types(training.TrainConfig)
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
        help_text = TRAIN_HELP.get(field.name, f"TrainConfig.{field.name}")
        group = groups["data" if field.name in _DATA_FIELDS else "model"]
        default_text = _train_default_text(field.name, default, training.PRESETS, experiment)
        add_flag(group, flag, aliases=aliases, dest=field.name, default=None,
                 help=f"{help_text} {default_text}",
                 **field_spec(field.name, hints[field.name], choices))
    if not experiment:  # `run_grid` loads with the defaults: no flag it would refuse
        add_load_options(groups["data"])
    add_flag(parser, "config", default=None, metavar="FILE",
             help="JSON object of TrainConfig fields (and \"preset\"); flags override it "
                  "(default: none)")


def add_load_options(group) -> None:
    add_flag(group, "skip-bad-lines", action="store_true",
             help="skip malformed lines of the data file and report how many")
    add_flag(group, "no-cache", action="store_true",
             help="neither read nor write the preprocessed-data cache ($TFRS_LOGQ_CACHE_DIR)")
    add_flag(group, "no-download", action="store_true",
             help="never download; fail when no local copy exists")


def add_data_flags(parser, dataset_default_text: str, split_default_text: str):
    """Data flags of commands without TrainConfig flags (data stats, evaluate)."""
    from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
    from tfrs_logq.pipelines.splits import SPLITS

    group = parser.add_argument_group("data")
    add_flag(group, "dataset", choices=DATASETS, default=None,
             help=f"dataset (default: {dataset_default_text})")
    add_flag(group, "split", choices=SPLITS, default=None,
             help=f"{TRAIN_HELP['split']} (default: {split_default_text})")
    add_flag(group, "data-dir", default=None, metavar="DIR",
             help=f"{TRAIN_HELP['data_dir']} (default: $TFRS_LOGQ_DATA_DIR, else the download "
                  "cache)")
    add_flag(group, "data-format", aliases=("format",), choices=ML1M_FORMATS, default=None,
             help=f"{TRAIN_HELP['data_format']} (default: whichever the data directory holds)")
    add_load_options(group)
    return group


def config_file(path: str, fields: dict, choices: dict) -> dict:
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
        kind = base_type(fields[name])
        spec = field_spec(name, fields[name], choices)
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


def training_overrides(args) -> dict:
    """``--config`` then the flags given, over the preset (resolved by `resolve_config`)."""
    training, _ = train_modules()
    fields = field_types(training.TrainConfig)
    overrides = {}
    if args.config:
        overrides.update(config_file(args.config, fields, train_choices()))
    for name in fields:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return overrides


