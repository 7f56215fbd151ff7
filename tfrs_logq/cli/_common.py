"""What several commands share besides the flags' machinery (`_flags`): the program's
name, the exit statuses, the flags of data loading, the default split, ``--config`` files,
a training output's config, the smoke warning and the log handler. Imports neither tyro
nor TensorFlow."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
from typing import Optional

PROG = "tfrs-logq"
USER_ERROR_EXIT = 2  # an error a user can fix: bad flags, data, files, ports, servers
# `pipeline run`'s exit status when the Evaluator did not bless the model (2 is an error).
NOT_BLESSED_EXIT = 3


def cut(text: str, limit: int = 200) -> str:
    """``text`` with each run of over ``limit`` non-blank characters cut short."""
    return re.sub(r"\S{%d,}" % (limit + 1),
                  lambda m: f"{m[0][:limit]}... ({len(m[0]):,} characters)", text)


def require_modules(*names: str) -> None:
    """A command's optional dependencies, checked before it does any work: a missing one is
    `ModuleNotFoundError` (`app` names the extra that installs it), found without importing."""
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@dataclasses.dataclass
class LoadOptions:  # how a data file is read (`train`, `data stats`, `evaluate`)
    skip_bad_lines: bool = False
    """skip malformed lines of the data file and report how many"""
    max_bad_share: Optional[float] = None
    """with --skip-bad-lines, the largest share of your log's lines (--interactions) it may
    skip; more is an error (unset: 0.01)"""
    cache: bool = True
    """read and write the preprocessed-data cache ($TFRS_LOGQ_CACHE_DIR)"""
    download: bool = True
    """download the data when no local copy exists"""


def load_options(args) -> dict:
    return {"skip_bad_lines": args.skip_bad_lines, "use_cache": args.cache,
            "download_ok": args.download}


def bad_share(args) -> dict:
    """``{"max_bad_share": ...}`` of ``--max-bad-share`` where the command has the flag
    and it is given (it needs ``--skip-bad-lines``), else nothing: `UserLogSource`'s
    default, 0.01."""
    share = getattr(args, "max_bad_share", None)
    if share is None:
        return {}
    if not getattr(args, "skip_bad_lines", False):
        raise ValueError("--max-bad-share bounds what --skip-bad-lines skips: give "
                         "--skip-bad-lines too, or leave it out.")
    return {"max_bad_share": share}


def default_split(data_format: Optional[str]) -> str:
    """The split of a run without ``--split``: gSASRec's for SASRec's ``ml-1m.txt``
    (``--data-format sasrec``), which has no timestamps; else `TrainConfig`'s (temporal)."""
    from tfrs_logq.sasrec.config import TrainConfig

    return "gsasrec" if data_format == "sasrec" else TrainConfig.split


def default_log_split(time_column: Optional[str]) -> str:
    """The split of a run on a user's log without ``--split``: temporal when the log has
    times (``--time-column``), else leave-one-out."""
    return "temporal" if time_column else "loo"


def data_record(interactions) -> dict:
    return {"source": interactions.source, "data_format": interactions.data_format,
            "rows": interactions.num_rows, "skipped_lines": interactions.skipped_lines}


def config_file(path: str, flag_name: str = "--config") -> dict:
    """The JSON object of `TrainConfig` fields (and ``preset``) in the file ``path``, as
    `TrainConfig.from_dict` checks it (keys, types, values); a run's config.json will do."""
    from tfrs_logq.sasrec.config import RUN_RECORD_KEYS, ConfigError, TrainConfig

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


def read_model_config(model_dir: str) -> dict:
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"--model-dir {model_dir} does not exist: give the directory "
                                "`tfrs-logq train --model-dir` wrote.")
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--model-dir {model_dir} holds no config.json: it is not a "
                                "training output (give the directory `tfrs-logq train "
                                "--model-dir` wrote).")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): the training output is "
                         "damaged; train again.") from None


SMOKE_WARNING = ("smoke preset: a plumbing check, not a usable model; use --preset cpu for a "
                 "useful one")


def warn_if_smoke(preset: Optional[str], prog: str = PROG) -> None:
    """One line on stderr, ``prog: warning: ...``, when a run trained with the smoke preset
    (its recall is near random)."""
    if preset == "smoke":
        print(f"{prog}: warning: {SMOKE_WARNING}", file=sys.stderr)


class _StderrHandler(logging.Handler):
    """Writes to the current ``sys.stderr`` (which tests and callers may replace)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 (logging must not raise)
            self.handleError(record)


log_handler = _StderrHandler()
