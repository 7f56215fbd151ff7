"""Flags from dataclasses, parsed by tyro (docs/cli.md says why tyro). A command's
``populate(flags)`` adds the fields of its dataclasses to the list ``flags`` (`add_flags`);
`Parser`, the argparse command tree, hands the words after the command to `parse`, which
makes them one dataclass (a nested one per help group) for `tyro.cli`. A field is a flag
(``max_length``: ``--max-length``; tyro takes ``--max_length`` too), its type hint the
value's type (a bool ``--x``/``--no-x``, a tuple a list: ``0,1,2`` or ``0 1 2``), its
default the flag's (none: required), its docstring the help (docstring-parser), and `flag`
metadata the rest. An error is one line, ``tfrs-logq: error: ...``, exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import operator
import re
import sys
import typing
from typing import Annotated, Any, Optional

import docstring_parser

PROG = "tfrs-logq"
USER_ERROR_EXIT = 2  # an error a user can fix: bad flags, data, files, ports, servers


def cut(text: str, limit: int = 200) -> str:
    """``text`` with each run of over ``limit`` non-blank characters cut short."""
    return re.sub(r"\S{%d,}" % (limit + 1),
                  lambda m: f"{m[0][:limit]}... ({len(m[0]):,} characters)", text)


def flag(default=dataclasses.MISSING, **metadata) -> dataclasses.Field:
    """A field with its flag's ``choices``, ``at_least``/``above``/``at_most``, ``metavar``,
    ``name``, ``style`` ("_": TF Serving's), ``type`` (text to value, ValueError),
    ``group``, ``help`` (without a docstring) or ``default_text``."""
    return dataclasses.field(default=default, metadata=metadata)


class Parser(argparse.ArgumentParser):
    """The command tree; the top one (``top``) hands a command's words to `parse`."""

    def __init__(self, *args, populate=None, root=PROG, top=False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.populate, self.root, self.top, self.commands = populate, root, top, {}

    def error(self, message: str):
        self.exit(USER_ERROR_EXIT,
                  f"{self.root}: error: {cut(message)} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args, node, n = [str(a) for a in (sys.argv[1:] if args is None else args)], self, 0
        while self.top and n < len(args) and node.populate is None and (
                args[n] == "--verbose" or args[n] in node.commands):
            node, n = node.commands.get(args[n], node), n + 1
        if node.populate is None or node is self:  # help, --version, errors, subparsers
            return super().parse_known_args(args, namespace)
        namespace, _ = super().parse_known_args(args[:n], namespace)
        flags: list = []
        node.populate(flags)
        vars(namespace).update(parse(flags, args[n:], node))
        return namespace, []


def _one_line(text: str) -> str:
    """tyro's error box (UTF-8 or plain) as one line: the paragraph under its title
    (``Error parsing --x: ...`` in argparse's words, ``argument --x: ...``)."""
    lines = [line.strip(" │╭╮╰╯") for line in re.sub(r"\x1b\[[\d;]*m", "", text).splitlines()]
    rule = lambda line: not line.strip("─- ")  # noqa: E731
    body = itertools.takewhile(lambda line: not rule(line), itertools.dropwhile(
        rule, [line for line in lines if line][1:]))
    words = " ".join(" ".join(body).split()) or " ".join(text.split())
    return re.sub(r"^Error parsing (\S+):", r"argument \1:", words)


def parse(flags: list, args: list, parser: Parser) -> dict:
    """``{dest: value}`` of the `add_flags` entries ``flags`` from the words ``args``."""
    import contextlib
    import io

    import tyro
    from tyro.constructors import PrimitiveConstructorSpec

    groups: dict = {}
    for f in flags:
        hint = "(required)" if f["required"] else f"(default: {f['default_text']})"
        arg = tyro.conf.arg(name=f["name"], help=f["help"], help_behavior_hint=hint)
        kind = Annotated[Optional[bool], tyro.conf.DisallowNone, arg] if f["kind"] is bool \
            else Annotated[Any, PrimitiveConstructorSpec(
                nargs="+" if f["kind"] is list else 1, metavar=f["metavar"],
                instance_from_str=f["convert"], is_instance=lambda value: True,
                str_from_instance=lambda value: [shown(value)]), arg]
        groups.setdefault(f["group"], []).append(
            (f["dest"], kind, dataclasses.field(default=f["default"])))
    nested = [(f"group{i}", Annotated[cls, tyro.conf.arg(name=title)],
               dataclasses.field(default_factory=cls)) for i, (title, fields) in
              enumerate(groups.items()) if title
              for cls in [dataclasses.make_dataclass(f"Group{i}", fields)]]
    command = dataclasses.make_dataclass("Flags", groups.get(None, []) + nested)
    underscores = not any("-" in f["name"] for f in flags)  # TF Serving's names (serve)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            out = tyro.cli(command, args=args, prog=parser.prog, use_underscores=underscores,
                           config=(tyro.conf.OmitArgPrefixes,))
    except SystemExit as exc:
        if exc.code:
            parser.error(_one_line(captured.getvalue()))
        raise
    values = {k: v for group in [out, *(getattr(out, n) for n, *_ in nested)]
              for k, v in vars(group).items() if not k.startswith("group")}
    missing = ["--" + (f["name"] if underscores else f["name"].replace("_", "-"))
               for f in flags if f["required"] and values[f["dest"]] is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    return values


_BOUNDS = (("at_least", ">=", operator.ge), ("above", ">", operator.gt),
           ("at_most", "<=", operator.le))


def _converter(kind: type, meta: dict, check, many: bool):
    """tyro's words to ``kind`` (a list of them if ``many``) within ``meta``'s choices and
    bounds, then ``check``ed: each refusal a ValueError in the words of the error line."""

    def convert(text: str):
        said = cut(repr(text))  # tyro wraps a long value: no run of it is cut after that
        if "choices" in meta and text not in meta["choices"]:
            raise ValueError(f"invalid choice: {said} (choose from "
                             f"{', '.join(meta['choices'])})")
        try:
            value = meta.get("type", kind)(text)
        except ValueError as exc:
            noun = {int: "an integer", float: "a number"}.get(kind)
            raise ValueError(f"must be {noun}, got {said}" if noun else cut(str(exc))) from None
        for key, sign, within in _BOUNDS:
            if meta.get(key) is not None and not within(value, meta[key]):
                raise ValueError(f"must be {sign} {meta[key]}, got {text}")  # a number
        if check is not None:  # `ConfigError.problem`: the words without the field
            try:
                check(value)
            except ValueError as exc:
                raise ValueError(cut(getattr(exc, "problem", str(exc)))) from None
        return value

    def convert_all(words: list):
        items = [convert(p.strip()) for w in words for p in w.split(",") if p.strip()]
        if not items:
            raise ValueError("must name at least one value")
        return items

    return convert_all if many else lambda words: convert(words[0])


def shown(value) -> str:
    """A default as help shows it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> dict:
    """Each field's docstring on one line (docstring-parser)."""
    return {p.arg_name: " ".join((p.description or "").split())
            for p in docstring_parser.parse_from_object(cls).params}


def add_flags(flags: list, cls, *, only=None, skip=(), meta=None, group=None, style="-",
              check=None, unset=False) -> None:
    """A flag per field of the dataclass ``cls`` (in ``only``, not in ``skip``) onto the
    list ``flags``; ``meta`` (`flag` metadata by field) over the field's own.
    ``check(name, value)`` raises ValueError to refuse a value. ``unset``: defaults are
    None (a preset's stay)."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if (only is not None and field.name not in only) or field.name in skip:
            continue
        m = {**field.metadata, **(meta or {}).get(field.name, {})}
        hint = hints[field.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
        many = typing.get_origin(kind) in (tuple, list)
        item = typing.get_args(kind)[0] if many else kind
        required = field.default is dataclasses.MISSING and field.default_factory is \
            dataclasses.MISSING
        default = field.default if field.default_factory is dataclasses.MISSING \
            else field.default_factory()
        flags.append({
            "dest": field.name, "required": required, "group": m.get("group", group),
            "name": m.get("name", "--" + field.name.replace("_", m.get("style", style)))[2:],
            "kind": list if many else kind, "default": None if unset or required else default,
            "convert": _converter(item, m, check and functools.partial(check, field.name), many),
            "metavar": m.get("metavar") or ("A,B" if many else "{" + ",".join(m["choices"]) + "}"
                                            if "choices" in m else {int: "N", float: "X"}.get(
                                                kind, field.name.split("_")[-1].upper())),
            "help": docs.get(field.name) or m.get("help", ""),
            "default_text": m.get("default_text", shown(default))})


def values(args, cls) -> dict:
    """The parsed values of ``cls``' fields."""
    return {f.name: vars(args)[f.name] for f in dataclasses.fields(cls) if f.name in vars(args)}


# ---------------------------------------------------------- TrainConfig's fields as flags

def train_flag_meta(more: dict, presets: bool) -> dict:
    """`flag` metadata of `TrainConfig`'s fields (their flags, ``--xla``; the names each
    takes; defaults that are no value, and with ``presets`` each preset's value), updated
    with ``more``'s."""
    from tfrs_logq.pipelines import datasets, splits
    from tfrs_logq.sasrec import config

    fraction = ", ".join(f"{v} for {k}" for k, v in datasets.DEFAULT_TEMPORAL_FRACTION.items())
    meta = {name: {"name": flag_name, **({"group": "data"} if name in (
        *config.DATA_FIELDS, "log_q") else {})} for name, flag_name in config.FLAGS.items()}
    for name, extra in {
            "dataset": {"choices": datasets.DATASETS}, "loss": {"choices": config.OBJECTIVES},
            "split": {"choices": splits.SPLITS,
                      "default_text": "temporal, gsasrec with --data-format sasrec"},
            "data_dir": {"metavar": "DIR",
                         "default_text": "$TFRS_LOGQ_DATA_DIR, else the download cache"},
            "data_format": {"choices": datasets.ML1M_FORMATS,
                            "default_text": "whichever the data directory holds"},
            "temporal_fraction": {"default_text": fraction},
            "strategy": {"choices": config.STRATEGIES},
            "mixed_precision": {"choices": config.MIXED_PRECISION_POLICIES},
            "max_validation_users": {"default_text": "all"},
            "preset": {"choices": tuple(config.PRESETS),
                       "default_text": "none (the defaults shown)"},
            "examples": {"metavar": "DIR", "default_text": "none: the data file, in memory"},
            "log_q": {"metavar": "DIR", "default_text": "counted from the training split"},
            "log_format": {"default_text": "each file's extension"},
            **more}.items():
        meta[name].update(extra)
    for field in dataclasses.fields(config.TrainConfig) if presets else ():
        by_preset = [f"{p}: {shown(v[field.name])}" for p, v in config.PRESETS.items()
                     if field.name in v]
        if by_preset:
            text = meta[field.name].get("default_text", shown(field.default))
            meta[field.name]["default_text"] = f"{text}; {', '.join(by_preset)}"
    return meta


def _train_check(name: str, value) -> None:
    from tfrs_logq.sasrec.config import TrainConfig

    TrainConfig(**{name: value})  # ConfigError (a ValueError) names the problem


def add_train_flags(flags: list, *, only=None, skip=(), meta=None,
                    group="model and training", check=True):
    """A flag per `TrainConfig` field, each value checked by `TrainConfig` (``argument
    --seed: must be >= 0, received -1.``) unless not ``check``; a flag not given leaves
    the preset alone."""
    from tfrs_logq.sasrec.config import TrainConfig

    presets = only is None or "preset" in only  # each preset's values, where it is a flag
    add_flags(flags, TrainConfig, only=only, skip=skip, group=group, unset=True,
              meta=train_flag_meta(meta or {}, presets), check=_train_check if check else None)


def config_file(path: str, flag_name: str = "--config") -> dict:
    """The JSON object of `TrainConfig` fields (and ``preset``) in the file ``path``, as
    `TrainConfig.from_dict` checks it (keys, types, values); a run's config.json will do."""
    from tfrs_logq.sasrec.config import RUN_RECORD_KEYS, ConfigError, TrainConfig

    where = f"{flag_name} {path}"
    try:
        with open(path) as f:
            value = json.load(f)
        TrainConfig.from_dict(value)
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from None
    except ConfigError as exc:
        raise ValueError(f"{where}: {exc.field} {exc.problem}") from None
    return {k: v for k, v in value.items() if k not in RUN_RECORD_KEYS}


def training_overrides(args) -> dict:
    """``--config``, then the `TrainConfig` flags given (to go over the preset)."""
    from tfrs_logq.sasrec.config import TrainConfig

    overrides = config_file(args.config) if getattr(args, "config", None) else {}
    overrides.update({k: v for k, v in values(args, TrainConfig).items() if v is not None})
    return overrides
