"""The `tfrs-logq` command tree and `main`: logging, one-line errors and exit codes.

Building the parser imports neither tyro nor TensorFlow: argparse takes the command's
words, tyro its flags (`_flags`); a command's module (its flags and its handler) is
imported when that command is parsed or its help printed, and
TensorFlow's start-up logs are silenced before anything imports it (``--verbose``
keeps them). Errors a user can fix (bad flags, data, files, ports, servers) end the
command with one line, ``tfrs-logq: error: ...`` on stderr, and exit status 2;
``--verbose`` adds the traceback. Ctrl-C exits 130; ``pipeline run`` exits 3 when its
Evaluator does not bless the model.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from typing import Callable, Optional, Sequence

from tfrs_logq.cli._common import PROG, USER_ERROR_EXIT, cut, log_handler

# (path, module, help): one module of `tfrs_logq.cli` per command, its flags (``Flags``)
# and its handler (``run``).
COMMANDS = (
    (("demo",), "demo",
     "train none/logq/corrected on the synthetic stream; compare Recall@k"),
    (("data", "stats"), "data",
     "the file used, users, items, interactions and split sizes"),
    (("train",), "train", "train SASRec with one of the paper's losses"),
    (("compare",), "compare",
     "standard against corrected logQ on your own log: paired seeds, intervals, a verdict"),
    (("diagnose",), "diagnose", "gradient bias of none/logq/corrected against the full softmax"),
    (("export",), "export", "export a trained model as a TF Serving SavedModel"),
    (("serve",), "serve", "serve exports with TF Serving's gRPC and REST APIs"),
    (("evaluate",), "evaluate",
     "Recall@k through a TF Serving endpoint, beside the exact figures"),
    (("pipeline", "run"), "pipeline",
     "ExampleGen, Statistics, Trainer, Exporter, BulkInferrer, Evaluator and Pusher into "
     "--pipeline-root, skipping current components"),
)
# Commands that only group others.
GROUPS = {"data": "dataset tools", "pipeline": "the batch pipeline on Apache Beam"}
VERBOSE = "show tracebacks and TensorFlow's start-up logs (default: off)"


class Parser(argparse.ArgumentParser):
    """The command tree (argparse); a command's words go to its module's ``Flags``
    (`_flags.parse`, tyro), the module imported then."""

    def __init__(self, *args, module=None, root=PROG, top=False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.module, self.root, self.top, self.commands = module, root, top, {}

    def error(self, message: str):
        self.exit(USER_ERROR_EXIT,
                  f"{self.root}: error: {cut(message)} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args, node, n = [str(a) for a in (sys.argv[1:] if args is None else args)], self, 0
        while self.top and n < len(args) and node.module is None and (
                args[n] == "--verbose" or args[n] in node.commands):
            node, n = node.commands.get(args[n], node), n + 1
        if node.module is None or node is self:  # help, --version, errors, subparsers
            return super().parse_known_args(args, namespace)
        namespace, _ = super().parse_known_args(args[:n], namespace)
        from tfrs_logq.cli._flags import parse

        module = importlib.import_module(node.module)
        vars(namespace).update(parse(module.Flags, args[n:], node,
                                     getattr(module, "UNDERSCORES", False)))
        namespace.run = module.run
        return namespace, []


def build_parser(commands=COMMANDS, *, package: str = "tfrs_logq.cli", prog: str = PROG,
                 description: str = "Corrected logQ correction of sampled softmax for TFRS "
                                    "retrieval.") -> argparse.ArgumentParser:
    """The `tfrs-logq` parser: argparse takes the command's words, tyro its flags (a
    command's module is imported when it is parsed or its help printed).

    ``commands`` (``(path, module, help)``, modules of ``package``) under ``prog``: the
    repository's ``python -m lab`` builds its own commands' parser with it."""
    from tfrs_logq._version import __version__

    parser = Parser(prog=prog, root=prog, top=True, description=description,
                    epilog=f"`{prog} COMMAND --help` lists a command's flags and their "
                           "defaults.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE)
    dests = {(): "command", ("data",): "data_command", ("pipeline",): "pipeline_command"}
    subparsers = {(): (parser, parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser))}
    for path, module, help_text in commands:
        parent = path[:-1]
        if parent not in subparsers:  # a group: `data`, `pipeline`
            above, actions = subparsers[parent[:-1]]
            group = actions.add_parser(parent[-1], help=GROUPS[parent[-1]], root=prog)
            group.add_argument("--verbose", action="store_true", help=VERBOSE)
            above.commands[parent[-1]] = group
            subparsers[parent] = (group, group.add_subparsers(
                dest=dests[parent], required=True, metavar="COMMAND", parser_class=Parser))
        above, actions = subparsers[parent]
        above.commands[path[-1]] = actions.add_parser(
            path[-1], module=f"{package}.{module}", help=help_text, root=prog, add_help=False)
    return parser


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
    if log_handler not in logger.handlers:
        logger.addHandler(log_handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


_EXTRAS = {"scann": "scann", "tensorflow_serving": "serving", "grpc": "serving",
           "uvicorn": "serving", "starlette": "serving",
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


def main(argv: Optional[Sequence[str]] = None, *,
         build: Callable[[], Parser] = build_parser) -> int:
    """Runs the command ``argv`` names (`sys.argv` by default) in ``build()``'s tree."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    _quiet_tensorflow(verbose)  # before any command imports TensorFlow
    beam_args: list = []
    if "--" in argv:  # `pipeline run ... -- BEAM FLAGS`: Beam's own pipeline options
        at = argv.index("--")
        argv, beam_args = argv[:at], argv[at + 1:]
    parser = build()
    args = parser.parse_args(argv)
    if beam_args:
        if getattr(args, "pipeline_command", None) != "run":
            parser.error("only `pipeline run` takes Beam pipeline options after --")
        args.beam_args = beam_args
    _configure_logging(verbose, parser.root)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"{parser.root}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not _is_user_error(exc):
            raise
        if verbose:
            traceback.print_exc()
        print(f"{parser.root}: error: {_one_line(exc)}", file=sys.stderr)
        return USER_ERROR_EXIT

