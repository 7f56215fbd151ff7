"""A command's flags are a dataclass, ``Flags`` in its module, parsed by tyro (docs/cli.md
says why tyro): a field is a flag (``max_length``: ``--max-length``, ``--max_length`` too),
its type hint the value's type (``Literal`` the choices, a bool ``--x``/``--no-x``, a tuple
a list), its docstring the help, a nested dataclass a help group, `tyro.conf.arg` a name or
the default shown; bounds are checked in ``__post_init__`` (`check`). Here: lists split at
commas, tyro's error box made one line (``tfrs-logq: error: ...``, exit status 2), and the
namespace a command's ``run`` reads: every field by name, nested ones too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import operator
import os
import re
import typing
from typing import Annotated

import tyro

# tyro joins a field docstring's lines before dedenting them, so an indented line keeps its
# break in help: give it each docstring on one line (a private function, checked to exist).
if callable(getattr(tyro._docstrings, "parse_docstring_from_object", None)):
    _docs = tyro._docstrings.parse_docstring_from_object
    tyro._docstrings.parse_docstring_from_object = lambda obj: {
        name: " ".join(text.split()) for name, text in _docs(obj).items()}


@dataclasses.dataclass(kw_only=True)
class Verbose:
    """Every command's flag: each ``Flags`` subclasses this."""

    verbose: bool = False
    """show tracebacks and TensorFlow's start-up logs"""


def shown(text: str):
    """The marker of a flag whose help shows ``(default: text)``."""
    return tyro.conf.arg(help_behavior_hint=f"(default: {text})")


def annotate(cls, name: str, **markers):
    """A subclass of the dataclass ``cls`` whose fields named in ``markers`` carry those
    tyro markers (`tyro.conf.arg` for help and the default shown, `tyro.conf.Suppress`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return dataclasses.make_dataclass(name, [
        (f.name, Annotated[(hints[f.name], *markers[f.name])], dataclasses.field(
            default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(cls) if f.name in markers], bases=(cls,), namespace={
        "hidden": {n for n, m in markers.items() if tyro.conf.Suppress in m}})


_BOUNDS = {"at_least": (">=", operator.ge), "above": (">", operator.gt),
           "at_most": ("<=", operator.le)}


def check(flags, **bounds: dict) -> None:
    """``flags``' fields within ``bounds`` (``at_least``, ``above``, ``at_most``: ``{field:
    bound}``), each item of a list; else ValueError ``argument --x: must be >= 1, got 0``."""
    for key, limits in bounds.items():
        sign, within = _BOUNDS[key]
        for name, bound in limits.items():
            value = getattr(flags, name)
            for item in value if isinstance(value, tuple) else (value,):
                if item is not None and not within(item, bound):
                    raise ValueError(f"argument --{name.replace('_', '-')}: must be {sign} "
                                     f"{bound}, got {item}")


def _lists(cls) -> set:
    """The flags (``--x``) of ``cls``' tuple fields, nested dataclasses' too."""
    found = set()
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            found |= _lists(hint)
        elif tuple in {typing.get_origin(h) for h in (hint, *typing.get_args(hint))}:
            found.add("--" + name.replace("_", "-"))
    return found


def _split_lists(args: list, lists: set) -> list:
    """``args`` with a list flag's values split at commas (``--seeds 0,1 2``)."""
    out, listing = [], False
    for word in args:
        if word.startswith("--"):
            flag, eq, word = word.partition("=")
            listing = flag.replace("_", "-") in lists
            out.append(flag if listing or not eq else f"{flag}={word}")
            if not eq or not listing:
                continue
        out += [p for p in word.split(",") if p] if listing else [word]
    return out


# tyro's words to argparse's (the ones the tests and docs quote).
_WORDING = ((r"^Error parsing (--\S+): ", r"argument \1: "), (r"^Error parsing \w+: ", ""),
            (r"^`\w+` \((--[\w-]+)\) ", r"argument \1: "),
            (r"^invalid choice (.*) for argument '(\S+)'\. Expected one of \((.*)\)\.$",
             r"argument \2: invalid choice: \1 (choose from \3)"),
            (r"invalid literal for int\(\) with base 10: ", "must be an integer, got "),
            (r"could not convert string to float: ", "must be a number, got "))


def rule(line: str) -> bool:
    return not line.strip("─- ")


def _one_line(box: str) -> str:
    """tyro's error box as one line: the paragraph under its title, in argparse's words."""
    lines = [line.strip(" │╭╮╰╯") for line in re.sub(r"\x1b\[[\d;]*m", "", box).splitlines()]
    body = list(itertools.dropwhile(rule, [line for line in lines if line][1:]))
    body = list(itertools.takewhile(lambda line: not rule(line), body))
    if body and body[0].startswith("Missing from"):
        return "the following arguments are required: " + ", ".join(
            line.split()[0] for line in body[1:] if line.startswith("--"))
    text = " ".join(" ".join(body).split()) or " ".join(box.split())
    for pattern, words in _WORDING:
        text = re.sub(pattern, words, text)
    return text


def _values(flags, given: set) -> dict:
    """``{field: value}`` of ``flags`` and its nested dataclasses. A class with
    ``flag_names`` (`TrainOptions`) gives None for each flag not in ``given``."""
    names, values = getattr(flags, "flag_names", None), {}
    for field in dataclasses.fields(flags):
        value = getattr(flags, field.name)
        if field.name in getattr(flags, "hidden", ()):  # `annotate`'s `tyro.conf.Suppress`
            continue
        if dataclasses.is_dataclass(value):
            values.update(_values(value, given))
        elif names is None or {names[field.name], "--no-" + names[field.name][2:]} & given:
            values[field.name] = value
        elif field.name not in values:
            values[field.name] = None
        if value == ():
            raise ValueError(f"argument --{field.name.replace('_', '-')}: must name at least "
                             "one value")
    return values


def values(args, cls) -> dict:
    """The values of ``cls``' fields in the namespace ``args``."""
    return {f.name: vars(args)[f.name] for f in dataclasses.fields(cls) if f.name in vars(args)}


def parse(cls, args: list, parser, underscores: bool = False) -> dict:
    """``{field: value}`` of the flags dataclass ``cls`` from the words ``args``, plus
    ``flags`` (the dataclass); an error is ``parser.error``'s one line."""
    args = _split_lists(args, _lists(cls))
    given = {w.partition("=")[0].replace("_", "-") for w in args if w.startswith("--")}
    captured, columns = io.StringIO(), os.environ.get("COLUMNS")
    if not {"-h", "--help"} & set(args):  # an error box as wide as its longest line
        os.environ["COLUMNS"] = "1000000"
    try:
        with contextlib.redirect_stderr(captured):
            flags = tyro.cli(cls, args=args, prog=parser.prog, use_underscores=underscores,
                             config=(tyro.conf.OmitArgPrefixes,))
        return {**_values(flags, given), "flags": flags}
    except SystemExit as exc:
        if exc.code:
            parser.error(_one_line(captured.getvalue()))
        raise
    except ValueError as exc:
        parser.error(str(exc))
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
