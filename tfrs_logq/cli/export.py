"""``tfrs-logq export``: a trained model as a TF Serving version (`tfrs_logq.serving.export`)."""

from __future__ import annotations

import os
import sys

from tfrs_logq.cli._common import (
    TF_SERVING_STYLE,
    add_flag,
    add_verbose,
    float_in,
    int_at_least,
    read_model_config,
)


def populate(p) -> None:
    from tfrs_logq.serving.export import DEFAULT_SEARCH_FRACTION, INDEXES

    add_flag(p, "model-dir", required=True, metavar="DIR", help="the output of `tfrs-logq train`")
    add_flag(p, "model_base_path", style=TF_SERVING_STYLE, required=True, metavar="DIR",
             help="TF Serving's base path: the directory of integer versions this export adds to")
    add_flag(p, "model_name", style=TF_SERVING_STYLE, required=True, metavar="NAME",
             help="the servable's name")
    add_flag(p, "version", type=int_at_least(1), default=None, metavar="N",
             help="integer version (default: the next free one)")
    add_flag(p, "index", choices=INDEXES, default=INDEXES[0],
             help="scann: ScaNN index (needs the ScaNN ops to serve); brute-force: exact, stock "
                  "TensorFlow ops only")
    add_flag(p, "k", type=int_at_least(1), default=100, metavar="N",
             help="results of serving_default (top_k takes k per request)")
    add_flag(p, "scann-search-fraction", type=float_in(0.0, 1.0, high_inclusive=True),
             default=DEFAULT_SEARCH_FRACTION, metavar="F",
             help="share of the ScaNN tree's leaves a query searches, catalogs of 20,000 "
                  "items or more (at 1M items 0.2 keeps about 0.85 of the exact top-1,000 "
                  "where 0.05 keeps about half: docs/export.md)")
    add_verbose(p)
    p.set_defaults(run=run)


def run(args) -> int:
    base = args.model_base_path
    if os.path.exists(base) and not os.path.isdir(base):
        raise NotADirectoryError(
            f"--model_base_path {base} is a file, not a directory: give the directory that "
            "holds (or will hold) the model's integer versions.")
    read_model_config(args.model_dir)
    from tfrs_logq.serving.export import check_model_name, export_version

    check_model_name(args.model_name)
    old_layout = os.path.join(base, args.model_name)
    if os.path.isdir(old_layout) and any(d.isdigit() for d in os.listdir(old_layout)):
        print(f"tfrs-logq: warning: --model_base_path is TF Serving's base path (the directory "
              f"of versions) since 0.2; {old_layout} holds versions of the old layout "
              f"(BASE/NAME/VERSION), so this version goes there too. Pass --model_base_path "
              f"{old_layout} to silence this.", file=sys.stderr)
        base = old_layout
    path = export_version(args.model_dir, base, version=args.version, index=args.index,
                          default_k=args.k, search_fraction=args.scann_search_fraction)
    print(path)
    return 0


