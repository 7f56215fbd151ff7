"""``tfrs-logq diagnose``: gradient bias against the full softmax (`tfrs_logq.studies.diagnose`)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Annotated, Literal, Optional

from tyro.conf import arg, create_mutex_group

from tfrs_logq.cli._common import read_model_config
from tfrs_logq.cli._flags import Verbose, check, shown
from tfrs_logq.corrections import CORRECTIONS

SAMPLERS = ("in-batch", "uniform", "mixed", "mixed-unigram")  # `studies.diagnose.SAMPLERS`


# One model is diagnosed: a trained run's, or the synthetic stream's ground truth.
_MODEL = create_mutex_group(required=True, title="the model (one of)")


@dataclasses.dataclass
class Flags(Verbose):
    """gradient bias of none/logq/corrected against the full softmax"""

    model_dir: Annotated[Optional[str], arg(metavar="DIR"), _MODEL] = None
    """a `tfrs-logq train` run"""
    synthetic_items: Annotated[Optional[int], _MODEL] = None
    """the synthetic stream's ground-truth model with N items"""
    data_dir: Annotated[Optional[str], arg(metavar="DIR"), shown("its saved data_dir")] = None
    """data of --model-dir"""
    queries: int = 256
    """queries (test users of --model-dir, users of the stream)"""
    samplers: tuple[Literal[SAMPLERS], ...] = ("in-batch",)
    """samplers"""
    num_sampled: tuple[int, ...] = (16, 64, 256)
    """numbers k of negatives sampled per query"""
    loss: tuple[Literal[CORRECTIONS], ...] = CORRECTIONS
    """the losses compared: sampled softmax with each of these corrections"""
    draws: int = 200
    """Monte Carlo draws of the negatives per sampler and k"""
    exact: bool = False
    """enumerate every draw instead of Monte Carlo (tiny catalogs only)"""
    seed: int = 0
    """seed of queries and draws"""
    output_dir: Annotated[Optional[str], arg(metavar="DIR"), shown("none, print only")] = None
    """write diagnose.json, diagnose.md and diagnose.png there"""
    json: bool = False
    """print the result as one JSON object"""

    def __post_init__(self) -> None:
        check(self, at_least={"synthetic_items": 2, "queries": 1, "num_sampled": 1,
                              "draws": 2, "seed": 0})


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
    result = diag.diagnose(*inputs, samplers=args.samplers, num_negatives=args.num_sampled,
                           corrections=args.loss, num_draws=args.draws, seed=args.seed,
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
