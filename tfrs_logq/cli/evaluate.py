"""``tfrs-logq evaluate``: Recall@k through a TF Serving endpoint
(`tfrs_logq.serving.evaluation.evaluate_through_server`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from tfrs_logq.cli._common import LoadOptions, load_options, read_model_config, require_modules
from tfrs_logq.cli._flags import add_flags, add_train_flags, flag


def host_port(text: str) -> str:
    """``HOST:PORT`` (``[::1]:8500`` for IPv6), checked before anything waits on it."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"expected HOST:PORT with a port in 1-65535 (like 127.0.0.1:8500), got {text!r}")
    return text


@dataclasses.dataclass
class EvaluateFlags:
    server: str = flag(type=host_port, metavar="HOST:PORT")
    """the gRPC endpoint"""
    model_name: str = flag(style="_", metavar="NAME")
    """the servable's name"""
    model_dir: str = flag(metavar="DIR")
    """the training output of the served model (its data, and the exact figures)"""
    max_targets: Optional[int] = flag(None, at_least=1, default_text="all")
    """evaluate a seeded sample of this many test targets"""
    timeout: float = flag(10.0, above=0, metavar="SECONDS")
    """how long to wait for the server to answer at start"""
    json: bool = False
    """print one JSON object"""


def populate(p) -> None:
    add_flags(p, EvaluateFlags)
    model = {"default_text": "the model's"}
    add_train_flags(p, only=("dataset", "split", "data_dir", "data_format"),
                    meta={name: model for name in ("dataset", "split", "data_format")})
    add_flags(p, LoadOptions, group="data")


def run(args) -> int:
    require_modules("tensorflow_serving", "grpc")  # the serving extra, before the data is read
    from tfrs_logq.serving.evaluation import evaluate_through_server

    read_model_config(args.model_dir)  # a directory that is no training output: one line
    result = evaluate_through_server(
        args.server, args.model_name, args.model_dir, dataset=args.dataset, split=args.split,
        data_dir=args.data_dir, data_format=args.data_format, max_targets=args.max_targets,
        timeout=args.timeout, load_options=load_options(args))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
