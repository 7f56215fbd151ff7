"""`DemoConfig`: the demo's world, model and budget, free of TensorFlow (its fields are
``tfrs-logq demo``'s flags, their docstrings the help)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from tyro.conf import arg

from tfrs_logq.corrections import CORRECTIONS


@dataclasses.dataclass
class DemoConfig:
    """The demo's world, model and budget (``tfrs-logq demo``'s flags): every correction is
    trained on the same synthetic stream and evaluated against its exact truth."""

    # A world where the losses can differ (50 topics at sharpness 2.5 would put the
    # positive's share of the standard denominator at about 0.01, where standard and
    # corrected logQ coincide by construction). The regime knob: P(d|u)/Q(d) is about
    # num_topics * P(c|u), so many sharp topics put the share high: here the truth's median
    # P/Q is about 1,200 against 1,023 in-batch negatives, a share of about 0.54
    # (research/study.md). The stream keeps two [num_users, num_topics] float64 tables.
    num_items: Annotated[int, arg(name="synthetic_items")] = 20_000
    """catalog size of the synthetic stream"""
    num_users: Annotated[int, arg(name="synthetic_users")] = 20_000
    """users of the synthetic stream"""
    num_topics: int = 2_000
    """topics of the synthetic stream: with --topic-sharpness, the regime knob (many sharp
    topics make the positive a large share of the standard loss's denominator; memory 16 B
    x users x topics)"""
    topic_sharpness: float = 8.0
    """scale of the users' topic logits"""
    batch_size: int = 1024
    """in-batch negatives per step"""
    # What these settings give: results/README.md (the demo).
    steps: int = 1000
    """training steps per correction"""
    embedding_dim: int = 32
    """embedding size"""
    learning_rate: float = 1e-2
    """Adam's learning rate"""
    num_eval: int = 8192
    """held-out targets for Recall@k"""
    frequency: Literal["count-min", "true"] = "count-min"
    """where log Q comes from: an in-graph count-min sketch updated while training, or the
    generator's true unigram Q"""
    corrections: Annotated[tuple[Literal[CORRECTIONS], ...], arg(name="loss")] = (
        "none", "logq-tfrs", "corrected")
    """the losses compared: in-batch sampled softmax with each of these corrections"""
    seed: int = 0
    """random seed"""
