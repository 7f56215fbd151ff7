"""Plumbing shared by the commands: value types, the parser, flag spellings, output.

Every flag takes both spellings, ``--data-dir`` and ``--data_dir``; help shows one:
dashes, except TF Serving's own names (``--model_base_path``, ``--port``, ...). A
command's flags are added when that command is parsed or its help printed
(`LazyParser`), so building the command tree imports nothing they need.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Callable, Optional, Sequence

PROG = "tfrs-logq"
# TF Serving's flag names, kept as its model server spells them.
TF_SERVING_STYLE = "_"
# Exit statuses: an error a user can fix (bad flags, data, files, ports, servers), and
# `pipeline run` when the Evaluator did not bless the model.
USER_ERROR_EXIT = 2
NOT_BLESSED_EXIT = 3


# ------------------------------------------------------------------------ value types


def int_at_least(low: int) -> Callable[[str], int]:
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


def float_in(low: float, high: Optional[float] = None, low_inclusive: bool = False,
             high_inclusive: bool = False):
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        below_high = high is None or (value <= high if high_inclusive else value < high)
        ok = (value >= low if low_inclusive else value > low) and below_high
        if not ok:
            left = "[" if low_inclusive else "("
            right = ("inf)" if high is None else f"{high}]" if high_inclusive else f"{high})")
            raise argparse.ArgumentTypeError(f"must be in {left}{low}, {right}, got {text}")
        return value

    convert.__name__ = "number"
    return convert


def comma_list(choices: Optional[Sequence[str]] = None, item=str):
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


class HelpFormatter(argparse.HelpFormatter):
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


class LazyParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose arguments are added on first use by ``populate``,
    so building the command tree imports nothing a command's flags need."""

    def __init__(self, *args, populate: Optional[Callable] = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
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


class Switch(argparse.Action):
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


def add_flag(parser, name: str, *, style: str = "-", aliases: Sequence[str] = (), **kwargs):
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
    if isinstance(action, Switch):
        shown.add(f"--no{style}{body}")
    action.hidden = set(action.option_strings) - shown
    return action


def add_verbose(parser, top: bool = False) -> None:
    add_flag(parser, "verbose", action="store_true",
             default=False if top else argparse.SUPPRESS,
             help="show tracebacks and TensorFlow's start-up logs (default: off)")


# ---------------------------------------------------------------- shared by commands


def load_options(args) -> dict:
    return {"skip_bad_lines": args.skip_bad_lines, "use_cache": not args.no_cache,
            "download_ok": not args.no_download}


def data_record(interactions) -> dict:
    return {"source": interactions.source, "data_format": interactions.data_format,
            "rows": interactions.num_rows, "skipped_lines": interactions.skipped_lines}


def read_model_config(model_dir: str) -> dict:
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


SMOKE_WARNING = ("smoke preset: a plumbing check, not a usable model; use --preset cpu for a "
                 "useful one")


def warn_if_smoke(preset: Optional[str]) -> None:
    """One line on stderr when a run trained with the smoke preset (its recall is near
    random: the README's walkthrough measured test Recall@10 0.0023 on ML-1M)."""
    if preset == "smoke":
        print(f"{PROG}: warning: {SMOKE_WARNING}", file=sys.stderr)


# `pipeline run`'s exit status when the Evaluator did not bless the model (2 is an error).
# ------------------------------------------------------------------- output and errors


class _StderrHandler(logging.Handler):
    """Writes to the current ``sys.stderr`` (which tests and callers may replace)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 (logging must not raise)
            self.handleError(record)


log_handler = _StderrHandler()


