"""Flags generated from the config dataclasses, and ``--config`` files.

jsonargparse reads a dataclass (`dataclass_fields`): its fields, their type hints and
defaults, and each field's docstring, which is the flag's help, so `TrainConfig`'s
documentation is written once, for Python users and the command line alike. The
values are checked by the dataclass itself (`TrainConfig` raises `ConfigError`), so
the command line refuses what the Python API refuses, in the same words. argparse
stays the parser, for the command line's own conventions: both spellings of every
flag, ``--x``/``--no-x`` switches that leave a preset alone when not given, aliases
(``--xla``), defaults by preset in help, one-line errors (docs/cli.md says why).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import typing

from tfrs_logq.cli._common import Switch, add_flag, float_in, int_at_least

# ------------------------------------------------------------ reading a dataclass


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """One field of a config dataclass, as a flag needs it."""

    name: str
    kind: type  # the type hint, Optional[...] unwrapped: bool, int, float, str, tuple...
    default: object  # None for a required field
    required: bool
    doc: str  # the field's docstring on one line ("" when it has none)


@functools.lru_cache(maxsize=None)
def _reader(cls):
    """A jsonargparse parser of the dataclass ``cls`` (one argument per field)."""
    import jsonargparse

    # Field docstrings are the flags' help. A process-wide jsonargparse setting; the
    # command line is jsonargparse's only user in the package.
    jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, nested_key=None, as_group=False, fail_untyped=True)
    return parser


def base_type(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return args[0]
    return typing.get_origin(hint) or hint


def dataclass_fields(cls) -> list[FieldInfo]:
    """The fields of the dataclass ``cls`` in order, read by jsonargparse."""
    hints = typing.get_type_hints(cls)
    return [FieldInfo(a.dest, base_type(hints[a.dest]), None if a.required else a.default,
                      bool(a.required), " ".join((a.help or "").split()))
            for a in _reader(cls)._actions if a.dest in hints]


def check_types(cls, values: dict) -> typing.Optional[tuple[str, str]]:
    """``(field, problem)`` for the first value of ``values`` (a JSON object's fields of
    ``cls``) whose JSON type does not fit the field's type hint (jsonargparse checks
    it), else None."""
    reader = _reader(cls)
    for name, value in values.items():
        if value is None:
            continue
        try:
            reader.parse_object({name: value})
        except argparse.ArgumentError:
            kind = {f.name: f.kind for f in dataclass_fields(cls)}[name]
            return name, f"must be {kind.__name__}, got {json.dumps(value)}"
    return None


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def field_spec(name: str, kind: type, choices: dict, non_negative=()) -> dict:
    """argparse keywords (type, choices, action) for a field of a dataclass that checks
    nothing itself (`DemoConfig`, `ServerOptions`' sizes): sizes at least 1, or 0."""
    if kind is bool:
        return {"action": Switch}
    if name in choices:
        return {"choices": tuple(choices[name]), "metavar": "{" + ",".join(choices[name]) + "}"}
    if kind is int:
        return {"type": int_at_least(0 if name in non_negative else 1), "metavar": "N"}
    if kind is float:
        return {"type": float_in(0.0), "metavar": "X"}
    return {"type": str, "metavar": name.split("_")[-1].upper()}


# ------------------------------------------------------------------ TrainConfig flags

_TRAIN_METAVARS = {"examples": "DIR", "log_q": "DIR"}
_TRAIN_ALIASES = {"jit_compile": ("jit-compile", "jit_compile")}  # the flag is --xla
_DATA_FIELDS = ("dataset", "split", "data_dir", "data_format", "temporal_fraction", "examples",
                "log_q")


def train_help(name: str) -> str:
    """The help of a `TrainConfig` field: its docstring."""
    from tfrs_logq.sasrec.config import TrainConfig

    return next(f.doc for f in dataclass_fields(TrainConfig) if f.name == name)


def train_choices() -> dict:
    """The names each `TrainConfig` field of a closed set takes (what it checks)."""
    from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
    from tfrs_logq.pipelines.splits import SPLITS
    from tfrs_logq.sasrec.config import MIXED_PRECISION_POLICIES, OBJECTIVES, PRESETS, STRATEGIES

    return {"dataset": DATASETS, "split": SPLITS, "loss": OBJECTIVES,
            "data_format": ML1M_FORMATS, "strategy": STRATEGIES, "preset": tuple(PRESETS),
            "mixed_precision": MIXED_PRECISION_POLICIES}


def train_value(name: str, kind: type):
    """The argparse type of a `TrainConfig` field: the text as ``kind``, checked by
    `TrainConfig` (``argument --seed: must be >= 0, received -1.``)."""
    from tfrs_logq.sasrec.config import ConfigError, TrainConfig

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {noun}, got {text!r}") from None
        try:
            TrainConfig(**{name: value})
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.problem) from None
        return value

    convert.__name__ = {int: "integer", float: "number"}.get(kind, kind.__name__)
    return convert


def _train_spec(field: FieldInfo, choices: dict) -> dict:
    if field.kind is bool:
        return {"action": Switch}
    if field.name in choices:
        names = tuple(choices[field.name])
        return {"choices": names, "metavar": "{" + ",".join(names) + "}"}
    if field.kind in (int, float):
        return {"type": train_value(field.name, field.kind),
                "metavar": "N" if field.kind is int else "X"}
    return {"type": str,
            "metavar": _TRAIN_METAVARS.get(field.name, field.name.split("_")[-1].upper())}


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
    """A flag per `TrainConfig` field (``experiment`` takes lists of datasets, splits,
    losses and seeds instead of one), then ``--config``. Every default is None, so a
    flag not given leaves the preset and ``--config`` alone."""
    from tfrs_logq.sasrec.config import FLAGS, PRESETS, TrainConfig

    choices = train_choices()
    groups = {"data": parser.add_argument_group("data"),
              "model": parser.add_argument_group("model and training")}
    skip = {"dataset", "split", "loss", "seed"} if experiment else set()
    for field in dataclass_fields(TrainConfig):
        if field.name in skip:
            continue
        default_text = _train_default_text(field.name, field.default, PRESETS, experiment)
        add_flag(groups["data" if field.name in _DATA_FIELDS else "model"],
                 FLAGS[field.name], aliases=_TRAIN_ALIASES.get(field.name, ()),
                 dest=field.name, default=None, help=f"{field.doc} {default_text}",
                 **_train_spec(field, choices))
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
             help=f"{train_help('split')} (default: {split_default_text})")
    add_flag(group, "data-dir", default=None, metavar="DIR",
             help=f"{train_help('data_dir')} (default: $TFRS_LOGQ_DATA_DIR, else the download "
                  "cache)")
    add_flag(group, "data-format", aliases=("format",), choices=ML1M_FORMATS, default=None,
             help=f"{train_help('data_format')} (default: whichever the data directory holds)")
    add_load_options(group)
    return group


def config_file(path: str, flag: str = "--config") -> dict:
    """The JSON object of `TrainConfig` fields in the file ``path`` (given as ``flag``),
    each value checked as its flag's: its JSON type by jsonargparse, its value by
    `TrainConfig`."""
    from tfrs_logq.sasrec.config import ConfigError, TrainConfig

    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} {path}: no such file") from None
    except OSError as exc:
        raise OSError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} {path} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} {path} must be a JSON object of training options, got "
                         f"{type(value).__name__}")
    fields = [f.name for f in dataclass_fields(TrainConfig)]
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{flag} {path}: unknown options {unknown}; expected some of "
                         f"{sorted(fields)}")
    problem = check_types(TrainConfig, value)
    if problem is not None:
        raise ValueError(f"{flag} {path}: {problem[0]} {problem[1]}")
    for name, item in value.items():
        if item is not None:
            try:
                TrainConfig(**{name: item})
            except ConfigError as exc:
                raise ValueError(f"{flag} {path}: {name} {exc.problem}") from None
    return value


def training_overrides(args) -> dict:
    """``--config`` then the flags given, over the preset (resolved by `resolve_config`)."""
    from tfrs_logq.sasrec.config import TrainConfig

    overrides = {}
    if args.config:
        overrides.update(config_file(args.config))
    for field in dataclasses.fields(TrainConfig):
        value = getattr(args, field.name, None)
        if value is not None:
            overrides[field.name] = value
    return overrides
