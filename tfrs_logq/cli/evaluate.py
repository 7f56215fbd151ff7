"""``tfrs-logq evaluate``: Recall@k through a TF Serving endpoint
(`tfrs_logq.serving.evaluation.evaluate_through_server`)."""

from __future__ import annotations

import json

from tfrs_logq.cli._common import (
    TF_SERVING_STYLE,
    add_flag,
    add_verbose,
    float_in,
    int_at_least,
    load_options,
    read_model_config,
)
from tfrs_logq.cli._dataclass_flags import add_data_flags


def populate(p) -> None:
    add_flag(p, "server", required=True, metavar="HOST:PORT", help="the gRPC endpoint")
    add_flag(p, "model_name", style=TF_SERVING_STYLE, required=True, metavar="NAME",
             help="the servable's name")
    add_flag(p, "model-dir", required=True, metavar="DIR",
             help="the training output of the served model (its data, and the exact figures)")
    add_data_flags(p, "the model's", "the model's")
    add_flag(p, "max-targets", type=int_at_least(1), default=None, metavar="N",
             help="evaluate a seeded sample of this many test targets (default: all)")
    add_flag(p, "timeout", type=float_in(0.0), default=10.0, metavar="SECONDS",
             help="how long to wait for the server to answer at start")
    add_flag(p, "json", action="store_true", help="print one JSON object")
    add_verbose(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tfrs_logq.serving.evaluation import evaluate_through_server

    read_model_config(args.model_dir)  # a directory that is no training output: one line
    result = evaluate_through_server(
        args.server, args.model_name, args.model_dir, dataset=args.dataset, split=args.split,
        data_dir=args.data_dir, data_format=args.data_format, max_targets=args.max_targets,
        timeout=args.timeout, load_options=load_options(args))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


