"""``tfrs-logq serve``: TF Serving's gRPC and REST APIs (`tfrs_logq.serving.server`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Annotated

from tyro.conf import arg

from tfrs_logq.cli._common import log_handler, require_modules
from tfrs_logq.cli._flags import Verbose
from tfrs_logq.serving.options import ServerOptions


# TF Serving's flag names: --model_name, --model_base_path (help shows that spelling; tyro
# takes either spelling of every flag). `ServerOptions` checks the values, for the Python
# API too: ports in 0-65535, sizes and timeouts at least 1 or 0.
@dataclasses.dataclass
class ServeOptions(ServerOptions):
    model_name: Annotated[str, arg(metavar="NAME", aliases=("--model_name",))]
    """the servable's name, as clients ask for it"""
    model_base_path: Annotated[str, arg(metavar="DIR", aliases=("--model_base_path",))]
    """TF Serving's base path: the directory of integer versions"""
    port: int = ServerOptions.port
    """gRPC port (0: any free port)"""
    rest_api_port: int = ServerOptions.rest_api_port
    """REST port (0: any free port)"""
    host: str = ServerOptions.host
    """address to bind (loopback only unless told)"""
    file_system_poll_wait_seconds: float = ServerOptions.file_system_poll_wait_seconds
    """seconds between looks for a new version"""
    max_batch_size: int = ServerOptions.max_batch_size
    """most rows batched into one model call"""
    batch_timeout_micros: int = ServerOptions.batch_timeout_micros
    """longest wait for a batch to fill"""
    max_request_rows: int = ServerOptions.max_request_rows
    """most rows in one request"""
    max_rows_times_k: int = ServerOptions.max_rows_times_k
    """most results one request may ask for, rows x k (and most in one batched model
    call)"""
    max_request_bytes: int = ServerOptions.max_request_bytes
    """largest request (REST body, gRPC message)"""
    max_response_bytes: int = ServerOptions.max_response_bytes
    """largest reply (REST body, gRPC message)"""
    num_threads: int = ServerOptions.num_threads
    """gRPC worker threads"""
    rest_api_num_threads: int = ServerOptions.rest_api_num_threads
    """REST worker threads (connections beyond them wait, not fail)"""
    rest_api_timeout_in_ms: int = ServerOptions.rest_api_timeout_in_ms
    """REST: longest a client may take to send a request (its headers, then its body), in
    ms"""
    request_timeout_in_ms: int = ServerOptions.request_timeout_in_ms
    """longest a request waits for its batch's result, in ms (then DEADLINE_EXCEEDED / HTTP
    504)"""
    drain_timeout_in_ms: int = ServerOptions.drain_timeout_in_ms
    """on SIGTERM or SIGINT, longest the shutdown may take (the grace, then requests in
    flight finishing), in ms"""
    drain_grace_in_ms: int = ServerOptions.drain_grace_in_ms
    """first part of the drain: readiness fails and replies say Connection: close while the
    ports still accept, in ms"""


@dataclasses.dataclass
class Flags(Verbose):
    """serve exports with TF Serving's gRPC and REST APIs"""

    server: Annotated[ServeOptions, arg(name="server")]


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


def run(args) -> int:
    require_modules("tensorflow_serving", "grpc", "uvicorn", "starlette")  # the serving extra
    from tfrs_logq.serving.server import ModelServer

    # Checks the name (as export does), the ports (0-65535), the counts and timeouts.
    options = ServerOptions(**dataclasses.asdict(args.flags.server))
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
    log_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    server = ModelServer(options).start()
    print(f"serving {args.model_name} from {args.model_base_path}: gRPC {args.host}:"
          f"{server.port}, REST {args.host}:{server.rest_port}", flush=True)
    server.serve_until_signal()  # SIGTERM/SIGINT: drain requests in flight, log, exit 0
    return 0


