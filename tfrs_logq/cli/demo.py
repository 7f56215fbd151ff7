"""``tfrs-logq demo``: none/logq-tfrs/corrected on the synthetic stream
(`tfrs_logq.studies.demo`)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

from tyro.conf import arg

from tfrs_logq.cli._flags import Verbose, check
from tfrs_logq.studies.demo_config import DemoConfig


@dataclasses.dataclass
class DemoOptions(DemoConfig):
    """DemoConfig's fields, each run's."""

    def __post_init__(self) -> None:
        check(self, {"num_items": "synthetic_items", "num_users": "synthetic_users",
                     "corrections": "loss"}, at_least={"seed": 0, **dict.fromkeys(
            ("num_items", "num_users", "num_topics", "batch_size", "steps", "embedding_dim",
             "num_eval"), 1)}, above={"topic_sharpness": 0, "learning_rate": 0})


@dataclasses.dataclass
class Flags(Verbose):
    """train none/logq/corrected on the synthetic stream; compare Recall@k"""

    output_dir: Annotated[str, arg(metavar="DIR")] = "demo_output"
    """where results.csv and recall.png go"""
    json: bool = False
    """print the results as one JSON object"""
    demo: Annotated[DemoOptions, arg(name="the synthetic stream, model and budget")] = \
        dataclasses.field(default_factory=DemoOptions)


def run(args) -> int:
    from tfrs_logq.studies.demo import run_demo

    config = DemoConfig(**dataclasses.asdict(args.flags.demo))
    verbose = 2 if args.json or not sys.stdout.isatty() else 1
    run_demo(config, args.output_dir, verbose=0 if args.json else verbose, as_json=args.json)
    return 0
