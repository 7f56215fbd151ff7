"""Training configuration: `TrainConfig`, the presets and the option names.

Free of TensorFlow, so the command line can build its flags from it without
importing TensorFlow. `tfrs_logq.training` re-exports everything here.

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
# The training objectives (`tfrs_logq.objectives`), named here so that the command
# line lists them without importing TensorFlow.
CORRECTED_NAMES = ("none", "logq", "corrected")
OBJECTIVES = (
    "bce", "gbce", "uniform",
    *(f"inbatch-{c}" for c in CORRECTED_NAMES),
    *(f"mns-{c}" for c in CORRECTED_NAMES),
    "full-softmax",
)


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
    # Fixed-length protocol: also score every test user after each of the last
    # `test_window` epochs; the result's `test_window` is their mean (0: off).
    test_window: int = 0
    temporal_fraction: Optional[float] = None
    seed: int = 0
    strategy: str = "auto"
    cross_replica_negatives: bool = False
    mixed_precision: str = "none"
    jit_compile: bool = False
    share_item_embeddings: bool = False
    # Speed only (the same model and result): run the SASRec blocks on this many
    # groups of similar-length sequences, each without its all-padding columns
    # (`SASRecEncoder`). Ignored (1) under XLA and on TPU, which need static shapes.
    length_buckets: int = 8
    preset: Optional[str] = None
    # The batch pipeline's artifacts (`tfrs_logq.pipelines.beam`): train on an
    # ExampleGen artifact's split instead of loading the data file, and take log Q
    # (training item counts) from a Statistics artifact instead of counting them.
    examples: Optional[str] = None
    log_q: Optional[str] = None

    def __post_init__(self) -> None:
        if isinstance(self.mixed_precision, bool):  # configs written before 0.2
            self.mixed_precision = "none" if not self.mixed_precision else "float16"
        if self.mixed_precision not in MIXED_PRECISION_POLICIES:
            raise ValueError(f"`mixed_precision` must be one of {MIXED_PRECISION_POLICIES}, "
                             f"received {self.mixed_precision!r}.")
        if int(self.seed) < 0:
            raise ValueError(f"`seed` (--seed) must be >= 0, received {self.seed}.")
        if int(self.length_buckets) < 1:
            raise ValueError(f"`length_buckets` (--length-buckets) must be >= 1, received "
                             f"{self.length_buckets}.")
        if self.loss not in OBJECTIVES:
            raise ValueError(f"`loss` (--loss) must be one of {OBJECTIVES}, received "
                             f"{self.loss!r}.")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"`strategy` (--strategy) must be one of {STRATEGIES}, received "
                             f"{self.strategy!r}.")
        for name in ("max_length", "embedding_dim", "num_blocks", "num_heads", "num_negatives",
                     "batch_size", "steps_per_epoch", "max_epochs"):
            if int(getattr(self, name)) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"`{name}` ({flag}) must be >= 1, received "
                                 f"{getattr(self, name)}.")
        if int(self.patience) < 0:
            raise ValueError(f"`patience` (--patience) must be >= 0, received {self.patience}.")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"`dropout` (--dropout) must be in [0, 1), received {self.dropout}.")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"`preset` (--preset) must be one of {tuple(PRESETS)}, received "
                             f"{self.preset!r}.")
        # "": a file of `pipeline run --input` that names no dataset.
        if self.dataset not in (*DATASETS, ""):
            raise ValueError(f"`dataset` (--dataset) must be one of {DATASETS}, received "
                             f"{self.dataset!r}.")
        if self.split not in SPLITS:
            raise ValueError(f"`split` (--split) must be one of {SPLITS}, received "
                             f"{self.split!r}.")
        # An ExampleGen artifact (`examples`) records its own format (csv, steam, ...).
        if (self.dataset == "ml-1m" and self.examples is None
                and self.data_format not in (None, *ML1M_FORMATS)):
            raise ValueError(f"`data_format` (--data-format) of ml-1m must be one of "
                             f"{ML1M_FORMATS}, received {self.data_format!r}.")
        if not float(self.learning_rate) > 0.0:
            raise ValueError(f"`learning_rate` (--learning-rate) must be > 0, received "
                             f"{self.learning_rate}.")
        if self.max_validation_users is not None and int(self.max_validation_users) < 1:
            raise ValueError(f"`max_validation_users` (--max-validation-users) must be >= 1, "
                             f"received {self.max_validation_users}.")
        if self.temporal_fraction is not None and not 0.0 < float(self.temporal_fraction) < 0.5:
            raise ValueError(f"`temporal_fraction` (--temporal-fraction) must be in (0, 0.5), "
                             f"received {self.temporal_fraction}.")
        if not 0 <= int(self.test_window) <= int(self.max_epochs):
            raise ValueError(f"`test_window` (--test-window) must be in [0, max_epochs = "
                             f"{self.max_epochs}], received {self.test_window}.")


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
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {getattr(config, name)} disagrees with --examples "
                             f"{config.examples}, whose {name} is {found[name]!r}; leave "
                             f"{flag} out (the artifact decides it).")
    return dataclasses.replace(config, **found)


__all__ = ["MIXED_PRECISION_POLICIES", "MONITOR", "OBJECTIVES", "PRESETS", "STRATEGIES",
           "TrainConfig", "examples_config", "resolve_config"]
