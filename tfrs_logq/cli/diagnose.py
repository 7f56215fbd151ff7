"""``tfrs-logq diagnose``: gradient bias against the full softmax (`tfrs_logq.studies.diagnose`)."""

from __future__ import annotations

import json
import os

from tfrs_logq.cli._common import add_flag, add_verbose, comma_list, int_at_least, read_model_config


def populate(p) -> None:
    from tfrs_logq.losses import CORRECTIONS
    from tfrs_logq.studies.diagnose import SAMPLERS

    source = p.add_mutually_exclusive_group(required=True)
    add_flag(source, "model-dir", metavar="DIR",
             help="a `tfrs-logq train` run (default: none; this or --synthetic-items is required)")
    add_flag(source, "synthetic-items", type=int_at_least(2), metavar="N",
             help="the synthetic stream's ground-truth model with N items (default: none)")
    add_flag(p, "data-dir", metavar="DIR", help="data of --model-dir (default: its saved data_dir)")
    add_flag(p, "queries", type=int_at_least(1), default=256, metavar="N",
             help="queries (test users of --model-dir, users of the stream)")
    add_flag(p, "samplers", type=comma_list(SAMPLERS), default="in-batch", metavar="LIST",
             help="comma-separated samplers")
    add_flag(p, "num-negatives", type=comma_list(item=int_at_least(1)), default="16,64,256",
             metavar="LIST", help="comma-separated numbers of negatives k")
    add_flag(p, "corrections", type=comma_list(CORRECTIONS), default=",".join(CORRECTIONS),
             metavar="LIST", help="comma-separated corrections")
    add_flag(p, "draws", type=int_at_least(2), default=200, metavar="T",
             help="Monte Carlo draws of the negatives per sampler and k")
    add_flag(p, "exact", action="store_true",
             help="enumerate every draw instead of Monte Carlo (tiny catalogs only)")
    add_flag(p, "seed", type=int_at_least(0), default=0, help="seed of queries and draws")
    add_flag(p, "output-dir", metavar="DIR",
             help="write diagnose.json, diagnose.md and diagnose.png there (default: none, "
                  "print only)")
    add_flag(p, "json", action="store_true", help="print the result as one JSON object")
    add_verbose(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tfrs_logq.studies import diagnose as diag

    if args.model_dir:
        read_model_config(args.model_dir)
        inputs = diag.model_dir_inputs(args.model_dir, args.queries, seed=args.seed,
                                       data_dir=args.data_dir)
        source = {"model_dir": os.path.abspath(args.model_dir)}
    else:
        inputs = diag.synthetic_inputs(args.synthetic_items, args.queries, seed=args.seed)
        source = {"synthetic_items": args.synthetic_items}
    result = diag.diagnose(*inputs, samplers=args.samplers, num_negatives=args.num_negatives,
                           corrections=args.corrections, num_draws=args.draws, seed=args.seed,
                           exact=args.exact)
    result.pop("_per_query")
    result = {**source, **result}
    if args.output_dir:
        from tfrs_logq._util.atomic import write_json, write_text

        os.makedirs(args.output_dir, exist_ok=True)
        write_json(os.path.join(args.output_dir, "diagnose.json"), result)
        write_text(os.path.join(args.output_dir, "diagnose.md"), diag.format_table(result) + "\n")
        diag.plot(result, os.path.join(args.output_dir, "diagnose.png"))  # atomic
    print(json.dumps(result) if args.json else diag.format_table(result))
    return 0


