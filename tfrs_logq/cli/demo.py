"""``tfrs-logq demo``: none/logq-tfrs/corrected on the synthetic stream
(`tfrs_logq.studies.demo`)."""

from __future__ import annotations

import dataclasses
import sys
import typing

from tfrs_logq.cli._flags import add_flags, flag, values
from tfrs_logq.losses import CORRECTIONS
from tfrs_logq.studies.demo import DemoConfig

# What the flags of `DemoConfig`'s fields need beyond the dataclass: help, choices, bounds.
_META = {
    "num_items": {"help": "catalog size of the synthetic stream"},
    "num_users": {"help": "users of the synthetic stream"},
    "num_topics": {"help": "topics of the synthetic stream: with --topic-sharpness, the regime "
                           "knob (many sharp topics make the positive a large share of the "
                           "standard loss's denominator; memory 16 B x users x topics)"},
    "topic_sharpness": {"help": "scale of the users' topic logits"},
    "batch_size": {"help": "in-batch negatives per step"},
    "steps": {"help": "training steps per correction"},
    "embedding_dim": {"help": "embedding size"},
    "learning_rate": {"help": "Adam's learning rate"},
    "num_eval": {"help": "held-out targets for Recall@k"},
    "frequency": {"help": "where log Q comes from: an in-graph count-min sketch updated while "
                          "training, or the generator's true unigram Q",
                  "choices": ("count-min", "true")},
    "corrections": {"help": "corrections to compare", "choices": CORRECTIONS},
    "seed": {"help": "random seed", "at_least": 0},
}


@dataclasses.dataclass
class DemoFlags:
    output_dir: str = flag("demo_output", metavar="DIR")
    """where results.csv and recall.png go"""
    json: bool = False
    """print the results as one JSON object"""


def populate(p) -> None:
    bounds = {int: {"at_least": 1}, float: {"above": 0}}  # sizes and rates
    meta = {name: {**bounds.get(hint, {}), **_META.get(name, {})}
            for name, hint in typing.get_type_hints(DemoConfig).items()}
    add_flags(p, DemoFlags, only=("output_dir",))
    add_flags(p, DemoConfig, meta=meta)
    add_flags(p, DemoFlags, only=("json",))


def run(args) -> int:
    from tfrs_logq.studies.demo import run_demo

    config = DemoConfig(**values(args, DemoConfig))
    config.corrections = tuple(config.corrections)
    verbose = 2 if args.json or not sys.stdout.isatty() else 1
    run_demo(config, args.output_dir, verbose=0 if args.json else verbose, as_json=args.json)
    return 0
