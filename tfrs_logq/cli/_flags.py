"""What the commands' flag dataclasses share: ``--verbose`` (`Verbose`), bounds checked in
``__post_init__`` (`check`) and the fields a user gave (`given`).
A field is a flag (``max_length``: ``--max-length``), its type the value's (``Literal`` the
choices, a bool ``--x``/``--no-x``, a tuple a list: ``--seeds 0 1 2``), its docstring the
help, a nested dataclass a help group; `tyro.conf.arg` gives a name or an alias."""

from __future__ import annotations

import dataclasses
import operator

import tyro


@dataclasses.dataclass(kw_only=True)
class Verbose:
    """Every command's flag: each ``Flags`` subclasses this."""

    verbose: bool = False
    """show tracebacks and TensorFlow's start-up logs"""


def shown(text: str):
    """The marker of a flag whose help shows ``(default: text)``."""
    return tyro.conf.arg(help_behavior_hint=f"(default: {text})")


_BOUNDS = {"at_least": (">=", operator.ge), "above": (">", operator.gt),
           "at_most": ("<=", operator.le)}


def check(flags, names=None, **bounds: dict) -> None:
    """``flags``' fields within ``bounds`` (``at_least``, ``above``, ``at_most``: ``{field:
    bound}``), each item of a list, and no list or text empty; else ValueError ``argument --x: must
    be >= 1, got 0`` (``names``: ``{field: flag}`` where the flag is not the field's name)."""
    def flag(name: str) -> str:
        return (names or {}).get(name, name).replace("_", "-")

    for field in dataclasses.fields(flags):
        if getattr(flags, field.name) in ((), ""):  # no list, path or name is empty
            raise ValueError(f"argument --{flag(field.name)}: empty; name at least one value")
    for key, limits in bounds.items():
        sign, within = _BOUNDS[key]
        for name, bound in limits.items():
            value = getattr(flags, name)
            for item in value if isinstance(value, tuple) else (value,):
                if item is not None and not within(item, bound):
                    raise ValueError(f"argument --{flag(name)}: must be {sign} "
                                     f"{bound}, got {item}")


def given(config, names: set) -> dict:
    """``{field: value}`` of the dataclass ``config``'s fields named in ``names`` (the flags
    given, `app.namespace`): what a user set, over a preset or a file."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.name in names}
