"""Training configuration: `TrainConfig`, the presets and the option names.

Free of TensorFlow, so the command line can build its flags from it without
importing TensorFlow. `tfrs_logq.sasrec.training` re-exports everything here.

`TrainConfig` checks every field when it is made (and again by `dataclasses.replace`),
so the Python API refuses what ``tfrs-logq train`` refuses: a value of the wrong type, an
unknown loss, preset, dataset, split, strategy or precision policy, a size below 1 or
above its bound (`LIMITS`), a rate or fraction out of its range. `TrainConfig.validate`
adds what depends on several fields: the largest tensor a training step makes
(`largest_tensor`) against ``max_tensor_gib``. `resolve_config` and ``train`` run it
before any work, so ``train --max-length 100000000`` is one line, not 87 s and 21 GB
then a traceback. Each error is one line naming the field and its flag.

The bounds (`LIMITS`), far above any run of the paper and below what breaks a step:
history length (``max_length``) 10,000; embedding size 4,096; blocks 64; heads 256 (and
a divisor of the embedding size); negatives 1,000,000; batch 1,000,000 users; 10,000,000 steps
an epoch; 1,000,000 epochs; 1,024 length buckets.

A run's saved ``config.json`` becomes a `TrainConfig` again with `TrainConfig.from_json`
(`TrainConfig.from_dict` for a dict): every key a field (or one of `RUN_RECORD_KEYS`,
which the run directory adds beside them), every value of its field's type.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import typing
from typing import Any, Literal, Mapping, Optional

from tfrs_logq._util.strategy import STRATEGIES
from tfrs_logq.corrections import CORRECTIONS, NEGATIVES, LossNameError, parse_loss_name
from tfrs_logq.pipelines.datasets import DATASETS, ML1M_FORMATS
from tfrs_logq.pipelines.source import LOG_FORMATS
from tfrs_logq.pipelines.splits import SPLITS

# "bfloat16": mixed_bfloat16 (CPU, TPU); "float16": mixed_float16 with dynamic loss
# scaling (GPU). The policy is set for one `train` call and reset afterwards.
MIXED_PRECISION_POLICIES = ("none", "bfloat16", "float16")
MONITOR = "val_ndcg@10"
# The training objectives (`tfrs_logq.sasrec.objectives`), named here so that the command
# line lists them without importing TensorFlow; the sampled softmax ones take every
# correction of `tfrs_logq.corrections`.
CORRECTED_NAMES = CORRECTIONS
OBJECTIVES = (
    "bce", "gbce", "uniform",
    *(f"{n}-{c}" for n in NEGATIVES for c in CORRECTED_NAMES),
    "full-softmax",
)


# Upper bounds of the size fields (the module docstring says why these).
LIMITS = {
    "max_length": 10_000,
    "embedding_dim": 4_096,
    "num_blocks": 64,
    "num_heads": 256,
    "num_negatives": 1_000_000,
    "batch_size": 1_000_000,
    "steps_per_epoch": 10_000_000,
    "max_epochs": 1_000_000,
    "length_buckets": 1_024,
}
# How a user's log is filtered before the split (`tfrs_logq.pipelines.source.LogFilters`'s
# fields, with its defaults): TrainConfig's fields too, so a run reloads its split.
LOG_FILTERS = ("min_item_interactions", "min_user_interactions", "deduplicate")
# Keys a run's config.json holds beside the TrainConfig fields (`run.saved_config`).
RUN_RECORD_KEYS = ("num_items", "skipped_lines")
# The fields that say which data and which split a run reads (and nothing about the
# model): a two-tower run records them too, so export and evaluation reload its split.
DATA_FIELDS = ("dataset", "split", "data_dir", "data_format", "temporal_fraction",
               "examples", "interactions", "user_column", "item_column", "time_column",
               "log_format", *LOG_FILTERS)
GIB = 1 << 30


# The paper's protocol (gSASRec defaults) for a GPU; the paper's model and data with
# a step cap and a short patience, for long runs on 2 CPU cores (80 epochs of 48 steps
# at most on ML-1M); the same run to its end, scored over its last epochs; a fixed
# small CPU budget; and a smoke test for CI. A preset sets these fields; explicit
# flags override it.
PRESETS = {
    "paper": {},
    "long": {"split": "gsasrec", "max_epochs": 80, "patience": 10},
    # The long preset run to its end (no early stop), scored by the mean test metrics
    # of all users over its last 20 epochs (the powered comparison).
    "fixed": {"split": "gsasrec", "max_epochs": 80, "patience": 10_000, "test_window": 20},
    "cpu": {"max_length": 200, "embedding_dim": 64, "batch_size": 64, "steps_per_epoch": 50,
            "max_epochs": 12, "patience": 12, "max_validation_users": 2048},
    "smoke": {"max_length": 30, "embedding_dim": 16, "num_blocks": 1, "batch_size": 32,
              "num_negatives": 32, "steps_per_epoch": 5, "max_epochs": 2, "patience": 2,
              "max_validation_users": 256, "dropout": 0.2},
}


def resolve_config(preset: Optional[str] = None, **overrides) -> TrainConfig:
    """The preset's fields, then ``overrides`` (None leaves the preset's), checked
    (`TrainConfig.validate` too).

    Raises:
      ValueError: an unknown preset or option; `ConfigError`: a bad value.
    """
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {tuple(PRESETS)}.")
    fields = {**(PRESETS[preset] if preset else {}),
              **{k: v for k, v in overrides.items() if v is not None}}
    unknown = set(fields) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"unknown training options: {sorted(unknown)}")
    return TrainConfig(preset=preset, **fields).validate()


def examples_config(config: TrainConfig, explicit=()) -> TrainConfig:
    """``config`` with the data fields (``dataset``, ``split``, ``data_format``,
    ``temporal_fraction``) of its ExampleGen artifact ``config.examples``: the artifact
    decides them. A field named in ``explicit`` (set by the user) that disagrees is
    an error rather than silently replaced.

    Raises:
      ArtifactError: ``config.examples`` is not a finished, intact ExampleGen artifact.
      ValueError: an explicit field disagrees with the artifact, or the artifact is
        synthetic draws (`SyntheticExampleGen`'s), which no `TrainConfig` trains on.
    """
    from tfrs_logq.pipelines.manifest import verified_manifest

    params = verified_manifest(config.examples, "ExampleGen")["parameters"]
    if params.get("dataset") == "synthetic":  # SyntheticExampleGen's, no TrainConfig dataset
        raise ValueError(f"--examples {config.examples} is a synthetic ExampleGen artifact "
                         "(pipeline run --dataset synthetic), which cannot be trained on: a "
                         "synthetic pipeline stops after Statistics; give a dataset's or "
                         "a log's ExampleGen artifact.")
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


__all__ = ["DATA_FIELDS", "FLAGS", "LIMITS", "MIXED_PRECISION_POLICIES", "MONITOR", "OBJECTIVES",
           "PRESETS", "RUN_RECORD_KEYS", "STRATEGIES", "ConfigError", "TrainConfig",
           "examples_config", "largest_tensor", "resolve_config"]


class ConfigError(ValueError):
    """A `TrainConfig` field with a value it refuses. One line: the field, its flag and
    the problem (``field``, ``flag`` and ``problem`` hold them apart, for the command line
    to say ``argument --seed: must be >= 0, received -1``)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.flag, self.problem = field, FLAGS.get(field, field), problem
        super().__init__(f"`{field}` ({self.flag}) {problem}" if field in FLAGS
                         else f"{field} {problem}")


@dataclasses.dataclass
class TrainConfig:
    """One training run of SASRec: data, model, objective and schedule.

    Every field is checked when the config is made (and by `dataclasses.replace`): an
    unknown name or a value out of range raises `ConfigError` (a `ValueError`) naming
    the field and its ``tfrs-logq train`` flag. The field docstrings are the flags' help.
    """

    dataset: Literal[DATASETS] = "ml-1m"
    """dataset to train on"""
    split: Literal[SPLITS] = "temporal"
    """evaluation split: leave-one-out (loo), gSASRec's validation users (gsasrec) or
    global temporal (needs timestamps)"""
    loss: Literal[OBJECTIVES] = "mns-corrected"
    """training objective: the paper's losses"""
    data_dir: Optional[str] = None
    """directory holding the data files, searched at its top level and one level down;
    never falls back elsewhere"""
    data_format: Optional[Literal[ML1M_FORMATS]] = None
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
    strategy: Literal[STRATEGIES] = "auto"
    """tf.distribute strategy (auto: TPU, multi-worker, several GPUs, else default)"""
    cross_replica_negatives: bool = False
    """draw in-batch negatives from the targets of all replicas"""
    mixed_precision: Literal[MIXED_PRECISION_POLICIES] = "none"
    """mixed-precision policy"""
    jit_compile: bool = False
    """compile the training step with XLA"""
    share_item_embeddings: bool = False
    """score with the input item embeddings (weight tying)"""
    length_buckets: int = 8
    """speed only: run the SASRec blocks on this many groups of similar-length sequences,
    each without its padding columns (1 under --jit-compile and on TPU)"""
    preset: Optional[Literal[tuple(PRESETS)]] = None
    """a set of defaults: smoke (about a minute on 2 CPU cores: a plumbing check, not a
    usable model), cpu (a fixed CPU budget), long (the paper's model, 80 epochs at most,
    patience 10), fixed (long run to its end, scored over its last 20 epochs), paper (the
    paper's protocol, for a GPU); flags and config files override it"""
    examples: Optional[str] = None
    """train on this ExampleGen artifact of `tfrs-logq pipeline run`
    (PIPELINE_ROOT/ExampleGen) instead of loading the data file; its dataset and split
    are used"""
    log_q: Optional[str] = None
    """take log Q (training item counts) from this Statistics artifact
    (PIPELINE_ROOT/Statistics) instead of counting them"""
    interactions: Optional[str] = None
    """train on your own log instead of --dataset: a CSV/TSV (optionally .gz), Parquet or
    JSON Lines file, a glob or a directory (with --user-column and --item-column)"""
    user_column: Optional[str] = None
    """--interactions: the column of user ids (text or integers)"""
    item_column: Optional[str] = None
    """--interactions: the column of item ids (text or integers)"""
    time_column: Optional[str] = None
    """--interactions: the column of times, integer seconds or ISO 8601 (without it the
    file order is each user's order, and --split temporal is not possible)"""
    log_format: Optional[Literal[LOG_FORMATS]] = None
    """--interactions: csv, tsv, parquet or jsonl for every file"""
    min_item_interactions: int = 5
    """drop items with fewer interactions"""
    min_user_interactions: int = 0
    """then drop users with fewer"""
    deduplicate: bool = False
    """keep only the first of repeated (user, item) pairs"""
    max_tensor_gib: float = 4.0
    """refuse a config whose largest training tensor (estimated from batch, history
    length, heads, embedding size and negatives) exceeds this many GiB, before any work
    (0: no check)"""

    def __post_init__(self) -> None:
        self._check_types()
        names = {"strategy": STRATEGIES, "split": SPLITS,
                 "mixed_precision": MIXED_PRECISION_POLICIES}
        try:
            parse_loss_name(self.loss, OBJECTIVES)
        except LossNameError as error:
            raise ConfigError("loss", error.problem) from None  # after the field and its flag
        for name, allowed in names.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(name, f"must be one of {allowed}, received "
                                        f"{getattr(self, name)!r}.")
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError("preset", f"must be one of {tuple(PRESETS)}, received "
                                        f"{self.preset!r}.")
        if self.log_format not in (None, *LOG_FORMATS):
            raise ConfigError("log_format", f"must be one of csv, tsv, parquet, jsonl, received "
                                            f"{str(self.log_format)[:40]!r}.")
        # "": an ExampleGen artifact of a file or a log that is no built-in dataset.
        if self.dataset not in (*DATASETS, ""):
            raise ConfigError("dataset", f"must be one of {DATASETS}, received "
                                         f"{self.dataset!r}.")
        # An ExampleGen artifact (`examples`) records its own format (csv, steam, ...).
        if (self.dataset == "ml-1m" and self.examples is None
                and self.data_format not in (None, *ML1M_FORMATS)):
            raise ConfigError("data_format", f"of ml-1m must be one of {ML1M_FORMATS}, "
                                             f"received {self.data_format!r}.")
        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if not 1 <= value <= limit:
                raise ConfigError(name, f"must be in [1, {limit:,}], received {value:,}.")
        if not float(self.max_tensor_gib) >= 0.0:
            raise ConfigError("max_tensor_gib", f"must be >= 0, received {self.max_tensor_gib}.")
        if int(self.min_item_interactions) < 1:
            raise ConfigError("min_item_interactions", f"must be >= 1, received "
                                                       f"{self.min_item_interactions}.")
        for name in ("seed", "patience", "min_user_interactions"):
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

    def _check_types(self) -> None:
        """Each field's value is of its annotated type: a bool for a bool, an integer
        (not a bool) for an int, a number for a float, a string for a str; None only
        where the field is Optional."""
        for field in dataclasses.fields(self):
            value, kind = getattr(self, field.name), _FIELD_TYPES[field.name]
            optional = type(None) in typing.get_args(kind)
            base = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
            if typing.Literal in (typing.get_origin(kind), typing.get_origin(base)):
                base = str  # the choices are checked by name (`__post_init__`)
            if value is None and optional:
                continue
            if base is bool:
                ok = isinstance(value, bool)
            elif base is int:
                ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            elif base is float:
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
            else:
                ok = isinstance(value, base)
            if not ok:
                shown = json.dumps(value) if isinstance(value, (str, bool, int, float)) \
                    else type(value).__name__
                raise ConfigError(field.name, f"must be {'None or ' if optional else ''}"
                                              f"{base.__name__}, received {shown[:80]}.")

    def validate(self, num_items: Optional[int] = None) -> "TrainConfig":
        """What depends on several fields (apart from `__post_init__`, which the command
        line runs on each flag alone): ``num_heads`` divides ``embedding_dim``, and the
        largest tensor of a training step (`largest_tensor`, with the catalog when
        ``num_items`` is given) is within ``max_tensor_gib``, and a user's log
        (``interactions``) comes with its user and item columns (and the log's filters
        with a log). Returns self.

        Raises:
          ConfigError: it is not.
        """
        if self.embedding_dim % self.num_heads:
            raise ConfigError("num_heads", f"must divide embedding_dim = {self.embedding_dim}, "
                                           f"received {self.num_heads}.")
        if self.interactions is not None:
            for name in ("user_column", "item_column"):
                if not getattr(self, name):
                    raise ConfigError(name, "is needed with --interactions.")
            if self.examples:
                raise ConfigError("interactions", "and --examples both name the data; give one.")
        elif any(getattr(self, n) for n in ("user_column", "item_column", "time_column",
                                           "log_format")):
            raise ConfigError("interactions", "is needed with --user-column, --item-column, "
                                              "--time-column or --log-format.")
        else:
            changed = [n for n in LOG_FILTERS
                       if getattr(self, n) != TrainConfig.__dataclass_fields__[n].default]
            if changed:  # a built-in dataset is preprocessed as its papers do
                raise ConfigError(changed[0], "filters --interactions (your log); a built-in "
                                              "dataset or an ExampleGen artifact takes none.")
        if self.max_tensor_gib:
            what, size = largest_tensor(self, num_items)
            if size > self.max_tensor_gib * GIB:
                raise ConfigError(
                    "max_tensor_gib", f"is {self.max_tensor_gib:g} GiB and a training step "
                    f"would make {what} of {size / GIB:,.1f} GiB; lower --batch-size, "
                    f"--max-length, --embedding-dim or --num-negatives, or raise "
                    f"--max-tensor-gib if this machine holds it.")
        return self

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> "TrainConfig":
        """The `TrainConfig` of ``fields`` (a run's ``config.json`` as read, or
        `to_dict`'s): fields it leaves out take their defaults; the keys of
        `RUN_RECORD_KEYS` are skipped.

        Raises:
          ConfigError: an unknown key, a value of the wrong type or out of range.
        """
        if not isinstance(fields, Mapping):
            raise ConfigError("config", f"must be a JSON object of TrainConfig fields, "
                                        f"received {type(fields).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known - set(RUN_RECORD_KEYS))
        if unknown:
            shown = ", ".join(repr(str(k)[:40]) for k in unknown[:5])
            raise ConfigError("config", f"has unknown keys {shown}"
                                        f"{' ...' if len(unknown) > 5 else ''}; expected "
                                        f"TrainConfig fields.")
        return cls(**{k: v for k, v in fields.items() if k in known})

    @classmethod
    def from_json(cls, path: str) -> "TrainConfig":
        """The `TrainConfig` saved in the JSON file ``path`` (a run's ``config.json``).

        Raises:
          FileNotFoundError: no such file.
          ConfigError: not a JSON object, or `from_dict` refuses it; the message names
            the file.
        """
        try:
            with open(path) as f:
                fields = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError("config", f"{path} is not valid JSON ({exc}).") from None
        try:
            return cls.from_dict(fields)
        except ConfigError as exc:
            raise ConfigError(exc.field, f"in {path}: {exc.problem}") from None


_FIELD_TYPES = typing.get_type_hints(TrainConfig)


def _uniform_negatives(loss: str, num_negatives: int) -> int:
    """Per-position uniform negatives of an objective (`tfrs_logq.sasrec.objectives`'
    table): 1 for BCE, all for gBCE and uniform, half (rounded up) for MNS."""
    if loss == "bce":
        return 1
    if loss in ("gbce", "uniform"):
        return num_negatives
    if loss.startswith("mns-"):
        return num_negatives - num_negatives // 2
    return 0


def largest_tensor(config: TrainConfig, num_items: Optional[int] = None) -> tuple[str, int]:
    """The largest tensor a training step of ``config`` makes, by estimate: ``(what,
    bytes)`` at 4 bytes an entry, the largest of

    - the attention scores of a block: ``batch x heads x length x length``;
    - the sequence activations: ``batch x length x embedding``;
    - the negatives' scores: ``batch x length x negatives`` (``x catalog`` for
      full-softmax when ``num_items`` is known);
    - the gathered embeddings of per-position uniform negatives (TensorFlow's ops, off
      the native CPU kernel): ``batch x length x uniform negatives x embedding``.

    >>> largest_tensor(TrainConfig(batch_size=32, max_length=10_000, embedding_dim=16))
    ('the attention scores [32 x 1 x 10,000 x 10,000]', 12800000000)
    """
    b, n, d, h = config.batch_size, config.max_length, config.embedding_dim, config.num_heads
    k = config.num_negatives
    if config.loss == "full-softmax":
        k = num_items + 1 if num_items is not None else 0
    u = _uniform_negatives(config.loss, config.num_negatives)
    shapes = {
        f"the attention scores [{b:,} x {h:,} x {n:,} x {n:,}]": b * h * n * n,
        f"the activations [{b:,} x {n:,} x {d:,}]": b * n * d,
        f"the negatives' scores [{b:,} x {n:,} x {k:,}]": b * n * k,
        f"the uniform negatives' embeddings [{b:,} x {n:,} x {u:,} x {d:,}]": b * n * u * d,
    }
    what = max(shapes, key=shapes.__getitem__)
    return what, 4 * shapes[what]


# Each field's `tfrs-logq train` flag (its other spelling, --data_dir, is accepted too).
FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)}
