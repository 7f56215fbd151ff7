"""``tfrs-logq evaluate``: Recall@k through a TF Serving endpoint
(`tfrs_logq.serving.evaluation.evaluate_through_server`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal, Optional

from tyro.conf import arg

from tfrs_logq.cli._common import LoadOptions, load_options, read_model_config, require_modules
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
from tfrs_logq.pipelines.splits import SPLITS


@dataclasses.dataclass
class DataOptions:
    """The model's data, unless given."""

    dataset: Annotated[Optional[Literal[DATASETS]], shown("the model's")] = None
    """the dataset evaluated"""
    split: Annotated[Optional[Literal[SPLITS]], shown("the model's")] = None
    """the split whose test targets are evaluated"""
    data_dir: Annotated[Optional[str], arg(metavar="DIR"), shown("the model's")] = None
    """directory holding the data files"""
    data_format: Annotated[Optional[Literal[ML1M_FORMATS]], shown("the model's")] = None
    """ML-1M source: MovieLens's ratings.dat or SASRec's ml-1m.txt"""


def host_port(text: str) -> str:
    """``HOST:PORT`` (``[::1]:8500`` for IPv6), checked before anything waits on it."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"argument --server: expected HOST:PORT with a port in 1-65535 "
                         f"(like 127.0.0.1:8500), got {text!r}")
    return text


@dataclasses.dataclass
class Flags(Verbose):
    """Recall@k through a TF Serving endpoint, beside the exact figures"""

    server: Annotated[str, arg(metavar="HOST:PORT")]
    """the gRPC endpoint"""
    model_name: Annotated[str, arg(metavar="NAME", aliases=("--model_name",))]
    """the servable's name"""
    model_dir: Annotated[str, arg(metavar="DIR")]
    """the training output of the served model (its data, and the exact figures)"""
    max_targets: Annotated[Optional[int], shown("all")] = None
    """evaluate a seeded sample of this many test targets"""
    timeout: Annotated[float, arg(metavar="SECONDS")] = 10.0
    """how long to wait for the server to answer at start"""
    json: bool = False
    """print one JSON object"""
    data: Annotated[DataOptions, arg(name="data")] = dataclasses.field(
        default_factory=DataOptions)
    load: Annotated[LoadOptions, arg(name="data loading")] = dataclasses.field(
        default_factory=LoadOptions)

    def __post_init__(self) -> None:
        host_port(self.server)
        check(self, at_least={"max_targets": 1}, above={"timeout": 0})


def run(args) -> int:
    require_modules("tensorflow_serving", "grpc")  # the serving extra, before the data is read
    from tfrs_logq.serving.evaluation import evaluate_through_server

    read_model_config(args.model_dir)  # a directory that is no training output: one line
    if getattr(args, "max_bad_share", None) is not None:
        raise ValueError("--max-bad-share is a flag of data stats and train: evaluate reads "
                         "the data as the run read it.")
    result = evaluate_through_server(
        args.server, args.model_name, args.model_dir, dataset=args.dataset, split=args.split,
        data_dir=args.data_dir, data_format=args.data_format, max_targets=args.max_targets,
        timeout=args.timeout, load_options=load_options(args))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
