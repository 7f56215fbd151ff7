"""`tfrs-logq train`: SASRec with any objective, through Keras `model.fit`.

Validation NDCG@10 (full catalog, seen items excluded) after every epoch drives
early stopping and the best checkpoint, which is restored at the end. After
every epoch ``MODEL_DIR/backup`` holds a checkpoint of the weights, the optimizer,
every random counter (dropout, negative sampling) and the epoch count, and the
training batches are a function of the seed and the batch number, so a run
killed at any point (SIGKILL included) resumes from its last finished epoch and
ends as the uninterrupted run would, to the bit on the same machine and code
path, on CPU (on GPU some kernels, such as bincounts and the gradients of
gathers, are not deterministic unless TensorFlow's op determinism is enabled, so
two uninterrupted runs differ too). On a multi-worker cluster every non-chief
worker keeps its state in ``MODEL_DIR/worker-TYPE-INDEX``. TensorBoard logs go
to ``MODEL_DIR/logs``. ``MODEL_DIR`` ends up holding
``config.json``, ``best.weights.*`` (the best epoch, published at the end), ``metrics.json``
and ``vocabulary.json`` (item id -> the dataset's own id), which is what
``tfrs-logq export`` reads.

Data: the dataset's file loaded in memory (`load_config_split`), or, with
``config.examples`` (``--examples``), the split of a batch pipeline's ExampleGen
artifact (the same split, so the same seed trains the same model; its dataset and
split fields come from the artifact, `examples_config`); ``config.log_q``
(``--log-q``) takes the training counts behind ``log Q`` from a Statistics artifact
(`training_item_counts`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq._util.atomic import write_json
from tfrs_logq._util.strategy import make_strategy
from tfrs_logq.corrections import parse_loss_name
from tfrs_logq.metrics import popularity_bands
from tfrs_logq.pipelines.datasets import load_split as load_dataset_split
from tfrs_logq.pipelines.sequential import evaluate, evaluation_arrays, training_dataset
from tfrs_logq.pipelines.splits import Split
from tfrs_logq.pipelines.vocabulary import write_run_items
from tfrs_logq.sasrec.callbacks import (
    BestEpochKeeper,
    EpochCheckpoint,
    ValidationCallback,
    WindowedTestCallback,
    uses_native_kernels,
    windowed_test_metrics,
)

# The config and run-directory names callers reach through this module (the command
# line, the studies, the benchmarks); defined in tfrs_logq.sasrec.config / .run.
from tfrs_logq.sasrec.config import (  # noqa: F401  (re-exported)
    LOG_FILTERS,
    MONITOR,
    PRESETS,
    STRATEGIES,
    TrainConfig,
    examples_config,
    resolve_config,
)
from tfrs_logq.sasrec.models import SASRecEncoder, SequentialRetrievalModel
from tfrs_logq.sasrec.objectives import make_objective
from tfrs_logq.sasrec.run import (  # noqa: F401  (re-exported)
    RunDirectoryError,
    RunLock,
    _resumed_speed_fields,
    prepare_run_directory,
    same_run,
    saved_config,
    worker_directory,
)

log = logging.getLogger("tfrs_logq.sasrec.training")


def _subsample(arrays: dict, limit: Optional[int], seed: int) -> dict:
    n = len(arrays["targets"])
    if limit is None or n <= limit:
        return arrays
    idx = np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))
    return {k: (None if v is None else v[idx]) for k, v in arrays.items()}


def training_item_counts(config: TrainConfig, split: Split) -> np.ndarray:
    """`[num_items + 1]` training item counts, the objective's ``log Q``: counted from
    ``split``, or read from the Statistics artifact ``config.log_q`` (``--log-q``).

    Raises:
      ArtifactError: ``config.log_q`` is not a finished, intact Statistics artifact, or
        it was computed from another ExampleGen artifact than ``config.examples``.
      ValueError: its catalog is not the split's.
    """
    if not config.log_q:
        return split.train_item_counts()
    from tfrs_logq.pipelines.item_statistics import load_item_statistics
    from tfrs_logq.pipelines.manifest import ArtifactError, verified_manifest

    stats = load_item_statistics(config.log_q)
    if config.examples:
        made_from = verified_manifest(config.log_q)["inputs"].get("examples", {}).get("sha256")
        if made_from != verified_manifest(config.examples)["outputs"]:
            raise ArtifactError(f"--log-q {config.log_q} was computed from another ExampleGen "
                                f"artifact than --examples {config.examples}; rerun the "
                                "pipeline's Statistics on it.")
    if stats.num_items != split.num_items:
        raise ValueError(f"--log-q {config.log_q} counts {stats.num_items:,} items and the "
                         f"training data has {split.num_items:,}: give the Statistics "
                         "artifact of this data.")
    return stats.counts


def build_model(config: TrainConfig, split: Split, strategy) -> SequentialRetrievalModel:
    with strategy.scope():
        tpu = tuple(t for t in (getattr(tf.distribute, "TPUStrategy", None),
                                getattr(tf.distribute.experimental, "TPUStrategy", None)) if t)
        static_shapes = config.jit_compile or isinstance(strategy, tpu)
        encoder = build_encoder(config, split.num_items,
                                length_buckets=1 if static_shapes else None,
                                native_kernels=False if static_shapes else None)
        # The config checked the name: parsed here without a second check.
        objective = make_objective(parse_loss_name(config.loss, None), split.num_items,
                                   training_item_counts(config, split),
                                   num_negatives=config.num_negatives, seed=config.seed,
                                   cross_replica_negatives=config.cross_replica_negatives,
                                   compact_positions=not config.jit_compile,
                                   native_kernels=False if static_shapes else None)
        model = SequentialRetrievalModel(encoder, objective)
        # Create every weight now (a forward pass) so a checkpoint restores into a
        # built model.
        encoder(tf.zeros([1, config.max_length], tf.int32))
        model.built = True
        # epsilon 1e-8 as PyTorch's Adam (the official code); Keras adds it before the
        # bias correction, which differs from PyTorch only in the first few hundred steps.
        optimizer = tf.keras.optimizers.Adam(config.learning_rate, epsilon=1e-8)
        if config.mixed_precision == "float16":
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, jit_compile=config.jit_compile)
        # Its slots now, so a checkpoint restores into them before the first step.
        model.optimizer.build(model.trainable_variables)
    return model


def build_encoder(config: TrainConfig, num_items: int, length_buckets: Optional[int] = None,
                  native_kernels: Optional[bool] = None) -> SASRecEncoder:
    """The `SASRecEncoder` ``config`` describes (a saved ``config.json`` becomes one with
    `TrainConfig.from_json`); ``length_buckets`` overrides the config's,
    ``native_kernels`` is the encoder's (both speed-only choices).

    Raises:
      TypeError: ``config`` is not a `TrainConfig`.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"`config` must be a TrainConfig (TrainConfig.from_json reads a "
                        f"config.json), received {type(config).__name__}.")
    buckets = config.length_buckets if length_buckets is None else length_buckets
    return SASRecEncoder(int(num_items) + 1, config.max_length, config.embedding_dim,
                         config.num_blocks, config.num_heads, config.dropout,
                         share_item_embeddings=config.share_item_embeddings,
                         length_buckets=int(buckets), native_kernels=native_kernels)


def load_config_split(config: TrainConfig, weight_column: Optional[str] = None,
                      skip_bad_lines: bool = False, max_bad_share: Optional[float] = None
                      ) -> Split:
    """The split ``config`` trains on: its ExampleGen artifact's (``config.examples``),
    else its dataset's file loaded in memory (`tfrs_logq.pipelines.datasets.load_split`
    of its data fields). ``weight_column``: a column of ``config.interactions`` read as
    each interaction's loss weight (`Split.train_weights`; a two-tower run's).
    ``skip_bad_lines``: malformed rows of the log or dataset file are skipped and
    counted (``split.interactions.skipped_lines``) instead of an error;
    ``max_bad_share``: the largest share of a log's lines they may be (None: 0.01).

    Raises:
      ValueError: ``config.split`` is not the artifact's split, or ``weight_column`` is
        given without ``config.interactions``.
    """
    if weight_column and not config.interactions:
        raise ValueError("--weight-column names a column of --interactions (your log); the "
                         "built-in datasets and ExampleGen artifacts have no weight column.")
    if config.examples:
        from tfrs_logq.pipelines.examples import read_split

        split = read_split(config.examples)
        if split.name != config.split:
            raise ValueError(f"--examples {config.examples} holds the {split.name} split, "
                             f"and the run asks for --split {config.split}.")
        return split
    if config.interactions:
        from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split

        source = UserLogSource(config.interactions, config.user_column, config.item_column,
                               time_column=config.time_column, weight_column=weight_column,
                               format=config.log_format, skip_bad_lines=skip_bad_lines,
                               **({} if max_bad_share is None else
                                  {"max_bad_share": max_bad_share}))
        return load_user_log_split(source, config.split,
                                   temporal_fraction=config.temporal_fraction,
                                   **{name: getattr(config, name) for name in LOG_FILTERS})
    return load_dataset_split(config.dataset, config.split, config.data_dir,
                              data_format=config.data_format,
                              temporal_fraction=config.temporal_fraction,
                              **({"skip_bad_lines": True} if skip_bad_lines else {}))


def load_recorded_split(config: TrainConfig, record: dict):
    """The split of a run's data fields ``config``, read as its ``config.json`` (``record``)
    says it was: with its weight column (a two-tower run's), skipping malformed lines when
    the run skipped some.

    Raises:
      ValueError: the file now has another number of malformed lines than the run skipped
        (it is not the data the run trained on).
    """
    skipped = int(record.get("skipped_lines") or 0)
    # A row may be malformed by its weight alone: read the weight column the run read.
    split = load_config_split(config, weight_column=record.get("weight_column") or None,
                              skip_bad_lines=bool(skipped),
                              max_bad_share=1.0 if skipped and config.interactions else None)
    if split.interactions.skipped_lines != skipped:
        raise ValueError(f"{split.interactions.source} now has "
                         f"{split.interactions.skipped_lines:,} malformed lines and the run "
                         f"skipped {skipped:,}: it is not the data the run trained on.")
    return split


BASE_BYTES = 2**30  # the process before any tensor: TensorFlow, the data


def estimated_peak_bytes(config: TrainConfig, num_items: int) -> int:
    """An upper estimate of a SASRec run's peak memory: the item table with Adam's two
    moments; a step's activations (about 30 floats per position and dimension per block,
    and the attention maps) and its logits against the negatives (the whole catalog for
    ``full-softmax``), about 4 floats each with the gradient; an evaluation chunk's scores
    against the catalog; and TensorFlow with the data (`BASE_BYTES`)."""
    rows, dim = num_items + 1, config.embedding_dim
    positions = config.batch_size * config.max_length
    table = 3 * rows * dim * 4
    activations = config.num_blocks * (30 * positions * dim * 4 + 4 * config.batch_size
                                       * config.num_heads * config.max_length ** 2 * 4)
    negatives = rows if config.loss == "full-softmax" else config.num_negatives
    logits = 4 * positions * negatives * 4
    evaluation = 4 * 512 * rows * 4
    return BASE_BYTES + table + activations + logits + evaluation


def _stopped_early(keeper: BestEpochKeeper, initial_epoch: int) -> bool:
    """Whether the saved epochs before ``initial_epoch`` already met the patience
    stop (a run killed after its stopping epoch was checkpointed)."""
    if not os.path.exists(keeper.state_path) or not initial_epoch:
        return False
    with open(keeper.state_path) as f:
        epochs = [e for e in json.load(f)["epochs"] if e["epoch"] <= initial_epoch]
    if len(epochs) < initial_epoch:
        return False
    best = max(epochs, key=lambda e: (e[keeper.monitor], -e["epoch"]))["epoch"]
    return initial_epoch - best >= keeper.patience


def _set_policy(name: str) -> None:
    policy = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}[name]
    tf.keras.mixed_precision.set_global_policy(policy)


def train(config: TrainConfig, model_dir: str, verbose="auto",
          split: Optional[Split] = None, extra_callbacks: Optional[list] = None,
          overwrite: bool = False) -> dict:
    """Trains, restores the best epoch, evaluates validation and test; returns metrics.

    A ``model_dir`` holding an interrupted run of the same config resumes it from
    its last finished epoch (weights, optimizer, random counters, data position,
    best epoch and patience) and logs one line saying so; the resumed run ends as
    the uninterrupted one would. One holding another run or a finished one is
    refused unless ``overwrite``, and one another process is training into is
    refused (`RunLock`).

    With ``config.test_window`` = W > 0 the last W epochs are also scored on every
    test user, and ``result["test_window"]`` holds their mean (the fixed-length
    protocol of ``--preset fixed``).
    """
    config.validate(split.num_items if split is not None else None)  # before any work
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise RunDirectoryError(f"--model-dir {model_dir} is a file, not a directory.")
    model_dir = worker_directory(model_dir, config.strategy)
    os.makedirs(model_dir, exist_ok=True)
    with RunLock(model_dir):
        mode = prepare_run_directory(config, model_dir, overwrite)
        if mode == "resume":
            config = _resumed_speed_fields(config, model_dir)
        previous_policy = tf.keras.mixed_precision.global_policy()
        _set_policy(config.mixed_precision)
        try:
            return _train(config, model_dir, verbose, split, extra_callbacks, mode)
        finally:
            tf.keras.mixed_precision.set_global_policy(previous_policy)


def _train(config, model_dir, verbose, split, extra_callbacks, mode) -> dict:
    tf.keras.utils.set_random_seed(config.seed)
    if split is None:
        split = load_config_split(config)
        config.validate(split.num_items)  # the catalog's share, before the run is written
    strategy = make_strategy(config.strategy)
    os.makedirs(model_dir, exist_ok=True)
    if mode == "new":
        write_run_items(model_dir, split.interactions.raw_items)
        # config.json last: it marks the directory as this run's.
        write_json(os.path.join(model_dir, "config.json"),
                   saved_config(config, split.num_items,
                                skipped_lines=split.interactions.skipped_lines))

    model = build_model(config, split, strategy)
    replicas = strategy.num_replicas_in_sync
    trainable_users = int(sum(len(s) >= 2 for s in split.train_sequences()))
    if replicas > 1 and trainable_users < config.batch_size * replicas:
        raise ValueError(
            f"{trainable_users} users have training sequences, fewer than one global batch "
            f"({config.batch_size} x {replicas} replicas); lower --batch-size.")
    best_path = os.path.join(model_dir, "best.weights")
    keeper = BestEpochKeeper(os.path.join(model_dir, "epochs.json"), best_path,
                             patience=config.patience)
    backup = EpochCheckpoint(os.path.join(model_dir, "backup"), model)
    initial_epoch = backup.restore()
    # As the official code: an epoch is at most one pass over the training users
    # (ML-1M at batch 128: 48 steps, not 100).
    steps_per_epoch = min(config.steps_per_epoch,
                          -(-trainable_users // (config.batch_size * replicas)))
    stopped_early = _stopped_early(keeper, initial_epoch)
    if initial_epoch >= config.max_epochs or stopped_early:
        # Killed after its last epoch was saved: nothing is left to train.
        log.info("%s trained %d of %d epochs%s before it stopped; evaluating its best epoch "
                 "(nothing left to train)", model_dir, initial_epoch, config.max_epochs,
                 " and met its patience stop" if stopped_early else "")
    elif initial_epoch:
        log.info("resuming %s from epoch %d of %d (weights, optimizer, random state and "
                 "data position restored)", model_dir, initial_epoch + 1, config.max_epochs)
    # The batch stream is a function of the seed and the batch number: a resumed run
    # starts at the batch where its last finished epoch ended.
    data = training_dataset(split, config.batch_size * replicas, config.max_length,
                            seed=config.seed, drop_remainder=replicas > 1, repeat=True,
                            start_batch=initial_epoch * steps_per_epoch)
    val_arrays = _subsample(evaluation_arrays(split, split.validation, config.max_length),
                            config.max_validation_users, config.seed)
    test_callbacks = []
    if config.test_window:
        test_arrays = evaluation_arrays(split, split.test, config.max_length)
        test_callbacks.append(WindowedTestCallback(
            model, test_arrays, first_epoch=config.max_epochs - config.test_window,
            target_bands=popularity_bands(split.train_item_counts())[test_arrays["targets"]]))
    # Order matters at the end of an epoch: validation (and windowed test metrics),
    # then the caller's callbacks (they see them), then the run state, then the
    # checkpoint that marks the epoch finished.
    callbacks = [
        ValidationCallback(model, val_arrays),
        *test_callbacks,
        *(extra_callbacks or []),
        keeper,
        backup,
        tf.keras.callbacks.TensorBoard(os.path.join(model_dir, "logs"), update_freq="epoch"),
    ]
    if initial_epoch < config.max_epochs and not stopped_early:
        model.fit(data, epochs=config.max_epochs, initial_epoch=initial_epoch,
                  steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=verbose)
    else:
        keeper.on_train_begin()
        keeper.set_model(model)
        keeper.on_train_end()
    train_seconds = sum(e["seconds"] for e in keeper.history)  # resumed runs: all epochs
    ks = (10, 20)
    val_full = evaluate(model.query, model.encoder.item_embeddings(),
                        evaluation_arrays(split, split.validation, config.max_length), ks=ks)
    test = evaluate(model.query, model.encoder.item_embeddings(),
                    evaluation_arrays(split, split.test, config.max_length), ks=ks)
    epochs = len(keeper.history)
    result = {
        "dataset": config.dataset, "split": config.split, "loss": config.loss,
        "seed": config.seed, "preset": config.preset,
        "epochs": epochs, "steps": epochs * steps_per_epoch,
        "best_epoch": keeper.best_epoch,
        "train_seconds": round(train_seconds, 1),
        "validation_curve": [round(e[MONITOR], 6) for e in keeper.history],
        "validation": val_full, "test": test,
        "test_window": windowed_test_metrics(keeper.history, config.test_window),
        # Whether this process trained with `tfrs_logq.sasrec.native`'s kernels (same maths;
        # its dropout masks differ from TensorFlow's ops', so a seed reproduces a run
        # only on the same path).
        "native_kernels": uses_native_kernels(model),
        # A non-finite training loss in the last epoch: the weights are NaN from then on,
        # and the metrics (a NaN score ranks last) read 0, not a result.
        "diverged": bool(keeper.history) and not np.isfinite(
            float(keeper.history[-1].get("loss", 0.0))),
    }
    if backup.kernels_changed:
        result["native_kernels_changed_on_resume"] = True
    write_json(os.path.join(model_dir, "metrics.json"), result)
    return result


__all__ = ["build_encoder", "build_model", "estimated_peak_bytes", "load_config_split",
           "load_recorded_split", "make_strategy", "train", "training_item_counts"]
