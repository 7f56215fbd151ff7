"""A two-tower run's settings (`TwoTowerConfig`) and the names it takes, free of
TensorFlow (the command line builds its flags from them without loading it).

Losses (`LOSSES`), each ``<negatives>-<correction>``: negatives ``inbatch`` (the batch's
distinct targets) or ``mns`` (those plus uniform ones shared by the batch); correction
``none``, ``logq-tfrs`` (standard logQ as TFRS's ``Retrieval`` computes it: the positive's
logit corrected too), ``logq-official`` (as the paper's official code computes it: the
positive uncorrected) or ``corrected``: the names of `tfrs_logq.corrections`, which the
study and the task take too (a bare ``<negatives>-logq`` is refused). The name is parsed
by `tfrs_logq.corrections.parse_loss_name` into `TwoTowerConfig.loss_name`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import numpy as np
from tyro.conf import arg

from tfrs_logq.corrections import LOSS_NAMES, NEGATIVES, LossName, parse_loss_name

OPTIMIZERS = ("adam", "lazy-adam")
# `tfrs_logq._util.strategy`'s kinds a two-tower run takes (no TPU: untested there).
STRATEGIES = ("default", "mirrored", "multi-worker")
LOSSES = LOSS_NAMES
MAX_EMBEDDING_DIM = 4096
MAX_HISTORY_LENGTH = 10_000


def _flag(name: str) -> str:
    """The command line's flag of a field (``num_negatives``: ``--uniform-negatives``)."""
    return "--" + {"num_negatives": "uniform_negatives"}.get(name, name).replace("_", "-")


@dataclasses.dataclass(frozen=True)
class TwoTowerConfig:
    """One two-tower training run on a user's log."""

    loss: Literal[LOSSES] = "inbatch-corrected"
    """``inbatch``/``mns`` + ``none``/``logq-tfrs``/``logq-official``/``corrected`` (`LOSSES`)"""
    seed: int = 0
    """initial weights, batches and negatives (common random numbers across losses)"""
    steps: int = 3000
    """training steps (fixed: no early stopping)"""
    batch_size: int = 512
    """training examples per step, all replicas together (the global batch: each of R
    replicas takes batch_size / R of it)"""
    embedding_dim: int = 64
    """query and item embedding size"""
    history_length: int = 50
    """the query tower reads the user's last this many items"""
    num_negatives: Annotated[int, arg(name="uniform_negatives")] = 1024
    """uniform negatives shared by the batch (``mns-*`` losses only)"""
    learning_rate: float = 3e-3
    """Adam's step size"""
    optimizer: Literal[OPTIMIZERS] = "lazy-adam"
    """``lazy-adam`` (row-sparse: a step independent of the catalog size) or ``adam``"""
    eval_every: int = 500
    """evaluate the test split every this many steps (and at the last step)"""
    exclude_seen: bool = True
    """the evaluation policy, as the served top_k's exclude_history: leave the items of the
    history a request sends out of the ranking (a repeat target is then a miss; the gSASRec
    protocol); off, they are ranked (send exclude_history false to serve that way)"""

    strategy: Literal[STRATEGIES] = "default"
    """``default`` (one device), ``mirrored`` (this machine's devices) or ``multi-worker``
    (the cluster TF_CONFIG names): docs/scaling.md"""
    cross_replica_negatives: bool = True
    """several replicas: negatives from the whole global batch (as on one device); off, from
    the replica's share"""

    def __post_init__(self) -> None:
        parse_loss_name(self.loss, LOSSES)  # the one check of the name
        if self.strategy not in STRATEGIES:
            raise ValueError(f"`strategy` (--strategy) must be one of {STRATEGIES}, received "
                             f"{str(self.strategy)[:40]!r}.")
        if not isinstance(self.cross_replica_negatives, bool):
            raise ValueError("`cross_replica_negatives` (--cross-replica-negatives) must be "
                             f"True or False, received {str(self.cross_replica_negatives)[:40]}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"`optimizer` (--optimizer) must be one of {OPTIMIZERS}, received "
                             f"{str(self.optimizer)[:40]!r}.")
        for name, low, high in (("seed", 0, 2**32 - 1), ("steps", 1, 10**9),
                                ("batch_size", 2, 1 << 20),
                                ("embedding_dim", 1, MAX_EMBEDDING_DIM),
                                ("history_length", 1, MAX_HISTORY_LENGTH),
                                ("num_negatives", 1, 1 << 22), ("eval_every", 1, 10**9)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not low <= value <= high:
                raise ValueError(f"`{name}` ({_flag(name)}) must be an integer in [{low:,}, "
                                 f"{high:,}], received {str(value)[:40]}.")
        if not 0 < self.learning_rate < 10:
            raise ValueError(f"`learning_rate` (--learning-rate) must be in (0, 10), received "
                             f"{self.learning_rate}.")

    @property
    def loss_name(self) -> LossName:
        """``loss`` parsed: its negatives (``inbatch``/``mns``) and its correction (the
        checked name, read by the one parser; a property, so the fields stay the run's)."""
        return parse_loss_name(self.loss, None)

    @property
    def eval_steps(self) -> tuple:
        """The steps at which the test split is evaluated, the last one included."""
        return (*range(self.eval_every, self.steps, self.eval_every), self.steps)

    @property
    def run_id(self) -> str:
        """Every field that changes the result; the distribution fields only off one device
        (a run id made before they existed stays the same)."""
        skip = ("strategy", "cross_replica_negatives") if self.strategy == "default" else ()
        return "|".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if f.name not in skip)


__all__ = ["LOSSES", "MAX_EMBEDDING_DIM", "MAX_HISTORY_LENGTH", "NEGATIVES",
           "OPTIMIZERS", "STRATEGIES", "TwoTowerConfig"]
