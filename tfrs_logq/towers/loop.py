"""The two-tower trainer's training loop (`tfrs_logq.towers.training` on users' logs): the
public `tfrs_logq.two_tower.TwoTowerModel`, trained step by step through its
`TwoTowerModel.retrieval_loss` with the step's sampled negatives.

A *spec* is any object with the fields this module reads (`training.run_spec` of a
`TwoTowerConfig`): ``num_items``, ``embedding_dim``, ``history_length``,
``num_in_batch_negatives``, ``num_uniform_negatives``, ``proposal`` (unigram / mixture /
inclusion), ``correction`` (`tfrs_logq.corrections`: none / logq-tfrs / logq-official /
corrected), ``batch_size``, ``learning_rate``, ``optimizer``, ``seed``, ``steps``,
``eval_at`` and ``run_id``.

Several devices or machines (``strategy``: `tfrs_logq._util.strategy`): every process
draws the same global batch ``i`` (a function of ``(seed, i)``), each replica takes its
equal share of the rows, and the step's negatives are drawn from the whole global batch's
targets (``cross_replica_negatives``, the default; off: from the replica's share), the
same on every replica, so each replica's loss is its rows of the one-device loss and the
replicas' summed gradients (tf-keras' optimizers and `LazyAdam` sum them) are the global
batch's: a run on R replicas follows the one-device run within float rounding. On a
multi-worker cluster only the chief writes the checkpoint; every worker restores from it
(they hold the same weights), and the workers agree at each step on whether to save, so a
cluster restarted after a lost worker resumes every worker at the same step.

Common random numbers: the initial weights come from ``seed`` alone
(`tf.keras.utils.set_random_seed`), the negatives of step ``i`` from ``(seed, i)``
alone (stateless ops), and the caller's batches are a function of ``(seed, i)``: two
specs that differ only in proposal or correction train on identical batches, weights
and negatives.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Callable, Iterable, Optional

import numpy as np
import tensorflow as tf

from tfrs_logq._util.step_checkpoint import StepCheckpoint, source_fingerprint
from tfrs_logq._util.strategy import make_strategy
from tfrs_logq.lazy_adam import LazyAdam
from tfrs_logq.proposal import PROPOSAL_KINDS, proposal_log_q_table
from tfrs_logq.sampling import sample_negatives
from tfrs_logq.tasks import CorrectedRetrieval
from tfrs_logq.two_tower import TwoTowerModel

PROPOSALS = PROPOSAL_KINDS


def build_model(run) -> TwoTowerModel:
    """The spec's `TwoTowerModel` (with `make_task`'s task), its towers built from the
    spec's seed alone: the query tower's weights first, then the item table's."""
    tf.keras.utils.set_random_seed(run.seed)
    model = TwoTowerModel(run.num_items + 1, run.embedding_dim, make_task(run))
    model.query_tower(tf.zeros([1, run.history_length], tf.int64))
    model.item_tower(tf.zeros([1], tf.int64))
    return model


def tower_weights(model: TwoTowerModel) -> list:
    """The trained variables: the query tower's, then the item table."""
    return model.query_tower.trainable_variables + model.item_tower.trainable_variables


def make_task(run) -> CorrectedRetrieval:
    # The inclusion table holds pi(d), the chance d is in the deduplicated batch: the
    # corrected weight's normaliser is then the Horvitz-Thompson sum (`losses`).
    probability = "inclusion" if run.proposal == "inclusion" else "per_draw"
    return CorrectedRetrieval(correction=run.correction, remove_accidental_hits=True,
                              sampling_probability=probability)


def make_optimizer(run):
    if run.optimizer == "lazy-adam":
        return LazyAdam(run.learning_rate)
    return tf.keras.optimizers.Adam(run.learning_rate)


def checkpoint_key(run) -> str:
    """What a run's `StepCheckpoint` belongs to: its ``run_id`` and the code's
    `source_fingerprint` (the package and its pipelines)."""
    import tfrs_logq.pipelines

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tfrs_logq/
    code = source_fingerprint(package, tfrs_logq.pipelines.__path__[0])
    return f"{run.run_id}|code={code}"


def train_loop(run, batches: Callable[[int], Iterable[dict]], log_q_unigram: np.ndarray,
          record: Optional[list] = None, checkpoint_dir: Optional[str] = None,
          checkpoint_seconds: float = 120.0,
          on_step: Optional[Callable[[int], None]] = None,
          on_eval: Optional[Callable[[int, TwoTowerModel, dict], None]] = None,
          worker_checkpoint_dir: Optional[str] = None) -> tuple[TwoTowerModel, dict]:
    """Trains one spec on ``batches(first_step)`` (its batches from ``first_step`` on:
    ``{"history": [b, L], "target": [b]}`` int64 and optionally ``"weight": [b]`` float32,
    each example's loss weight; batch ``i`` a function of the seed and ``i`` only);
    returns the model and ``{"seconds_per_step", "resumed_from_step", "diverged", "loss"}``
    (seconds per step of this process, its first step and the saves excluded; NaN when
    it trained fewer than 2 steps; ``loss``: the last step's summed loss, NaN when none
    ran). ``log_q_unigram``: `[V + 1]` float64 unigram ``log Q`` by id (the split's
    training frequencies); the run's proposal's table is built from it
    (`tfrs_logq.proposal.proposal_log_q_table`).

    ``record``, when a list, receives ``(batch, negatives)`` numpy pairs of every step
    (tests/towers check common random numbers with it). ``checkpoint_dir``: the run's state is saved
    there every ``checkpoint_seconds`` and after the last step (`StepCheckpoint`, keyed
    by `checkpoint_key`), and a run finds its last state there and goes on from it,
    ending exactly as an uninterrupted run. ``on_step(i)`` is called after step ``i``
    (0-based) has finished. ``on_eval(steps, model, timing)`` is called after each of
    ``run.eval_at``'s steps, before the checkpoint may save that step, so a kill never
    skips an evaluation (``timing`` as returned, so far). ``worker_checkpoint_dir``: a
    multi-worker cluster's non-chief worker restores from ``checkpoint_dir`` (the chief's)
    and saves there."""
    strategy = make_strategy(getattr(run, "strategy", "default"))
    replicas = strategy.num_replicas_in_sync
    distributed = strategy is not tf.distribute.get_strategy()
    if run.batch_size % replicas:
        raise ValueError(f"--batch-size {run.batch_size:,} (the global batch) must be a "
                         f"multiple of the {replicas} replicas in sync.")
    share = run.batch_size // replicas
    global_negatives = replicas == 1 or getattr(run, "cross_replica_negatives", True)
    # In-batch draws: the global batch's, or the replica's share's own (and the mixture's
    # uniform share of the proposal with them).
    num_in_batch = run.num_in_batch_negatives if global_negatives else min(
        run.num_in_batch_negatives, share)
    with strategy.scope():
        model = build_model(run)
        weights, optimizer = tower_weights(model), make_optimizer(run)
        optimizer.build(weights)  # slots exist before the step is traced (and restored)
    checkpoint = None
    first_step = 0
    if checkpoint_dir:
        # On a cluster the chief's directory holds the state every worker restores; the
        # others write theirs elsewhere (TensorFlow's rule: every worker saves).
        checkpoint = StepCheckpoint(worker_checkpoint_dir or checkpoint_dir,
                                    checkpoint_key(run), checkpoint_seconds,
                                    model=model, optimizer=optimizer)
        first_step = checkpoint.restore(checkpoint_dir)
    if distributed:
        _check_cluster_agrees(strategy, first_step, run.run_id, log_q_unigram)
    log_q_table = proposal_log_q_table(
        log_q_unigram, run.proposal, num_items=run.num_items,
        num_uniform=run.num_uniform_negatives, num_in_batch=num_in_batch,
        num_draws=run.batch_size)
    table = tf.constant(np.where(np.isfinite(log_q_table), log_q_table, 0.0), tf.float32)

    def replica_step(batch, index, want_save):
        local = batch
        if distributed:
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            local = {k: v[replica * share:(replica + 1) * share] for k, v in batch.items()}
        positives = local["target"]
        # Stateless: keyed by (seed, step) alone, log Q read from the proposal's table;
        # drawn from the global batch's targets, the same on every replica.
        negatives = sample_negatives(batch["target"] if global_negatives else positives,
                                     run.seed, index,
                                     num_uniform=run.num_uniform_negatives,
                                     num_in_batch=num_in_batch,
                                     num_items=run.num_items, log_q=table)
        # log Q(p) of the positives is read by logq-tfrs alone (the other corrections
        # leave the positive's term uncorrected).
        with tf.GradientTape() as tape:
            loss = model.retrieval_loss(local["history"], positives,
                                        tf.gather(table, positives), negatives,
                                        sample_weight=local.get("weight"))
        grads = tape.gradient(loss, weights)
        optimizer.apply_gradients(zip(grads, weights))
        if distributed:  # every worker saves when one's clock says so
            # (a float made here, on the replica's device: a reduced value needs one)
            want_save = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.cast(want_save, tf.float32)) > 0
        return loss, negatives.ids, negatives.is_valid, want_save

    @tf.function
    def step(batch, index, want_save):
        if not distributed:
            return replica_step(batch, index, want_save)
        loss, ids, valid, save = strategy.run(replica_step, args=(batch, index, want_save))
        first = strategy.experimental_local_results
        return (strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
                first(ids)[0], first(valid)[0], first(save)[0])

    start, saving = time.perf_counter(), 0.0
    loss = tf.constant(float("nan"))
    for i, batch in enumerate(batches(first_step), first_step):
        due = checkpoint is not None and checkpoint.due()
        loss, neg_ids, neg_valid, save_now = step(batch, tf.constant(i, tf.int64),
                                                  tf.constant(due))
        if record is not None:
            record.append(({k: v.numpy() for k, v in batch.items()},
                           neg_ids.numpy(), neg_valid.numpy()))
        if i == first_step:
            start = time.perf_counter()
        if on_eval is not None and i + 1 in run.eval_at:
            timed = i - first_step
            eval_start = time.perf_counter()
            on_eval(i + 1, model, {
                "seconds_per_step": ((eval_start - start - saving) / timed if timed > 0
                                     else float("nan")),
                "resumed_from_step": first_step, "loss": float(loss)})
            saving += time.perf_counter() - eval_start  # not a training step's time
        if checkpoint is not None and i + 1 < run.steps and bool(save_now):
            saving -= checkpoint.seconds_saving
            checkpoint.save(i + 1)
            saving += checkpoint.seconds_saving
        if on_step is not None:
            on_step(i)
    timed = run.steps - first_step - 1
    per_step = ((time.perf_counter() - start - saving) / timed if timed > 0
                else float("nan"))
    if checkpoint is not None and first_step < run.steps:
        checkpoint.save(run.steps)  # a kill while evaluating does not repeat training
    # Diverged: a non-finite last loss or weight (NaN weights stay NaN: the last step tells).
    finite = bool(np.isfinite(loss.numpy())) or first_step >= run.steps
    finite = finite and all(bool(np.all(np.isfinite(w.numpy()))) for w in weights)
    return model, {"seconds_per_step": per_step, "resumed_from_step": first_step,
                   "diverged": not finite, "loss": float(loss.numpy())}


def _settings_code(run_id: str, log_q_unigram: np.ndarray) -> int:
    """A 63-bit digest of what every worker must train alike: the run's settings
    (``run_id``) and its data (the split's item frequencies)."""
    digest = hashlib.sha256(run_id.encode())
    digest.update(np.ascontiguousarray(log_q_unigram, np.float64).tobytes())
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def _check_cluster_agrees(strategy, first_step: int, run_id: str,
                          log_q_unigram: np.ndarray) -> None:
    """Refuses a cluster whose workers were started with different settings or data (their
    batches and steps would not match: a silent mix, or a hang in a collective), or that
    restored different steps (a worker read a checkpoint another had not written yet).
    Every replica sees every replica's values, so all of them refuse."""
    mine = tf.constant([[first_step, _settings_code(run_id, log_q_unigram)]], tf.int64)

    def gather():
        return tf.distribute.get_replica_context().all_gather(mine, axis=0)

    seen = strategy.experimental_local_results(tf.function(lambda: strategy.run(gather))())[0]
    seen = seen.numpy()
    if len(set(seen[:, 1].tolist())) > 1:
        raise RuntimeError(
            f"the workers were started with different settings or logs "
            f"({len(set(seen[:, 1].tolist()))} kinds among {len(seen)} replicas): start every "
            "worker of the cluster with the same command and the same --interactions file.")
    low, high = int(seen[:, 0].min()), int(seen[:, 0].max())
    if low != high:
        raise RuntimeError(f"the workers restored different steps ({low:,} to {high:,}): "
                           "start every worker of the cluster again.")

__all__ = ["PROPOSALS", "build_model", "checkpoint_key", "make_optimizer", "make_task",
           "tower_weights", "train_loop"]
