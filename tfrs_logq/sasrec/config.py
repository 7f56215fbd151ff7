"""Training configuration: `TrainConfig`, the presets and the option names.

Free of TensorFlow, so the command line can build its flags from it without
importing TensorFlow. `tfrs_logq.sasrec.training` re-exports everything here.

`TrainConfig` checks every field when it is made (and again by `dataclasses.replace`),
so the Python API refuses what ``tfrs-logq train`` refuses: an unknown loss, preset,
dataset, split, strategy or precision policy, a size below 1, a rate or fraction out of
its range. Each error is one line naming the field and its flag.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
from tfrs_logq.pipelines.splits import SPLITS

STRATEGIES = ("auto", "default", "mirrored", "multi-worker", "tpu")
# "bfloat16": mixed_bfloat16 (CPU, TPU); "float16": mixed_float16 with dynamic loss
# scaling (GPU). The policy is set for one `train` call and reset afterwards.
MIXED_PRECISION_POLICIES = ("none", "bfloat16", "float16")
MONITOR = "val_ndcg@10"
# The training objectives (`tfrs_logq.sasrec.objectives`), named here so that the command
# line lists them without importing TensorFlow.
CORRECTED_NAMES = ("none", "logq", "corrected")
OBJECTIVES = (
    "bce", "gbce", "uniform",
    *(f"inbatch-{c}" for c in CORRECTED_NAMES),
    *(f"mns-{c}" for c in CORRECTED_NAMES),
    "full-softmax",
)


class ConfigError(ValueError):
    """A `TrainConfig` field with a value it refuses. One line: the field, its flag and
    the problem (``field``, ``flag`` and ``problem`` hold them apart, for the command line
    to say ``argument --seed: must be >= 0, received -1``)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.flag, self.problem = field, FLAGS.get(field, field), problem
        super().__init__(f"`{field}` ({self.flag}) {problem}")


@dataclasses.dataclass
class TrainConfig:
    """One training run of SASRec: data, model, objective and schedule.

    Every field is checked when the config is made (and by `dataclasses.replace`): an
    unknown name or a value out of range raises `ConfigError` (a `ValueError`) naming
    the field and its ``tfrs-logq train`` flag. The field docstrings are the flags' help.
    """

    dataset: str = "ml-1m"
    """dataset to train on"""
    split: str = "temporal"
    """evaluation split: leave-one-out (loo), gSASRec's validation users (gsasrec) or
    global temporal (needs timestamps)"""
    loss: str = "mns-corrected"
    """training objective: the paper's losses"""
    data_dir: Optional[str] = None
    """directory holding the data files, searched at its top level and one level down;
    never falls back elsewhere"""
    data_format: Optional[str] = None
    """ML-1M source: MovieLens's ratings.dat (timestamps) or SASRec's ml-1m.txt (order
    only; no download exists)"""
    max_length: int = 200
    """longest history the model reads"""
    embedding_dim: int = 128
    """embedding size"""
    num_blocks: int = 2
    """self-attention blocks"""
    num_heads: int = 1
    """attention heads"""
    dropout: float = 0.5
    """dropout rate"""
    num_negatives: int = 256
    """sampled negatives per target"""
    batch_size: int = 128
    """users per batch (per replica)"""
    learning_rate: float = 1e-3
    """Adam's learning rate"""
    steps_per_epoch: int = 100
    """training steps between validations"""
    max_epochs: int = 10_000
    """most epochs"""
    patience: int = 200
    """epochs without a better validation NDCG@10 before stopping"""
    max_validation_users: Optional[int] = None
    """validate each epoch on a seeded sample of this many users"""
    test_window: int = 0
    """also score every test user after each of the last N epochs; the result's
    test_window is their mean (0: off)"""
    temporal_fraction: Optional[float] = None
    """temporal split: fraction of interactions for test, and again for validation"""
    seed: int = 0
    """random seed"""
    strategy: str = "auto"
    """tf.distribute strategy (auto: TPU, multi-worker, several GPUs, else default)"""
    cross_replica_negatives: bool = False
    """draw in-batch negatives from the targets of all replicas"""
    mixed_precision: str = "none"
    """mixed-precision policy"""
    jit_compile: bool = False
    """compile the training step with XLA"""
    share_item_embeddings: bool = False
    """score with the input item embeddings (weight tying)"""
    length_buckets: int = 8
    """speed only: run the SASRec blocks on this many groups of similar-length sequences,
    each without its padding columns (1 under --xla and on TPU)"""
    preset: Optional[str] = None
    """a set of defaults: smoke (minutes on 2 CPU cores), cpu (a fixed CPU budget), long
    (the paper's model, 80 epochs at most, patience 10), fixed (long run to its end,
    scored over its last 20 epochs), paper (the paper's protocol, for a GPU); flags and
    --config override it"""
    examples: Optional[str] = None
    """train on this ExampleGen artifact of `tfrs-logq pipeline run`
    (PIPELINE_ROOT/ExampleGen) instead of loading the data file; its dataset and split
    are used"""
    log_q: Optional[str] = None
    """take log Q (training item counts) from this Statistics artifact
    (PIPELINE_ROOT/Statistics) instead of counting them"""

    def __post_init__(self) -> None:
        if isinstance(self.mixed_precision, bool):  # configs written before 0.2
            self.mixed_precision = "none" if not self.mixed_precision else "float16"
        names = {"loss": OBJECTIVES, "strategy": STRATEGIES, "split": SPLITS,
                 "mixed_precision": MIXED_PRECISION_POLICIES}
        for name, allowed in names.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(name, f"must be one of {allowed}, received "
                                        f"{getattr(self, name)!r}.")
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError("preset", f"must be one of {tuple(PRESETS)}, received "
                                        f"{self.preset!r}.")
        # "": a file of `pipeline run --input` that names no dataset.
        if self.dataset not in (*DATASETS, ""):
            raise ConfigError("dataset", f"must be one of {DATASETS}, received "
                                         f"{self.dataset!r}.")
        # An ExampleGen artifact (`examples`) records its own format (csv, steam, ...).
        if (self.dataset == "ml-1m" and self.examples is None
                and self.data_format not in (None, *ML1M_FORMATS)):
            raise ConfigError("data_format", f"of ml-1m must be one of {ML1M_FORMATS}, "
                                             f"received {self.data_format!r}.")
        for name in ("max_length", "embedding_dim", "num_blocks", "num_heads", "num_negatives",
                     "batch_size", "steps_per_epoch", "max_epochs", "length_buckets"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(name, f"must be >= 1, received {getattr(self, name)}.")
        for name in ("seed", "patience"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(name, f"must be >= 0, received {getattr(self, name)}.")
        if self.max_validation_users is not None and int(self.max_validation_users) < 1:
            raise ConfigError("max_validation_users", f"must be >= 1, received "
                                                      f"{self.max_validation_users}.")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ConfigError("dropout", f"must be in [0, 1), received {self.dropout}.")
        if not float(self.learning_rate) > 0.0:
            raise ConfigError("learning_rate", f"must be > 0, received {self.learning_rate}.")
        if self.temporal_fraction is not None and not 0.0 < float(self.temporal_fraction) < 0.5:
            raise ConfigError("temporal_fraction", f"must be in (0, 0.5), received "
                                                   f"{self.temporal_fraction}.")
        if not 0 <= int(self.test_window) <= int(self.max_epochs):
            raise ConfigError("test_window", f"must be in [0, max_epochs = {self.max_epochs}], "
                                             f"received {self.test_window}.")


# Each field's `tfrs-logq train` flag (its other spelling, --data_dir, is accepted too).
FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)}
FLAGS["jit_compile"] = "--xla"


# The paper's protocol (gSASRec defaults) for a GPU; the paper's model and data with
# a step cap and a short patience, for long runs on 2 CPU cores (80 epochs of 48 steps
# at most on ML-1M); the same run to its end, scored over its last epochs; a fixed
# small CPU budget; and a smoke test for CI. A preset sets these fields; explicit
# flags override it.
PRESETS = {
    "paper": {},
    "long": {"split": "gsasrec", "max_epochs": 80, "patience": 10},
    # The long preset run to its end (no early stop), scored by the mean test metrics
    # of all users over its last 20 epochs (issue 26's powered comparison).
    "fixed": {"split": "gsasrec", "max_epochs": 80, "patience": 10_000, "test_window": 20},
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


def examples_config(config: TrainConfig, explicit=()) -> TrainConfig:
    """``config`` with the data fields (``dataset``, ``split``, ``data_format``,
    ``temporal_fraction``) of its ExampleGen artifact ``config.examples``: the artifact
    decides them. A field named in ``explicit`` (set by the user) that disagrees is
    an error rather than silently replaced.

    Raises:
      ArtifactError: ``config.examples`` is not a finished, intact ExampleGen artifact.
      ValueError: an explicit field disagrees with the artifact.
    """
    from tfrs_logq.pipelines.manifest import verified_manifest

    params = verified_manifest(config.examples, "ExampleGen")["parameters"]
    found = {"split": params["split"], "dataset": params["dataset"],
             "data_format": params["data_format"],
             "temporal_fraction": params["split_options"].get("fraction")}
    for name in explicit:
        if name in found and getattr(config, name) not in (None, found[name]):
            flag = FLAGS[name]
            raise ValueError(f"{flag} {getattr(config, name)} disagrees with --examples "
                             f"{config.examples}, whose {name} is {found[name]!r}; leave "
                             f"{flag} out (the artifact decides it).")
    return dataclasses.replace(config, **found)


__all__ = ["FLAGS", "MIXED_PRECISION_POLICIES", "MONITOR", "OBJECTIVES", "PRESETS", "STRATEGIES",
           "ConfigError", "TrainConfig", "examples_config", "resolve_config"]
