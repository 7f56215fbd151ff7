"""`TrainConfig`'s fields as flags (`TrainOptions`; its field docstrings are their help,
its checks theirs) and ``--config`` files. A flag not given is None in the namespace: it
leaves the preset's value (`resolve_config`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, ClassVar, Literal, Optional

from tyro.conf import Suppress, arg

from tfrs_logq.cli._flags import annotate, shown, values
from tfrs_logq.pipelines.datasets import DATASETS, DEFAULT_TEMPORAL_FRACTION, ML1M_FORMATS
from tfrs_logq.pipelines.log_readers import FORMATS as LOG_FORMATS
from tfrs_logq.pipelines.splits import SPLITS
from tfrs_logq.sasrec import config as _config
from tfrs_logq.sasrec.config import FLAGS, OBJECTIVES, PRESETS, TrainConfig

# Each preset's fields, as flags: shown once, in --preset's help.
_PRESETS = "; ".join(f"{name}: " + (" ".join(f"{FLAGS[k]} {v}" for k, v in fields.items())
                                    or "the defaults") for name, fields in PRESETS.items())
_FRACTION = ", ".join(f"{v} for {k}" for k, v in DEFAULT_TEMPORAL_FRACTION.items())


@dataclasses.dataclass
class TrainOptions(TrainConfig):
    """`TrainConfig` with its flags' choices, names and the defaults help shows."""

    flag_names: ClassVar[dict] = FLAGS  # `_flags._values`: None for a flag not given
    dataset: Literal[DATASETS] = TrainConfig.dataset
    split: Annotated[Literal[SPLITS], shown(
        "temporal, gsasrec with --data-format sasrec")] = TrainConfig.split
    loss: Literal[OBJECTIVES] = TrainConfig.loss
    data_dir: Annotated[Optional[str], arg(metavar="DIR"), shown(
        "$TFRS_LOGQ_DATA_DIR, else the download cache")] = None
    data_format: Annotated[Optional[Literal[ML1M_FORMATS]], shown(
        "whichever the data directory holds")] = None
    max_validation_users: Annotated[Optional[int], shown("all")] = None
    temporal_fraction: Annotated[Optional[float], shown(_FRACTION)] = None
    strategy: Literal[_config.STRATEGIES] = TrainConfig.strategy
    mixed_precision: Literal[_config.MIXED_PRECISION_POLICIES] = TrainConfig.mixed_precision
    jit_compile: Annotated[bool, arg(name="xla")] = TrainConfig.jit_compile
    preset: Annotated[Optional[Literal[tuple(PRESETS)]], shown(
        f"none, the defaults shown; {_PRESETS}")] = None
    examples: Annotated[Optional[str], arg(metavar="DIR"), shown(
        "none: the data file, in memory")] = None
    log_q: Annotated[Optional[str], arg(metavar="DIR"), shown(
        "counted from the training split")] = None
    log_format: Annotated[Optional[Literal[LOG_FORMATS]], shown(
        "each file's extension")] = None


def train_options(name: str, only=None, skip=(), **defaults: str):
    """`TrainOptions` with the flags in ``only`` (all by default) less those in ``skip``,
    and ``defaults`` as the defaults their help shows."""
    return annotate(TrainOptions, name, **{
        f.name: (Suppress,) if (only is not None and f.name not in only) or f.name in skip
        else (shown(defaults[f.name]),) for f in dataclasses.fields(TrainConfig)
        if f.name in defaults or (only is not None and f.name not in only) or f.name in skip})


def config_file(path: str, flag_name: str = "--config") -> dict:
    """The JSON object of `TrainConfig` fields (and ``preset``) in the file ``path``, as
    `TrainConfig.from_dict` checks it (keys, types, values); a run's config.json will do."""
    from tfrs_logq.sasrec.config import RUN_RECORD_KEYS, ConfigError

    where = f"{flag_name} {path}"
    try:
        with open(path) as f:
            value = json.load(f)
        TrainConfig.from_dict(value)
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from None
    except ConfigError as exc:
        raise ValueError(f"{where}: {exc.field} {exc.problem}") from None
    return {k: v for k, v in value.items() if k not in RUN_RECORD_KEYS}


def training_overrides(args) -> dict:
    """``--config``, then the `TrainConfig` flags given (to go over the preset)."""
    overrides = config_file(args.config) if getattr(args, "config", None) else {}
    overrides.update({k: v for k, v in values(args, TrainConfig).items() if v is not None})
    return overrides
