"""``tfrs-logq diagnose``: gradient bias against the full softmax (`tfrs_logq.studies.diagnose`)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from tfrs_logq.cli._common import read_model_config
from tfrs_logq.cli._flags import add_flags, flag
from tfrs_logq.losses import CORRECTIONS
from tfrs_logq.studies.diagnose import SAMPLERS


@dataclasses.dataclass
class DiagnoseFlags:
    model_dir: Optional[str] = flag(None, metavar="DIR")
    """a `tfrs-logq train` run (this or --synthetic-items is required)"""
    synthetic_items: Optional[int] = flag(None, at_least=2)
    """the synthetic stream's ground-truth model with N items"""
    data_dir: Optional[str] = flag(None, metavar="DIR", default_text="its saved data_dir")
    """data of --model-dir"""
    queries: int = flag(256, at_least=1)
    """queries (test users of --model-dir, users of the stream)"""
    samplers: tuple[str, ...] = flag(("in-batch",), choices=SAMPLERS)
    """samplers"""
    num_negatives: tuple[int, ...] = flag((16, 64, 256), at_least=1)
    """numbers of negatives k"""
    corrections: tuple[str, ...] = flag(CORRECTIONS, choices=CORRECTIONS)
    """corrections"""
    draws: int = flag(200, at_least=2, metavar="T")
    """Monte Carlo draws of the negatives per sampler and k"""
    exact: bool = False
    """enumerate every draw instead of Monte Carlo (tiny catalogs only)"""
    seed: int = flag(0, at_least=0)
    """seed of queries and draws"""
    output_dir: Optional[str] = flag(None, metavar="DIR", default_text="none, print only")
    """write diagnose.json, diagnose.md and diagnose.png there"""
    json: bool = False
    """print the result as one JSON object"""


def populate(p) -> None:
    add_flags(p, DiagnoseFlags)


def run(args) -> int:
    from tfrs_logq.studies import diagnose as diag

    if (args.model_dir is None) == (args.synthetic_items is None):
        raise ValueError("give one of --model-dir DIR (a trained run) and --synthetic-items N "
                         "(the synthetic stream's model)")
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
