"""``tfrs-logq demo``: none/logq-tfrs/corrected on the synthetic stream
(`tfrs_logq.studies.demo`)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated, Literal

from tyro.conf import arg

from tfrs_logq.cli._flags import Verbose, check, values
from tfrs_logq.losses import CORRECTIONS
from tfrs_logq.studies.demo import DemoConfig


@dataclasses.dataclass
class DemoOptions(DemoConfig):  # `DemoConfig`'s fields as flags: help, choices, bounds
    num_items: int = DemoConfig.num_items
    """catalog size of the synthetic stream"""
    num_users: int = DemoConfig.num_users
    """users of the synthetic stream"""
    num_topics: int = DemoConfig.num_topics
    """topics of the synthetic stream: with --topic-sharpness, the regime knob (many sharp
    topics make the positive a large share of the standard loss's denominator; memory 16 B
    x users x topics)"""
    topic_sharpness: float = DemoConfig.topic_sharpness
    """scale of the users' topic logits"""
    batch_size: int = DemoConfig.batch_size
    """in-batch negatives per step"""
    steps: int = DemoConfig.steps
    """training steps per correction"""
    embedding_dim: int = DemoConfig.embedding_dim
    """embedding size"""
    learning_rate: float = DemoConfig.learning_rate
    """Adam's learning rate"""
    num_eval: int = DemoConfig.num_eval
    """held-out targets for Recall@k"""
    frequency: Literal["count-min", "true"] = DemoConfig.frequency
    """where log Q comes from: an in-graph count-min sketch updated while training, or the
    generator's true unigram Q"""
    corrections: tuple[Literal[CORRECTIONS], ...] = tuple(DemoConfig.corrections)
    """corrections to compare"""
    seed: int = DemoConfig.seed
    """random seed"""

    def __post_init__(self) -> None:
        check(self, at_least={"seed": 0, **dict.fromkeys(
            ("num_items", "num_users", "num_topics", "batch_size", "steps", "embedding_dim",
             "num_eval"), 1)}, above={"topic_sharpness": 0, "learning_rate": 0})


@dataclasses.dataclass
class Flags(Verbose):
    output_dir: Annotated[str, arg(metavar="DIR")] = "demo_output"
    """where results.csv and recall.png go"""
    json: bool = False
    """print the results as one JSON object"""
    demo: Annotated[DemoOptions, arg(name="the synthetic stream, model and budget")] = \
        dataclasses.field(default_factory=DemoOptions)


def run(args) -> int:
    from tfrs_logq.studies.demo import run_demo

    config = DemoConfig(**values(args, DemoConfig))
    config.corrections = tuple(config.corrections)
    verbose = 2 if args.json or not sys.stdout.isatty() else 1
    run_demo(config, args.output_dir, verbose=0 if args.json else verbose, as_json=args.json)
    return 0
