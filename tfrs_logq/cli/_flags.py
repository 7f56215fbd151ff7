"""Flags from dataclasses: the command line's one layer over argparse (docs/cli.md says
why no library does it). A field is a flag (``max_length``: ``--max-length``, or
``--max_length``); its type hint the value's type (a bool is ``--x``/``--no-x``, a tuple a
list, ``0,1,2`` or ``0 1 2``), its default the flag's (none: required), its docstring the
help (docstring-parser), and `flag` metadata the rest. Help gives each flag's default; an
error is one line, ``tfrs-logq: error: ...``, exit status 2, long values cut.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import functools
import json
import operator
import re
import sys
import typing

import docstring_parser

PROG = "tfrs-logq"
USER_ERROR_EXIT = 2  # an error a user can fix: bad flags, data, files, ports, servers


def cut(text: str, limit: int = 200) -> str:
    """``text`` with each run of over ``limit`` non-blank characters cut short."""
    return re.sub(r"\S{%d,}" % (limit + 1),
                  lambda m: f"{m[0][:limit]}... ({len(m[0]):,} characters)", text)


def flag(default=dataclasses.MISSING, **metadata) -> dataclasses.Field:
    """A field with its flag's ``choices``, ``at_least``/``above``/``at_most``, ``metavar``,
    ``name``, ``aliases`` (taken, not shown), ``style`` ("_": TF Serving's), ``type``,
    ``group``, ``help`` (without a docstring) or ``default_text``."""
    return dataclasses.field(default=default, metadata=metadata)


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose flags ``populate`` adds on first use (building the tree
    imports nothing they need), taking both spellings and aliases, erring on one line."""

    def __init__(self, *args, populate=None, root=PROG, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, formatter_class=functools.partial(
            argparse.HelpFormatter, max_help_position=34, width=100), **kwargs)
        self._populate, self.groups, self.aliases = populate, {}, {}
        self.root = root  # the command's name in errors: ``tfrs-logq: error: ...``

    def _built(self) -> Parser:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)
        return self

    def format_help(self) -> str:
        return argparse.ArgumentParser.format_help(self._built())

    def parse_known_args(self, args=None, namespace=None):
        known = self._built()._option_string_actions

        def spelt(arg: str) -> str:  # --data_dir=x -> --data-dir=x, --format -> --data-format
            name, eq, value = arg.partition("=")
            for other in (name, *("--" + name[2:].replace(*s) for s in ("_-", "-_"))):
                other = self.aliases.get(other, other)
                if name.startswith("--") and name not in known and other in known:
                    return other + eq + value
            return arg

        args = sys.argv[1:] if args is None else args
        return super().parse_known_args([spelt(str(a)) for a in args], namespace)

    def error(self, message: str):
        self.exit(USER_ERROR_EXIT,
                  f"{self.root}: error: {cut(message)} (see {self.prog} --help)\n")


class _List(argparse.Action):
    """``--seeds 0,1,2`` or ``--seeds 0 1 2``: each item converted by ``convert``."""

    def __init__(self, *args, convert, **kwargs) -> None:
        super().__init__(*args, nargs="+", **kwargs)
        self.convert = convert

    def __call__(self, parser, namespace, words, option_string=None) -> None:
        try:
            items = [self.convert(p.strip()) for w in words for p in w.split(",") if p.strip()]
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        if not items:
            raise argparse.ArgumentError(self, "must name at least one value")
        setattr(namespace, self.dest, items)


_BOUNDS = (("at_least", ">=", operator.ge), ("above", ">", operator.gt),
           ("at_most", "<=", operator.le))


def _converter(kind: type, meta: dict, check):
    """Text to ``kind`` within ``meta``'s choices and bounds, then ``check``ed (ValueError)."""

    def convert(text: str):
        if "choices" in meta and text not in meta["choices"]:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(meta['choices'])})")
        try:
            value = kind(text)
        except ValueError:
            noun = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise argparse.ArgumentTypeError(f"must be {noun}, got {text!r}") from None
        for key, sign, within in _BOUNDS:
            if meta.get(key) is not None and not within(value, meta[key]):
                raise argparse.ArgumentTypeError(f"must be {sign} {meta[key]}, got {text}")
        try:
            check(value)
        except ValueError as exc:  # `ConfigError.problem`: the words without the field
            raise argparse.ArgumentTypeError(getattr(exc, "problem", str(exc))) from None
        return value

    return convert


def _kinds(hint) -> tuple:
    """``(kind, item kind)``, Optional unwrapped; a tuple/list/Sequence of X: ``(list, X)``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return _kinds(args[0])
    origin = typing.get_origin(hint) or hint
    if origin in (tuple, list, collections.abc.Sequence):
        return list, (args[0] if args else str)
    return origin, None


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


def add_flags(parser, cls, *, only=None, skip=(), meta=None, group=None, style="-",
              check=None, unset=False) -> None:
    """A flag per field of the dataclass ``cls`` (in ``only``, not in ``skip``); ``meta``
    (`flag` metadata by field) over the field's own. ``check(name, value)`` raises
    ValueError to refuse a value. ``unset``: defaults are None (a preset's stay)."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if (only is not None and field.name not in only) or field.name in skip:
            continue
        m = {**field.metadata, **(meta or {}).get(field.name, {})}
        kind, item = _kinds(hints[field.name])
        required = field.default is dataclasses.MISSING
        convert = _converter(item or kind, m, functools.partial(check, field.name) if check
                             else lambda value: None)
        kwargs = {"dest": field.name, "required": required,
                  "default": None if unset or required else field.default}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind is list:
            kwargs.update(action=_List, convert=convert, metavar=m.get("metavar", "A,B"))
        else:
            kwargs["type"] = m.get("type", convert)
            kwargs["metavar"] = m.get("metavar") or (
                "{" + ",".join(m["choices"]) + "}" if "choices" in m else
                {int: "N", float: "X"}.get(kind, field.name.split("_")[-1].upper()))
        text = docs.get(field.name) or m.get("help", "")
        if not required:
            text += f" (default: {m.get('default_text', shown(field.default))})"
        title = m.get("group", group)
        if title is not None and title not in parser.groups:
            parser.groups[title] = parser.add_argument_group(title)
        name = m.get("name") or "--" + field.name.replace("_", m.get("style", style))
        (parser.groups[title] if title else parser).add_argument(
            name, help=text.replace("%", "%%"), **kwargs)
        for alias in m.get("aliases", ()):
            parser.aliases[alias] = name
            if kind is bool:
                parser.aliases["--no-" + alias[2:]] = "--no-" + name[2:]


def values(args, cls) -> dict:
    """The parsed values of ``cls``' fields."""
    return {f.name: vars(args)[f.name] for f in dataclasses.fields(cls) if f.name in vars(args)}


# ---------------------------------------------------------- TrainConfig's fields as flags

def _train_check(name: str, value) -> None:
    from tfrs_logq.sasrec.config import TrainConfig

    TrainConfig(**{name: value})  # ConfigError (a ValueError) names the problem


def add_train_flags(parser, *, only=None, skip=(), meta=None, group="model and training",
                    check=True):
    """A flag per `TrainConfig` field, each value checked by `TrainConfig` (``argument
    --seed: must be >= 0, received -1.``) unless not ``check``; a flag not given leaves
    the preset alone."""
    from tfrs_logq.cli._common import train_flag_meta
    from tfrs_logq.sasrec.config import TrainConfig

    presets = only is None or "preset" in only  # each preset's values, where it is a flag
    add_flags(parser, TrainConfig, only=only, skip=skip, meta=train_flag_meta(meta or {}, presets),
              group=group, check=_train_check if check else None, unset=True)


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
