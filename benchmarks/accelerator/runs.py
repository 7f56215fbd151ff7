"""Runs of the accelerator study: the grid, the presets, the proposals' ``log Q`` tables.

A `Run` has the retired TensorFlow study's `Run` fields (`lab/study.py` at d9f8357, so
that a row of either study names its cell the same way) and the step counts to evaluate
at, ``eval_at``; ``steps`` is the last of them. Corrections are the TF study's four plus
``corrected-w1`` (the corrected loss with ``w = 1``: the positive out of the denominator
and ``log Q'``, without the weight).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional, Sequence

import numpy as np

from .loss import CORRECTIONS, klq
from .world import WorldConfig

SAMPLERS = ("in-batch", "uniform", "mixed")
PROPOSALS = ("unigram", "mixture", "inclusion")
COMPLEMENT_EPSILON = klq.COMPLEMENT_EPSILON  # the cap of Q in log(1 - Q), as the losses


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run (a cell of the grid and a seed), evaluated at ``eval_at`` steps."""

    num_items: int = 20_000
    num_users: int = 50_000
    num_topics: int = 50
    topic_sharpness: float = 2.5
    zipf_exponent: float = 1.05
    history_length: int = 10
    sampler: str = "mixed"
    num_in_batch: int = 256
    num_uniform: int = 256
    proposal: str = "unigram"
    correction: str = "corrected"
    seed: int = 0
    eval_at: tuple = (200,)
    batch_size: int = 256
    embedding_dim: int = 32
    learning_rate: float = 3e-3
    optimizer: str = "lazy-adam"
    num_eval_users: int = 2048
    world_seed: int = 0

    def __post_init__(self) -> None:
        klq.check_correction(self.correction, allowed=CORRECTIONS)
        for name, allowed in (("sampler", SAMPLERS), ("proposal", PROPOSALS),
                              ("optimizer", ("lazy-adam",))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, "
                                 f"received {getattr(self, name)!r}.")
        if self.proposal == "inclusion" and self.sampler != "in-batch":
            raise ValueError("`proposal='inclusion'` needs sampler='in-batch', received "
                             f"{self.sampler!r}.")
        eval_at = tuple(sorted(set(int(s) for s in self.eval_at)))
        if not eval_at or eval_at[0] < 1:
            raise ValueError(f"`eval_at` must be positive step counts, received {self.eval_at!r}.")
        object.__setattr__(self, "eval_at", eval_at)

    @property
    def steps(self) -> int:
        return self.eval_at[-1]

    @property
    def num_in_batch_negatives(self) -> int:
        return self.num_in_batch if self.sampler in ("in-batch", "mixed") else 0

    @property
    def num_uniform_negatives(self) -> int:
        return self.num_uniform if self.sampler in ("uniform", "mixed") else 0

    def fields(self, steps: int) -> dict:
        """The TensorFlow study's `Run` fields, in its order, with ``steps``."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "eval_at":
                continue
            out[f.name] = getattr(self, f.name)
            if f.name == "seed":
                out["steps"] = steps
        return out

    def row_id(self, steps: int) -> str:
        """The row's key: its fields with the step count it was evaluated at."""
        return "|".join(f"{k}={v}" for k, v in self.fields(steps).items())

    @property
    def training_key(self) -> str:
        """What determines training (not the horizon): a checkpoint's owner."""
        return "|".join(f"{k}={v}" for k, v in self.fields(0).items() if k != "steps")

    def world(self) -> WorldConfig:
        return WorldConfig(num_items=self.num_items, num_users=self.num_users,
                           num_topics=self.num_topics, zipf_exponent=self.zipf_exponent,
                           topic_sharpness=self.topic_sharpness,
                           history_length=self.history_length, seed=self.world_seed)


def grid(base: dict, axes: dict, seeds: Sequence[int]) -> list[Run]:
    """The TensorFlow study's grid: its runs and skips (``none`` once per scenario and seed,
    ``inclusion`` only with in-batch, ``mixture`` with in-batch runs as ``unigram``),
    ordered scenario, seed, proposal, correction: a seed's runs of one proposal together."""
    axes = dict(axes)
    proposals = axes.pop("proposal", [base.get("proposal", "unigram")])
    corrections = axes.pop("correction", [base.get("correction", "corrected")])
    negatives = axes.pop("negatives", [(base.get("sampler", "mixed"),
                                        base.get("num_in_batch", 256),
                                        base.get("num_uniform", 256))])
    names = list(axes)
    runs = []
    for values in itertools.product(*(axes[n] for n in names)):
        for sampler, k_in, k_uni in negatives:
            valid = list(dict.fromkeys(
                "unigram" if p == "mixture" and sampler == "in-batch" else p
                for p in proposals if not (p == "inclusion" and sampler != "in-batch")))
            for seed in seeds:
                done_none = False
                for proposal in valid:
                    for correction in corrections:
                        if correction == "none":
                            if done_none:
                                continue
                            done_none = True
                        runs.append(Run(**{**base, **dict(zip(names, values)),
                                           "sampler": sampler, "num_in_batch": k_in,
                                           "num_uniform": k_uni, "proposal": proposal,
                                           "correction": correction, "seed": seed}))
    return runs


_SWEEP_CELL = dict(num_items=100_000, num_users=20_000, num_topics=10_000,
                   topic_sharpness=8.0, batch_size=1024, embedding_dim=32,
                   learning_rate=1e-2, num_eval_users=4096, eval_at=(4000,))

PRESETS = {
    # Every sampler, proposal and correction on a small world, two step counts: plumbing.
    "smoke": dict(
        base=dict(num_items=2_000, num_users=500, num_topics=20, topic_sharpness=4.0,
                  batch_size=64, embedding_dim=16, learning_rate=1e-2, num_eval_users=256,
                  eval_at=(20, 40)),
        axes=dict(negatives=[("mixed", 32, 32), ("in-batch", 64, 0)],
                  proposal=["mixture", "inclusion"], correction=list(CORRECTIONS)),
        seeds=[0]),
    # The TF sweep's first cell (results/synthetic-study-sweep/): C = 10,000, mixed
    # 1,024 + 1,024, mixture proposal, 4,000 steps of 1,024, seeds 0-2.
    "crosscheck": dict(
        base=_SWEEP_CELL,
        axes=dict(negatives=[("mixed", 1024, 1024)], proposal=["mixture"],
                  correction=["corrected", "logq-tfrs"]),
        seeds=[0, 1, 2]),
    # The learning curve at 1,000,000 items: 10,000 topics, sigma 8, mixed
    # 4,096 + 4,096, both proposals, five corrections, evaluated at 3k-100k steps.
    "curve": dict(
        base=dict(num_items=1_000_000, num_users=20_000, num_topics=10_000,
                  topic_sharpness=8.0, batch_size=4096, embedding_dim=32,
                  learning_rate=1e-2, num_eval_users=8192,
                  eval_at=(3000, 10_000, 30_000, 100_000)),
        axes=dict(negatives=[("mixed", 4096, 4096)], proposal=["mixture", "unigram"],
                  correction=["corrected", "logq-tfrs", "logq-official", "corrected-w1",
                              "none"]),
        seeds=[0, 1, 2]),
}


def preset_runs(name: str, seeds: Optional[Sequence[int]] = None,
                **overrides) -> list[Run]:
    if name not in PRESETS:
        raise ValueError(f"`preset` must be one of {tuple(PRESETS)}, received {name!r}.")
    if "sampler" in overrides:
        raise ValueError("the sampler is a preset's axis (`negatives`); override the counts "
                         "`num_in_batch` / `num_uniform` instead.")
    spec = PRESETS[name]
    axes = dict(spec["axes"])
    if "negatives" in axes:  # counts given on the command line replace the preset's
        axes["negatives"] = [
            (sampler, overrides.get("num_in_batch", k_in) if k_in else 0,
             overrides.get("num_uniform", k_uni) if k_uni else 0)
            for sampler, k_in, k_uni in axes["negatives"]]
    return grid({**spec["base"], **overrides}, axes,
                spec["seeds"] if seeds is None else seeds)


def proposal_log_q(run: Run, log_q_unigram: np.ndarray) -> np.ndarray:
    """`[V + 1]` float64 ``log Q(d)`` of the run's proposal (as the TensorFlow
    study's `proposal_log_q_table`; entry 0, padding, is -inf). float64 numpy on the host:
    ``inclusion`` is `keras_logq.losses.inclusion_log_q`'s formula, which computes in the
    backend's float32 on a JAX device without x64."""
    if run.proposal == "unigram":
        return log_q_unigram
    with np.errstate(divide="ignore"):
        if run.proposal == "mixture":
            a = run.num_uniform_negatives / (run.num_in_batch_negatives
                                             + run.num_uniform_negatives)
            q = np.exp(log_q_unigram)
            return np.log(a / run.num_items + (1.0 - a) * q)
        q = np.minimum(np.exp(log_q_unigram), 1.0 - COMPLEMENT_EPSILON)
        return np.log(-np.expm1(run.batch_size * np.log1p(-q)))


__all__ = ["PRESETS", "Run", "grid", "preset_runs", "proposal_log_q"]
