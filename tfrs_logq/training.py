"""`tfrs-logq train`: SASRec with any objective, through Keras `model.fit`.

Validation NDCG@10 (full catalog, seen items excluded) after every epoch drives
early stopping and the best checkpoint, which is restored at the end; a
`BackupAndRestore` directory makes an interrupted run resume where it stopped;
TensorBoard logs go to ``MODEL_DIR/logs``. ``MODEL_DIR`` ends up holding
``config.json``, ``best.weights.*`` (the restored best model), ``metrics.json``
and ``vocabulary.json`` (item id -> the dataset's own id), which is what
``tfrs-logq export`` reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.models import SASRecEncoder, SequentialRetrievalModel
from tfrs_logq.objectives import make_objective
from tfrs_logq.pipelines.datasets import load_dataset
from tfrs_logq.pipelines.sequential import evaluate, evaluation_arrays, training_dataset
from tfrs_logq.pipelines.splits import Split, make_split

STRATEGIES = ("auto", "default", "mirrored", "multi-worker", "tpu")


@dataclasses.dataclass
class TrainConfig:
    dataset: str = "ml-1m"
    split: str = "temporal"
    loss: str = "mns-corrected"
    data_dir: Optional[str] = None
    data_format: Optional[str] = None
    max_length: int = 200
    embedding_dim: int = 128
    num_blocks: int = 2
    num_heads: int = 1
    dropout: float = 0.5
    num_negatives: int = 256
    batch_size: int = 128
    learning_rate: float = 1e-3
    steps_per_epoch: int = 100
    max_epochs: int = 10_000
    patience: int = 200
    max_validation_users: Optional[int] = None
    temporal_fraction: Optional[float] = None
    seed: int = 0
    strategy: str = "auto"
    cross_replica_negatives: bool = False
    mixed_precision: bool = False
    jit_compile: bool = False
    preset: Optional[str] = None


# The paper's protocol (gSASRec defaults) for a GPU; a fixed CPU step budget; and a
# smoke test for CI. A preset sets these fields; explicit flags override it.
PRESETS = {
    "paper": {},
    "cpu": {"max_length": 200, "embedding_dim": 64, "batch_size": 64, "steps_per_epoch": 50,
            "max_epochs": 12, "patience": 12, "max_validation_users": 2048},
    "smoke": {"max_length": 30, "embedding_dim": 16, "num_blocks": 1, "batch_size": 32,
              "num_negatives": 32, "steps_per_epoch": 5, "max_epochs": 2, "patience": 2,
              "max_validation_users": 256, "dropout": 0.2},
}


def resolve_config(preset: Optional[str] = None, **overrides) -> TrainConfig:
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {tuple(PRESETS)}.")
    fields = {**(PRESETS[preset] if preset else {}),
              **{k: v for k, v in overrides.items() if v is not None}}
    unknown = set(fields) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"unknown training options: {sorted(unknown)}")
    return TrainConfig(preset=preset, **fields)


def make_strategy(kind: str = "auto") -> tf.distribute.Strategy:
    """``auto``: TPUStrategy if a TPU is found, MultiWorkerMirroredStrategy if
    ``TF_CONFIG`` names a cluster, MirroredStrategy with several GPUs, else the
    default strategy. Any of ``default``, ``mirrored``, ``multi-worker``, ``tpu``
    forces that one."""
    if kind not in STRATEGIES:
        raise ValueError(f"unknown strategy {kind!r}; expected one of {STRATEGIES}.")
    if kind == "tpu" or (kind == "auto" and os.environ.get("TPU_NAME")):
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if kind == "multi-worker" or (kind == "auto" and "cluster" in
                                  json.loads(os.environ.get("TF_CONFIG", "{}"))):
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if kind == "mirrored" or (kind == "auto" and len(gpus) > 1):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


class ValidationCallback(tf.keras.callbacks.Callback):
    """Adds ``val_ndcg@10`` and ``val_recall@10`` to the epoch logs."""

    def __init__(self, model_ref, arrays: dict) -> None:
        super().__init__()
        self._model_ref = model_ref
        self.arrays = arrays

    def on_epoch_end(self, epoch, logs=None):
        metrics = evaluate(self._model_ref.query, self._model_ref.encoder.item_embeddings(),
                           self.arrays, ks=(10,))
        if logs is not None:
            logs["val_ndcg@10"] = metrics["ndcg@10"]
            logs["val_recall@10"] = metrics["recall@10"]


def _subsample(arrays: dict, limit: Optional[int], seed: int) -> dict:
    n = len(arrays["targets"])
    if limit is None or n <= limit:
        return arrays
    idx = np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))
    return {k: (None if v is None else v[idx]) for k, v in arrays.items()}


def build_model(config: TrainConfig, split: Split, strategy) -> SequentialRetrievalModel:
    with strategy.scope():
        encoder = SASRecEncoder(split.num_items + 1, config.max_length, config.embedding_dim,
                                config.num_blocks, config.num_heads, config.dropout)
        objective = make_objective(config.loss, split.num_items, split.train_item_counts(),
                                   num_negatives=config.num_negatives, seed=config.seed,
                                   cross_replica_negatives=config.cross_replica_negatives)
        model = SequentialRetrievalModel(encoder, objective)
        # Create every weight now (a forward pass) so checkpoints and
        # BackupAndRestore can restore into a built model.
        encoder(tf.zeros([1, config.max_length], tf.int32))
        model.built = True
        model.compile(optimizer=tf.keras.optimizers.Adam(config.learning_rate),
                      jit_compile=config.jit_compile)
    return model


def load_split(config: TrainConfig) -> Split:
    kwargs = {}
    if config.data_format:
        kwargs["fmt"] = config.data_format
    interactions = load_dataset(config.dataset, config.data_dir,
                                needs_timestamps=config.split == "temporal", **kwargs)
    split_kwargs = {}
    if config.split == "temporal":
        split_kwargs["fraction"] = config.temporal_fraction or (
            0.1 if config.dataset == "ml-1m" else 0.01)
    return make_split(interactions, config.split, **split_kwargs)


def train(config: TrainConfig, model_dir: str, verbose="auto",
          split: Optional[Split] = None, extra_callbacks: Optional[list] = None) -> dict:
    """Trains, restores the best epoch, evaluates validation and test; returns metrics."""
    tf.keras.utils.set_random_seed(config.seed)
    if config.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    split = split if split is not None else load_split(config)
    strategy = make_strategy(config.strategy)
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        saved = dataclasses.asdict(config)
        if saved["data_dir"]:
            saved["data_dir"] = os.path.abspath(saved["data_dir"])
        json.dump({**saved, "num_items": split.num_items}, f, indent=2)
    with open(os.path.join(model_dir, "vocabulary.json"), "w") as f:
        json.dump({"raw_items": [str(x) for x in split.interactions.raw_items]}, f)

    model = build_model(config, split, strategy)
    replicas = strategy.num_replicas_in_sync
    trainable_users = int(sum(len(s) >= 2 for s in split.train_sequences()))
    if replicas > 1 and trainable_users < config.batch_size * replicas:
        raise ValueError(
            f"{trainable_users} users have training sequences, fewer than one global batch "
            f"({config.batch_size} x {replicas} replicas); lower --batch-size.")
    data = training_dataset(split, config.batch_size * replicas, config.max_length,
                            seed=config.seed, drop_remainder=replicas > 1).repeat()
    val_arrays = _subsample(evaluation_arrays(split, split.validation, config.max_length),
                            config.max_validation_users, config.seed)
    best_path = os.path.join(model_dir, "best.weights")
    callbacks = [
        ValidationCallback(model, val_arrays),
        tf.keras.callbacks.EarlyStopping(monitor="val_ndcg@10", mode="max",
                                         patience=config.patience, restore_best_weights=True),
        tf.keras.callbacks.ModelCheckpoint(best_path, monitor="val_ndcg@10", mode="max",
                                           save_best_only=True, save_weights_only=True),
        tf.keras.callbacks.BackupAndRestore(os.path.join(model_dir, "backup")),
        tf.keras.callbacks.TensorBoard(os.path.join(model_dir, "logs"), update_freq="epoch"),
        *(extra_callbacks or []),
    ]
    start = time.perf_counter()
    history = model.fit(data, epochs=config.max_epochs, steps_per_epoch=config.steps_per_epoch,
                        callbacks=callbacks, verbose=verbose)
    train_seconds = time.perf_counter() - start
    if os.path.exists(best_path + ".index"):
        model.load_weights(best_path)
    ks = (10, 20)
    val_full = evaluate(model.query, model.encoder.item_embeddings(),
                        evaluation_arrays(split, split.validation, config.max_length), ks=ks)
    test = evaluate(model.query, model.encoder.item_embeddings(),
                    evaluation_arrays(split, split.test, config.max_length), ks=ks)
    epochs = len(history.history.get("loss", []))
    result = {
        "dataset": config.dataset, "split": config.split, "loss": config.loss,
        "seed": config.seed, "preset": config.preset,
        "epochs": epochs, "steps": epochs * config.steps_per_epoch,
        "train_seconds": round(train_seconds, 1),
        "validation": val_full, "test": test,
    }
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result
