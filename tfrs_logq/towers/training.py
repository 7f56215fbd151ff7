"""A two-tower retrieval model trained on a `Split` of interactions: any user's log.

The model is the public `tfrs_logq.two_tower.TwoTowerModel`: a query tower over the
user's last ``history_length`` items (`HistoryQueryTower`) and an item embedding table,
trained by `CorrectedRetrieval` in `tfrs_logq.towers.loop`'s loop with the row-sparse
`LazyAdam` by default, so a step costs the same at 100k or 1M items (the table rows a
batch does not touch are not updated).

Examples: every training interaction but a user's first, with the items before it as
the history. When the log has a weight column (`Split.train_weights`), each example's
loss is multiplied by its target interaction's weight, the weights scaled to mean 1 over
the training examples (Adam's steps do not depend on the loss's scale, and float32 then
holds any range of weights: uniform weights of 1e30 or 1e-50 train as weight 1). The
batches are still drawn uniformly, so ``Q`` stays the unigram frequency of the training
interactions. Weights must be at least 0 (all of the log's), and not all 0 in training.

Batch ``i`` of seed ``s`` draws ``batch_size`` examples uniformly with replacement from
a generator keyed by ``(s, i)`` alone: runs of one seed that differ only in the loss see
identical batches, initial weights and negatives (common random numbers), and a resumed
run continues the same stream.

Losses (`LOSSES`), each ``<negatives>-<correction>``:

- negatives ``inbatch``: the batch's distinct targets; ``mns``: those plus
  ``num_negatives`` uniform ones shared by the batch (mixed negative sampling), each
  corrected with the mixture's own ``log Q`` (``a / V + (1 - a) Q(d)``, ``a`` the
  uniform share) rather than with the unigram ``Q(d)`` alone.
- correction ``none``; ``logq-tfrs``, standard logQ as TFRS's ``Retrieval`` computes it
  (the positive corrected too); ``logq-official``, standard logQ as the paper's official
  code computes it (the positive's term uncorrected, as ``tfrs-logq train``'s SASRec
  ``*-logq-official`` losses train); ``corrected``, the paper's corrected loss.

``Q`` is the unigram frequency of the training interactions. Test metrics are
computed over the full catalog (`tfrs_logq.pipelines.sequential.evaluate`) at every
evaluation step, so a caller can average a late window of them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfrs_logq.corrections import LossName
from tfrs_logq.metrics import popularity_bands, recall_ndcg_by_band
from tfrs_logq.pipelines.sequential import evaluate, evaluation_arrays
from tfrs_logq.pipelines.splits import Split, check_evaluable, target_facts
from tfrs_logq.proposal import standard_positive_share
from tfrs_logq.towers.config import TwoTowerConfig
from tfrs_logq.towers.loop import train_loop
from tfrs_logq.two_tower import TwoTowerModel

BATCH_SALT = 0x6261746368  # "batch": keeps the batches' key apart from the negatives'


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What `tfrs_logq.towers.loop` reads, from a config, the split's catalog and the
    config's loss name, parsed once (`run_spec`)."""

    config: TwoTowerConfig
    num_items: int
    loss_name: LossName

    def __getattr__(self, name):
        return getattr(self.config, name)

    @property
    def correction(self) -> str:
        return self.loss_name.correction

    @property
    def proposal(self) -> str:
        return "mixture" if self.loss_name.negatives == "mns" else "unigram"

    @property
    def num_in_batch_negatives(self) -> int:
        return self.config.batch_size

    @property
    def num_uniform_negatives(self) -> int:
        return self.config.num_negatives if self.loss_name.negatives == "mns" else 0

    @property
    def eval_at(self) -> tuple:
        return self.config.eval_steps[:-1]

    @property
    def run_id(self) -> str:
        return f"{self.config.run_id}|num_items={self.num_items}"


class Examples:
    """The training examples of a split, drawn batch by batch (see the module docstring).

    Holds the training sequences once, concatenated (``4 bytes`` per interaction), and
    the position of every example; a batch's histories are gathered when it is drawn.
    ``weights``: each example's weight (float32), or None when the split has none.
    """

    def __init__(self, split: Split, history_length: int) -> None:
        sequences = split.train_sequences()
        lengths = np.array([len(s) for s in sequences], np.int64)
        self.flat = (np.concatenate(sequences).astype(np.int64) if len(sequences)
                     else np.zeros(0, np.int64))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        # Every position but each user's first: the target, its user's start.
        user_of = np.repeat(np.arange(len(lengths)), lengths)
        positions = np.arange(len(self.flat), dtype=np.int64)
        keep = positions != starts[user_of] if len(self.flat) else positions.astype(bool)
        self.positions = positions[keep]
        self.starts = starts[user_of][keep]
        self.history_length = int(history_length)
        if not len(self.positions):
            raise ValueError("the training split has no user with 2 or more interactions: "
                             "nothing to train on.")
        self.weights = None
        weights = split.train_weights()
        if weights is not None:
            _check_log_weights(split.interactions.weight)
            self.weights = _example_weights(np.concatenate(weights)[self.positions])

    def __len__(self) -> int:
        return len(self.positions)

    def batch(self, seed: int, step: int, batch_size: int) -> dict:
        rng = np.random.default_rng([int(seed), BATCH_SALT, int(step)])
        rows = rng.integers(0, len(self.positions), batch_size)
        target_at, start = self.positions[rows], self.starts[rows]
        offsets = np.arange(-self.history_length, 0, dtype=np.int64)
        at = target_at[:, None] + offsets[None, :]
        history = np.where(at >= start[:, None], self.flat[np.maximum(at, 0)], 0)
        batch = {"history": history, "target": self.flat[target_at]}
        if self.weights is not None:
            batch["weight"] = self.weights[rows]
        return batch

    def batches(self, seed: int, batch_size: int, steps: int) -> Callable[[int], object]:
        def from_step(first: int):
            for step in range(first, steps):
                yield {k: tf.constant(v, tf.float32 if k == "weight" else tf.int64)
                       for k, v in self.batch(seed, step, batch_size).items()}
        return from_step


def _check_log_weights(weights: np.ndarray) -> None:
    """Every weight of the log at least 0 (a loss weight)."""
    if len(weights) and weights.min() < 0:
        raise ValueError(f"the weight column holds negative weights (the least: "
                         f"{weights.min():.6g}); a loss weight must be at least 0.")


def _example_weights(weights: np.ndarray) -> np.ndarray:
    """The training examples' weights scaled to mean 1, as float32; refused when all are 0.
    Scaled by the largest first, so that no sum overflows float64."""
    weights = np.asarray(weights, np.float64)
    largest = weights.max() if len(weights) else 0.0
    if not largest > 0:
        raise ValueError("every training example has weight 0: nothing to train on.")
    weights = weights / largest
    return (weights / weights.mean()).astype(np.float32)


def run_spec(config: TwoTowerConfig, num_items: int) -> _Spec:
    """What `tfrs_logq.towers.loop` reads of a run of ``config`` on ``num_items`` items
    (the loss name parsed here, once: the config checked it)."""
    return _Spec(config, int(num_items), config.loss_name)


def _ks(num_items: int) -> tuple:
    """Recall/NDCG cut-offs the catalog allows: 10, 100, 1000 below its size (a cut-off
    at or above it gives Recall 1.0 for any model; `check_evaluable` refuses a catalog
    with none)."""
    return tuple(k for k in (10, 100, 1000) if k < num_items)


TENSORFLOW_BYTES = 2**30  # the process before any tensor: TensorFlow, the data


def estimated_peak_bytes(config: TwoTowerConfig, num_items: int, num_examples: int,
                         num_test: int) -> int:
    """An upper estimate of a run's peak memory: the item table with Adam's two moments,
    a step's score matrix and what its loss and gradient keep (about 6 floats per
    score), an evaluation chunk's scores against the catalog (about 4 per score), the
    examples' positions, and TensorFlow with the data (`TENSORFLOW_BYTES`)."""
    rows = num_items + 1
    table = 3 * rows * config.embedding_dim * 4
    negatives = config.num_negatives if config.loss_name.negatives == "mns" else 0
    step = 6 * config.batch_size * (config.batch_size + negatives) * 4
    evaluation = 4 * min(512, max(num_test, 1)) * rows * 4
    examples = 3 * num_examples * 8
    return TENSORFLOW_BYTES + table + step + evaluation + examples


def positive_share(model: TwoTowerModel, arrays: dict, log_q: np.ndarray, num_negatives: int,
                   batch_size: int = 512) -> dict:
    """The regime: quantiles of the trained model's ``P(p|u)`` (full-catalog softmax) and
    of the positive's share of the standard logQ denominator,
    ``(P/Q) / (P/Q + n)`` (`proposal.standard_positive_share`), over the test targets."""
    items = model.item_tower.embeddings[1:]
    log_p = []
    for start in range(0, len(arrays["targets"]), batch_size):
        queries = model.query_tower(tf.constant(arrays["history"][start:start + batch_size]))
        scores = tf.matmul(queries, items, transpose_b=True)
        column = tf.constant(arrays["targets"][start:start + batch_size] - 1)
        log_p.append((tf.gather(scores, column, batch_dims=1)
                      - tf.reduce_logsumexp(scores, axis=1)).numpy())
    log_p = np.concatenate(log_p) if log_p else np.zeros(0)
    finite_q = np.where(np.isfinite(log_q), log_q, np.log(1e-12))
    p_over_q = np.exp(log_p - finite_q[arrays["targets"]])
    share = np.asarray(standard_positive_share(p_over_q, num_negatives), np.float64)
    out = {}
    for q in (10, 50, 90):
        out[f"model_p_q{q}"] = float(np.percentile(np.exp(log_p), q)) if len(log_p) else 0.0
        out[f"positive_share_q{q}"] = float(np.percentile(share, q)) if len(share) else 0.0
    return out


def check_trainable(config: TwoTowerConfig, split: Split, examples: Examples) -> None:
    """Refuses, in one line, a run that could not train or mean anything: a split
    `check_evaluable` refuses, or a batch larger than the training examples (a step could
    never be drawn)."""
    check_evaluable(split, split.test)
    if config.batch_size > len(examples):
        raise ValueError(f"--batch-size {config.batch_size:,} is larger than the "
                         f"{len(examples):,} training examples of this log: lower it (at most "
                         f"{len(examples):,}; 512 is the default).")


def train(config: TwoTowerConfig, split: Split, checkpoint_dir: Optional[str] = None,
          on_eval: Optional[Callable[[dict], None]] = None,
          done: Sequence[int] = (), on_step: Optional[Callable[[int], None]] = None,
          examples: Optional[Examples] = None, checkpoint_seconds: float = 120.0,
          on_trained: Optional[Callable[[TwoTowerModel], None]] = None,
          worker_checkpoint_dir: Optional[str] = None) -> dict:
    """Trains one run and evaluates the test split at ``config.eval_steps``.

    Returns the last evaluation: ``{"steps", "recall@k", "ndcg@k", ...,
    "seconds_per_step", "resumed_from_step"}`` with the regime (`positive_share`) added.
    ``on_eval(row)`` receives every evaluation as it is made, the last included, except
    those whose step is in ``done`` (made before a kill). ``checkpoint_dir``: exact
    resume (`tfrs_logq.towers.loop.train_loop`, as is ``worker_checkpoint_dir``).
    ``examples``: the split's `Examples`, to share them between runs.
    ``on_trained(model)`` receives the trained model before its last evaluation (to save
    it).
    """
    spec = run_spec(config, split.num_items)
    examples = examples or Examples(split, config.history_length)
    log_q = split.train_log_q()
    arrays = evaluation_arrays(split, split.test, config.history_length, config.exclude_seen)
    if not len(arrays["targets"]):
        raise ValueError("the test split is empty: nothing to evaluate.")
    check_trainable(config, split, examples)
    ks = _ks(split.num_items)
    target_bands = popularity_bands(split.train_item_counts())[arrays["targets"]]
    start = time.perf_counter()

    def measure(steps: int, model: TwoTowerModel, timing: dict) -> dict:
        ranks: list = []
        metrics = evaluate(model.query_tower, model.item_tower.embeddings, arrays, ks=ks,
                           per_target=ranks)
        metrics.update(recall_ndcg_by_band(ranks, target_bands, ks))
        return {"steps": steps, **metrics,
                "seconds_per_step": (round(timing["seconds_per_step"], 5)
                                     if np.isfinite(timing["seconds_per_step"]) else None),
                "resumed_from_step": timing["resumed_from_step"],
                # the step's training loss, summed over its batch (NaN: none ran here)
                "train_loss": (timing["loss"] if np.isfinite(timing.get("loss", np.nan))
                               else None),
                "train_seconds": round(time.perf_counter() - start, 1)}

    def evaluated(steps: int, model: TwoTowerModel, timing: dict) -> None:
        if steps not in done and on_eval is not None:
            on_eval(measure(steps, model, timing))

    model, timing = train_loop(spec, examples.batches(config.seed, config.batch_size,
                                                     config.steps),
                               log_q, checkpoint_dir=checkpoint_dir,
                               checkpoint_seconds=checkpoint_seconds, on_step=on_step,
                               on_eval=evaluated, worker_checkpoint_dir=worker_checkpoint_dir)
    if on_trained is not None:
        on_trained(model)
    last = measure(config.steps, model, timing)
    last.update(positive_share(model, arrays, log_q, spec.num_in_batch_negatives
                               + spec.num_uniform_negatives))
    last.update(target_facts(split, split.test, config.history_length))
    last["diverged"] = int(bool(timing.get("diverged")))
    if on_eval is not None:
        on_eval(last)
    return last


__all__ = ["Examples", "estimated_peak_bytes", "positive_share", "run_spec", "train"]
