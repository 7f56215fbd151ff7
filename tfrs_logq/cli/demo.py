"""``tfrs-logq demo``: none/logq/corrected on the synthetic stream (`tfrs_logq.studies.demo`)."""

from __future__ import annotations

import dataclasses
import sys

from tfrs_logq.cli._common import add_flag, add_verbose, comma_list
from tfrs_logq.cli._dataclass_flags import dataclass_fields, field_spec


def populate(p) -> None:
    from tfrs_logq.losses import CORRECTIONS
    from tfrs_logq.studies.demo import DemoConfig

    help_text = {
        "num_items": "catalog size of the synthetic stream",
        "num_users": "users of the synthetic stream",
        "num_topics": "topics of the synthetic stream: with --topic-sharpness, the regime "
                      "knob (many sharp topics make the positive a large share of the "
                      "standard loss's denominator; memory 16 B x users x topics)",
        "topic_sharpness": "scale of the users' topic logits",
        "batch_size": "in-batch negatives per step",
        "steps": "training steps per correction",
        "embedding_dim": "embedding size",
        "learning_rate": "Adam's learning rate",
        "num_eval": "held-out targets for Recall@k",
        "frequency": "where log Q comes from: an in-graph count-min sketch updated while "
                     "training, or the generator's true unigram Q",
        "corrections": "comma-separated corrections to compare",
        "seed": "random seed",
    }
    choices = {"frequency": ("count-min", "true")}
    add_flag(p, "output-dir", default="demo_output", metavar="DIR",
             help="where results.csv and recall.png go")
    for field in dataclass_fields(DemoConfig):
        spec = field_spec(field.name, field.kind, choices, non_negative=("seed",))
        if field.name == "corrections":
            spec = {"type": comma_list(CORRECTIONS), "metavar": "LIST"}
        add_flag(p, field.name, dest=field.name, default=field.default,
                 help=help_text.get(field.name, f"DemoConfig.{field.name}"), **spec)
    add_flag(p, "json", action="store_true", help="print the results as one JSON object")
    add_verbose(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tfrs_logq.studies.demo import DemoConfig, run_demo

    config = DemoConfig(**{f.name: getattr(args, f.name)
                           for f in dataclasses.fields(DemoConfig)})
    config.corrections = tuple(config.corrections)
    verbose = 2 if args.json or not sys.stdout.isatty() else 1
    run_demo(config, args.output_dir, verbose=0 if args.json else verbose, as_json=args.json)
    return 0


