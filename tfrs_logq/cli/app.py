"""The `tfrs-logq` command tree and `main`: logging, one-line errors and exit codes.

One `tyro.cli` call parses the command line: each command is its module's ``Flags``
dataclass (free of TensorFlow), a subcommand of `COMMANDS`; ``data stats`` and ``pipeline
run`` are nested ones, and so are the models of ``train`` and ``compare`` (``train
two-tower``; the command's own flags may come before or after them, a model's after its
name, and without a name a command takes its default model's). The command's handler (its
module's ``run``) imports the library's TensorFlow parts after parsing, and TensorFlow's
start-up logs are silenced before anything imports it (``--verbose`` keeps them). A flag
tyro refuses is its own error message, exit status 2; a value a ``Flags`` (or a config)
refuses in ``__post_init__``, and an error a user can fix that a command raises (bad
data, files, ports, servers), end the command with one line, ``tfrs-logq: error: ...`` on
stderr, and exit status 2; ``--verbose`` adds the traceback. Ctrl-C exits 130, a closed
pipe on stdout 141 (as SIGPIPE ends other tools) without a message; ``pipeline run`` exits
3 when its Evaluator does not bless the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import traceback
import types
from typing import Annotated, Optional, Sequence, Union

import tyro
from tyro.conf import OmitArgPrefixes, OmitSubcommandPrefixes, Suppress, subcommand

from tfrs_logq.cli import compare, data, demo, diagnose, evaluate, export, pipeline, serve, train
from tfrs_logq.cli._common import PROG, USER_ERROR_EXIT, cut, log_handler


@dataclasses.dataclass
class Data:
    """dataset tools"""

    command: Union[Annotated[data.Flags, subcommand("stats")], Annotated[None, Suppress]]


@dataclasses.dataclass
class Pipeline:
    """the batch pipeline on Apache Beam"""

    command: Union[Annotated[pipeline.Flags, subcommand("run")], Annotated[None, Suppress]]


# Each command is its module's ``Flags``; the class docstring is its line of help.
COMMANDS = Union[
    Annotated[demo.Flags, subcommand("demo")], Annotated[Data, subcommand("data")],
    Annotated[train.Flags, subcommand("train")], Annotated[compare.Flags, subcommand("compare")],
    Annotated[diagnose.Flags, subcommand("diagnose")],
    Annotated[export.Flags, subcommand("export")], Annotated[serve.Flags, subcommand("serve")],
    Annotated[evaluate.Flags, subcommand("evaluate")],
    Annotated[Pipeline, subcommand("pipeline")],
]
DESCRIPTION = "Corrected logQ correction of sampled softmax for TFRS retrieval."


def parse(argv: Sequence[str], commands=COMMANDS, prog: str = PROG,
          description: str = DESCRIPTION):
    """The command's ``Flags`` of ``argv`` (`tyro.cli` over ``commands``); a ValueError
    of a ``__post_init__`` (a value out of bounds) is raised, not drawn as tyro's box."""
    def raise_value_error(event) -> None:  # not a value tyro could not convert: its box
        if type(event).__name__ == "InstantiationFailure" and event.argument is None:
            raise ValueError(event.message)

    # tyro's parse-error hook (tyro._errors, documented there as experimental): where a
    # tyro release lacks it, such a value is tyro's own message, exit status 2, as well.
    hook = getattr(getattr(tyro, "_errors", None), "on_parse_error", None)
    with hook(raise_value_error) if hook else contextlib.nullcontext():
        flags = tyro.cli(commands, args=list(argv), prog=prog, description=description,
                         config=(OmitSubcommandPrefixes, OmitArgPrefixes,
                                 tyro.conf.CascadeSubcommandArgs))
    return flags.command if isinstance(flags, (Data, Pipeline)) else flags  # a group's


def namespace(flags, argv: Sequence[str] = ()) -> types.SimpleNamespace:
    """What a command's ``run`` reads: each field of ``flags`` and of its nested dataclasses
    by name (an outer field over a nested one of its name), ``flags`` itself, and ``given``:
    the fields whose flags ``argv`` names (``--x``, ``--no-x``: ``x``)."""
    def fields(obj) -> dict:
        values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        out = {k: v for k, v in values.items() if not dataclasses.is_dataclass(v)}
        for value in values.values():
            if dataclasses.is_dataclass(value):
                out = {**fields(value), **out}
        return out

    given = {w.partition("=")[0][2:].removeprefix("no-").replace("-", "_") for w in argv
             if w.startswith("--")}
    return types.SimpleNamespace(**fields(flags), flags=flags, given=given)


def _quiet_tensorflow(verbose: bool) -> None:
    """Silences TensorFlow's (and gRPC's) start-up logs; must run before TF is imported."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ INFO, WARNING and ERROR
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    for name in ("tensorflow", "absl", "h5py"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _configure_logging(verbose: bool, prog: str = PROG) -> None:
    log_handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    logger = logging.getLogger("tfrs_logq")
    logger.addHandler(log_handler)  # once: a logger adds a handler it holds no second time
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


_EXTRAS = {"scann": "scann", "tensorflow_serving": "serving", "grpc": "serving", "uvicorn":
           "serving", "starlette": "serving", "tensorflow_datasets": "data", "apache_beam": "beam"}


def _is_user_error(exc: BaseException) -> bool:
    """Errors with a message a user can act on (not bugs)."""
    known = [ValueError, OSError, ImportError]
    for module, name in (("tfrs_logq.serving.errors", "ServingError"), ("grpc", "RpcError")):
        if module in sys.modules:  # loaded by the command, so it may raise these
            known.append(getattr(sys.modules[module], name))
    return isinstance(exc, tuple(known))


def _one_line(exc: BaseException) -> str:
    """The error's message on one line, long values cut."""
    grpc = sys.modules.get("grpc")
    text = str(exc) or type(exc).__name__
    if grpc is not None and isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        text = f"the server answered {exc.code().name}: {exc.details()}"
    elif isinstance(exc, ImportError) and _EXTRAS.get((exc.name or "").split(".")[0]):
        text = f"{exc}: install it with pip install 'tfrs-logq[{_EXTRAS[exc.name.split('.')[0]]}]'"
    elif isinstance(exc, OSError) and exc.strerror and len(exc.args) == 2:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else str(exc.strerror)
    return cut(" ".join(text.split("\n")).strip())


def main(argv: Optional[Sequence[str]] = None, *, commands=COMMANDS, prog: str = PROG,
         description: str = DESCRIPTION) -> int:
    """Runs the command ``argv`` names (`sys.argv` by default) among ``commands``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:
        from tfrs_logq._version import __version__

        print(f"{prog} {__version__}")
        return 0
    _quiet_tensorflow(verbose := "--verbose" in argv)  # before any command imports TensorFlow
    cut_at = argv.index("--") if "--" in argv else len(argv)  # `pipeline run ... -- BEAM`
    argv, beam_args = argv[:cut_at], argv[cut_at + 1:]  # Beam's own pipeline options
    _configure_logging(verbose, prog)
    try:
        flags = parse(argv, commands, prog, description)
        if beam_args and not isinstance(flags, pipeline.Flags):
            raise ValueError("only `pipeline run` takes Beam pipeline options after --")
        args = namespace(flags, argv)
        args.beam_args = beam_args
        return sys.modules[type(flags).__module__].run(args)  # the command's handler
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tfrs-logq ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a process SIGPIPE ends (128 + 13), like other tools in a pipe
    except Exception as exc:
        if not _is_user_error(exc):
            raise
        if verbose:
            traceback.print_exc()
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return USER_ERROR_EXIT
