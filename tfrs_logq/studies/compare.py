"""`tfrs-logq compare`: does the corrected loss beat the standard one on *this* log?

Every loss of the plan is trained for every seed, with common random numbers (the
runs of one seed share batches, initial weights and negatives: `tfrs_logq.towers`),
for a fixed number of steps (no early stopping); the test split is scored every
``eval_every`` steps and a run's result is the mean of its last ``window``
evaluations (the fixed-length protocol that produced this project's ML-1M result).
The differences against the baseline loss are then paired by seed
(`tfrs_logq.studies.compare_report`). `run_plan` drives any model family through a
`Trainer`: the built-in two-tower and SASRec here (`run_compare`), a user's own
`tfrs.Model` in `tfrs_logq.studies.user_model` (``model="tfrs-model"``).

Output directory:

- ``plan.json``: what is compared: every setting that changes a result, the data's
  identity (file, preprocessing flags, split and its fraction, a hash of the split's
  arrays) included (a rerun with another plan is refused, naming what differs; more
  seeds or losses may be added, and a rerun naming fewer keeps those planned);
- ``curves.csv``: every evaluation of every run; ``results.csv``: a row per loss and
  seed (the window's means, the regime, seconds per step);
- ``hits/<loss>-seed<seed>.npz``: each finished run's hits per test user at its last
  evaluation (`save_hits`: the user's index, number of targets and hits at each Recall@k
  cut-off), written before the run's row of results.csv: the report's intervals over
  seeds *and* test users read them;
- ``served_index.json``: where `run_plan` is given a ``served_index`` hook, what the index
  ``tfrs-logq export --index auto`` would serve keeps of the exact top-k, for the final
  model of each loss at the first seed (`record_served`, `load_served`): the report's
  sentence on how far a served figure can move from the exact one reads it;
- ``report.md``, ``learning_curves.png``, ``paired.png``;
- ``runs/``: checkpoints of unfinished runs (a killed run goes on from its last one;
  a finished run is skipped on rerun);
- ``.lock`` (held by a comparison run in one process for its whole time), ``.tables.lock``
  (held for each write of plan.json, results.csv, curves.csv and served_index.json) and
  ``.locks/`` (a lock per run, held while it trains).

Across processes (`RunShare`, ``compare --run-index I --run-count N``, or a Kubernetes
Indexed Job's or a Slurm array's variables: `resolve_share`): run ``k`` of the plan's
ordered list (`plan_runs`: seed by seed, the losses in order) goes to index ``k mod N``;
the processes share the directory, each run trained under its own lock (a run held by
another process is left to it) and every table written under ``.tables.lock``; the process
that finds every run of the plan done writes the report.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from tfrs_logq._util.atomic import atomic_write, write_json
from tfrs_logq._util.hostinfo import available_memory_bytes, machine_description
from tfrs_logq._util.locks import ExclusiveLock, LockHeld, LockUnsupported, describe_holder
from tfrs_logq.corrections import LossNameError, parse_loss_name
from tfrs_logq.metrics import BANDS, dcg_gain
from tfrs_logq.pipelines.splits import Split, check_evaluable, duplicate_counts, target_facts
from tfrs_logq.studies._grid import (
    append_row,
    check_output_dir,
    exclusive_output_dir,
    missing,
    read_rows,
    write_rows,
)
from tfrs_logq.towers import training as towers
from tfrs_logq.towers.config import LOSSES, TwoTowerConfig
from tfrs_logq.towers.training import Examples

MAX_SEED = 2**32 - 1
"""The largest seed (NumPy's and TensorFlow's seeds are 32-bit)."""
MODELS = ("two-tower", "sasrec", "tfrs-model")
TFRS_MODEL_LOSSES = tuple(loss for loss in LOSSES if loss.startswith("inbatch-"))
"""The losses of a user's own TFRS model (`tfrs_logq.studies.user_model`): its task scores
the batch's candidates, in-batch negatives only."""


class CompareError(ValueError):
    """A plan that cannot run, or an output directory holding another plan."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `run_compare` trains: ``losses`` x ``seeds`` runs of ``config``'s model
    (``model="tfrs-model"``: a user's own model, `tfrs_logq.studies.user_model`, whose
    ``config`` is a `ModelFnConfig`)."""

    losses: tuple = ("inbatch-logq-tfrs", "inbatch-logq-official", "inbatch-corrected")
    seeds: tuple = (0, 1, 2)
    config: TwoTowerConfig = TwoTowerConfig()
    window: int = 3
    baseline: str = ""
    model: str = "two-tower"
    source: str = ""
    sasrec_preset: str = "cpu"
    """SASRec's architecture and batch (`tfrs_logq.sasrec.config.PRESETS`): the plan's
    steps, eval_every and window replace its epochs, steps per epoch and test window"""
    data: Optional[dict] = None
    """what identifies the data beyond ``source`` (the file's path, the preprocessing
    flags, the split's size): a directory's runs must share it"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "losses", tuple(dict.fromkeys(self.losses)))
        object.__setattr__(self, "seeds", tuple(dict.fromkeys(int(s) for s in self.seeds)))
        if self.model not in MODELS:
            raise CompareError(f"`model` must be one of {MODELS}, received "
                               f"{str(self.model)[:40]!r}.")
        known = {"two-tower": LOSSES, "tfrs-model": TFRS_MODEL_LOSSES}.get(self.model) \
            or _sasrec_losses()
        for loss in self.losses:  # a bare logq names two losses: say which two
            if isinstance(loss, str) and loss.endswith("-logq"):
                try:
                    parse_loss_name(loss, known)
                except LossNameError as error:
                    raise CompareError(str(error)) from None
        unknown = [loss for loss in self.losses if loss not in known]
        if unknown or len(self.losses) < 2:
            raise CompareError(f"compare needs two or more {self.model} losses of "
                               f"{', '.join(known)}; received "
                               f"{', '.join(map(str, self.losses))[:200]}.")
        if not self.seeds:
            raise CompareError("compare needs at least one seed.")
        outside = [s for s in self.seeds if not 0 <= s <= MAX_SEED]
        if outside:
            raise CompareError(f"a seed must be in [0, {MAX_SEED}] (--seeds), received "
                               f"{outside[0]}.")
        if not self.baseline:
            object.__setattr__(self, "baseline", self.losses[0])
        if self.baseline not in self.losses:
            raise CompareError(f"the baseline {self.baseline!r} is not one of the losses "
                               f"{', '.join(self.losses)}.")
        if getattr(self.config, "strategy", "default") == "multi-worker":
            raise CompareError("compare trains its runs in this process: --strategy mirrored "
                               "spreads each over this machine's devices; a cluster "
                               "(multi-worker) trains one run, with `train two-tower`.")
        evaluations = len(self.config.eval_steps)
        if not 1 <= self.window <= evaluations:
            raise CompareError(f"`window` (--window) must be in [1, {evaluations}] (the "
                               f"evaluations of {self.config.steps} steps every "
                               f"{self.config.eval_every}), "
                               f"received {self.window}.")

    def run_config(self, loss: str, seed: int) -> TwoTowerConfig:
        return dataclasses.replace(self.config, loss=loss, seed=seed)

    def fixed_fields(self) -> dict:
        """What every run of the directory must share (losses and seeds may grow)."""
        config = dataclasses.asdict(self.config)
        config.pop("loss"), config.pop("seed")
        if config.get("strategy") == "default":  # as the run id: plans made before agree
            config.pop("strategy"), config.pop("cross_replica_negatives")
        fixed = {"model": self.model, "source": self.source, "window": self.window,
                 "config": config}
        if self.model == "sasrec":
            fixed["sasrec_preset"] = self.sasrec_preset
        if self.data is not None:
            fixed["data"] = self.data
        return fixed

    def sasrec_config(self, loss: str, seed: int):
        """The SASRec run: the preset's model, ``steps / eval_every`` epochs of
        ``eval_every`` steps, no early stopping, test scored over the last ``window``."""
        from tfrs_logq.sasrec.config import resolve_config

        epochs = -(-self.config.steps // self.config.eval_every)
        return resolve_config(self.sasrec_preset, loss=loss, seed=seed,
                              steps_per_epoch=self.config.eval_every, max_epochs=epochs,
                              patience=epochs + 1, test_window=self.window)


def _sasrec_losses() -> tuple:
    from tfrs_logq.sasrec.config import OBJECTIVES

    return tuple(OBJECTIVES)


def plan_runs(plan: Plan) -> list[tuple]:
    """The plan's runs ``(loss, seed)`` in the order a comparison trains them: seed by seed,
    the losses in the plan's order (`RunShare` deals them out in this order)."""
    return [(loss, seed) for seed in plan.seeds for loss in plan.losses]


RUN_COUNT_VARIABLE = "TFRS_LOGQ_RUN_COUNT"
"""The variable giving a Kubernetes Indexed Job's count (its ``completions``: Kubernetes sets
``JOB_COMPLETION_INDEX`` alone) where ``--run-count`` is not given."""


@dataclasses.dataclass(frozen=True)
class RunShare:
    """This process's share of a comparison spread over ``count`` processes: run ``k`` of
    `plan_runs` goes to index ``k % count``.

    Attributes:
      index: int. This process's index, in ``[0, count)``.
      count: int. The processes (at least 1).
      source: str. Where index and count came from (said on stderr).
    """

    index: int
    count: int
    source: str = "--run-index and --run-count"

    def __post_init__(self) -> None:
        for name in ("index", "count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise CompareError(f"the run {name} must be an integer, received "
                                   f"{str(value)[:40]!r} ({self.source}).")
        if self.count < 1:
            raise CompareError(f"the run count must be at least 1, received {self.count} "
                               f"({self.source}).")
        if not 0 <= self.index < self.count:
            raise CompareError(f"the run index must be in [0, {self.count - 1}] for a count "
                               f"of {self.count}, received {self.index} ({self.source}).")

    def runs(self, plan: Plan) -> list[tuple]:
        """This share's runs ``(loss, seed)``, in the plan's order."""
        return [run for k, run in enumerate(plan_runs(plan)) if k % self.count == self.index]

    def describe(self) -> str:
        return (f"compare: run index {self.index} of {self.count} ({self.source}): run k of "
                f"the plan's list goes to index k mod {self.count}")


def _integer(text, what: str) -> int:
    """``text`` (a flag's or a variable's value) as an integer, else CompareError naming
    ``what``."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if not isinstance(text, str) or not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):
        shown = text if isinstance(text, str) else repr(text)
        raise CompareError(f"{what} must be an integer, received {shown[:40]!r}.")
    return int(text)


def resolve_share(run_index=None, run_count=None,
                  environ: Optional[Mapping[str, str]] = None) -> Optional[RunShare]:
    """This process's `RunShare`, or None (the whole plan, one process).

    ``run_index`` and ``run_count`` (``--run-index``, ``--run-count``: text or integers)
    win over the variables; without ``run_index``, the index is a scheduler's:
    ``JOB_COMPLETION_INDEX`` (a Kubernetes Indexed Job; its count ``run_count``, else
    ``TFRS_LOGQ_RUN_COUNT``), else ``SLURM_ARRAY_TASK_ID`` (a Slurm array: the index
    ``(ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP``, the count ``run_count``, else
    ``SLURM_ARRAY_TASK_COUNT``, else ``(MAX - MIN) / STEP + 1``). ``environ``: the
    variables (``os.environ`` when None).

    Raises:
      CompareError: an index without a count (or a count without an index), a value that
        is not an integer, a count below 1, an index out of range, a Slurm array whose ids
        are not a range, each in one line naming the flag or variable.
    """
    env = os.environ if environ is None else environ
    if run_index is not None:
        if run_count is None:
            raise CompareError("--run-index needs --run-count (the number of processes "
                               "sharing the comparison).")
        return RunShare(_integer(run_index, "--run-index"), _integer(run_count, "--run-count"))
    count_flag = None if run_count is None else _integer(run_count, "--run-count")
    if "JOB_COMPLETION_INDEX" in env:
        index = _integer(env["JOB_COMPLETION_INDEX"], "JOB_COMPLETION_INDEX")
        if count_flag is not None:
            return RunShare(index, count_flag, f"JOB_COMPLETION_INDEX={index}, --run-count")
        if RUN_COUNT_VARIABLE not in env:
            raise CompareError(f"JOB_COMPLETION_INDEX={index} (a Kubernetes Indexed Job) "
                               f"needs a count: set {RUN_COUNT_VARIABLE} to the Job's "
                               f"completions, or pass --run-count.")
        count = _integer(env[RUN_COUNT_VARIABLE], RUN_COUNT_VARIABLE)
        return RunShare(index, count, f"JOB_COMPLETION_INDEX={index}, "
                                      f"{RUN_COUNT_VARIABLE}={count}")
    if "SLURM_ARRAY_TASK_ID" in env:
        return _slurm_share(env, count_flag)
    if count_flag is not None:
        raise CompareError("--run-count needs --run-index (or a scheduler's index: "
                           "JOB_COMPLETION_INDEX, SLURM_ARRAY_TASK_ID).")
    return None


def _slurm_share(env: Mapping[str, str], count_flag: Optional[int]) -> RunShare:
    task = _integer(env["SLURM_ARRAY_TASK_ID"], "SLURM_ARRAY_TASK_ID")
    low = _integer(env.get("SLURM_ARRAY_TASK_MIN", "0"), "SLURM_ARRAY_TASK_MIN")
    step = _integer(env.get("SLURM_ARRAY_TASK_STEP", "1"), "SLURM_ARRAY_TASK_STEP")
    if step < 1:
        raise CompareError(f"SLURM_ARRAY_TASK_STEP must be at least 1, received {step}.")
    high = (_integer(env["SLURM_ARRAY_TASK_MAX"], "SLURM_ARRAY_TASK_MAX")
            if "SLURM_ARRAY_TASK_MAX" in env else None)
    ranged = None if high is None else (high - low) // step + 1
    if high is not None and (high < low or (high - low) % step):
        raise CompareError(f"SLURM_ARRAY_TASK_MIN={low}, SLURM_ARRAY_TASK_MAX={high} and "
                           f"SLURM_ARRAY_TASK_STEP={step} are not a range of array ids.")
    if task < low or (task - low) % step or (high is not None and task > high):
        raise CompareError(f"SLURM_ARRAY_TASK_ID={task} is not an id of the array "
                           f"{low}-{high if high is not None else '?'}:{step}.")
    index = (task - low) // step
    shown = f"SLURM_ARRAY_TASK_ID={task}, SLURM_ARRAY_TASK_MIN={low}"
    if count_flag is not None:
        return RunShare(index, count_flag, f"{shown}, --run-count")
    if "SLURM_ARRAY_TASK_COUNT" in env:
        count = _integer(env["SLURM_ARRAY_TASK_COUNT"], "SLURM_ARRAY_TASK_COUNT")
        if ranged is not None and count != ranged:
            raise CompareError(f"SLURM_ARRAY_TASK_COUNT={count} tasks are not the ids "
                               f"{low}-{high}:{step} (an array given as a list, such as "
                               f"--array=1,3,7): give --array a range (0-{count - 1}), or "
                               f"pass --run-index and --run-count.")
        return RunShare(index, count, f"{shown}, SLURM_ARRAY_TASK_COUNT={count}")
    if ranged is None:
        raise CompareError(f"SLURM_ARRAY_TASK_ID={task} needs a count: "
                           f"SLURM_ARRAY_TASK_COUNT or SLURM_ARRAY_TASK_MAX, or --run-count.")
    return RunShare(index, ranged, f"{shown}, SLURM_ARRAY_TASK_MAX={high}")


_SHARE: contextvars.ContextVar = contextvars.ContextVar("compare_share", default=None)


@contextlib.contextmanager
def spread(share: Optional[RunShare]) -> Iterator[None]:
    """`run_plan` calls in the block that are given no ``share`` train ``share``'s runs
    (for a caller that reaches `run_plan` through another function, such as
    `tfrs_logq.studies.user_model.compare_split`)."""
    token = _SHARE.set(share)
    try:
        yield
    finally:
        _SHARE.reset(token)


def metric_names(rows: Sequence[dict]) -> list[str]:
    """The recall/NDCG columns present, in the order k then kind."""
    names = {k for row in rows for k in row if k.startswith(("recall@", "ndcg@"))}
    return sorted(names, key=lambda n: (int(n.split("@")[1]), n))


def band_names(rows: Sequence[dict]) -> list[str]:
    """The by-popularity columns present (``head:recall@10``, ``tail:share``, ...)."""
    return sorted({k for row in rows for k in row if ":" in k
                   and k.split(":", 1)[0] in ("head", "torso", "tail")})


def split_fingerprint(split: Split) -> str:
    """A hash of the split's arrays (the interactions, their ids, times and weights, each
    user's sequence, the training lengths, the validation and test parts): the same
    sizes with other content give another fingerprint."""
    digest = hashlib.sha256()

    def add(name: str, array) -> None:
        digest.update(name.encode())
        if array is None:
            digest.update(b"none")
            return
        array = np.asarray(array)
        if array.dtype == object:
            digest.update(json.dumps([str(v) for v in array.ravel()]).encode())
        else:
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())

    inter = split.interactions
    for name in ("user", "item", "timestamp", "weight", "raw_users", "raw_items"):
        add(name, getattr(inter, name, None))
    lengths = [len(s) for s in split.sequences]
    add("sequence_lengths", np.asarray(lengths, np.int64))
    add("sequences", np.concatenate([np.asarray(s, np.int64) for s in split.sequences])
        if split.sequences else np.zeros(0, np.int64))
    add("train_lengths", split.train_lengths)
    for part_name in ("validation", "test"):
        part = getattr(split, part_name)
        for field in ("users", "history_lengths", "targets"):
            add(f"{part_name}.{field}", getattr(part, field))
    return digest.hexdigest()[:32]


def _plan_error(path: str, what: str) -> CompareError:
    return CompareError(f"{path} is not a plan `tfrs-logq compare` wrote ({what}): restore "
                        f"it from the run that made the directory, or use another "
                        f"--output-dir.")


def read_plan_json(output_dir: str) -> Optional[dict]:
    """``output_dir``'s ``plan.json`` (None when there is none), checked: an edited file
    is refused in one line naming it and what is wrong."""
    path = os.path.join(output_dir, "plan.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError) as error:
        raise _plan_error(path, f"unreadable: {str(error)[:80]}") from None
    except json.JSONDecodeError as error:
        raise _plan_error(path, f"invalid JSON at line {error.lineno}") from None
    if not isinstance(saved, dict):
        raise _plan_error(path, f"a JSON {type(saved).__name__}, not an object")
    fixed = saved.get("fixed")
    if not isinstance(fixed, dict):
        raise _plan_error(path, "no `fixed` object")
    checks = (
        (isinstance(fixed.get("model"), str) and fixed.get("model") in MODELS,
         f"`fixed.model` must be one of {', '.join(MODELS)}"),
        (isinstance(fixed.get("window"), int) and not isinstance(fixed.get("window"), bool)
         and fixed["window"] >= 1, "`fixed.window` must be an integer >= 1"),
        (isinstance(fixed.get("config"), dict), "`fixed.config` must be an object"),
        (isinstance(fixed.get("source", ""), str), "`fixed.source` must be text"),
        (fixed.get("data") is None or isinstance(fixed.get("data"), dict),
         "`fixed.data` must be an object"),
        (isinstance(saved.get("losses"), list) and len(saved["losses"]) >= 2
         and all(isinstance(x, str) for x in saved["losses"]),
         "`losses` must list two or more loss names"),
        (isinstance(saved.get("seeds"), list) and saved["seeds"]
         and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_SEED
                 for x in saved["seeds"]),
         f"`seeds` must list one or more integers in [0, {MAX_SEED}]"),
        (isinstance(saved.get("baseline", ""), str), "`baseline` must be a loss name"),
    )
    for ok, what in checks:
        if not ok:
            raise _plan_error(path, what)
    return saved


def load_plan(output_dir: str) -> Plan:
    """The plan a comparison directory was run with (its ``plan.json``), to rebuild its
    report (``tfrs-logq compare --report-only``)."""
    saved = read_plan_json(output_dir)
    if saved is None:
        raise CompareError(f"{output_dir} holds no plan.json: it is not the output of "
                           f"`tfrs-logq compare` (give the --output-dir of a comparison).")
    return _plan_of(saved, os.path.join(output_dir, "plan.json"))


def _plan_of(saved: dict, path: str) -> Plan:
    fixed = saved["fixed"]
    config_class = TwoTowerConfig
    if fixed["model"] == "tfrs-model":
        from tfrs_logq.studies.user_model import ModelFnConfig as config_class
    known = {f.name for f in dataclasses.fields(config_class)}
    losses = tuple(saved["losses"])
    try:
        config = config_class(**{k: v for k, v in fixed["config"].items() if k in known})
        if fixed["model"] != "sasrec":  # a loss of the plan sets the config's (checked) loss
            config = dataclasses.replace(config, loss=losses[0])
        return Plan(losses=losses, seeds=tuple(saved["seeds"]), config=config,
                    window=fixed["window"], baseline=saved.get("baseline", ""),
                    model=fixed["model"], source=fixed.get("source", ""),
                    sasrec_preset=fixed.get("sasrec_preset", "cpu"), data=fixed.get("data"))
    except (ValueError, TypeError, KeyError) as error:
        raise _plan_error(path, str(error).rstrip(".")[:160]) from None


def report_only(output_dir: str, say: Callable[[str], None] = print,
                margin=None, primary: Optional[tuple] = None) -> str:
    """Rebuilds ``report.md`` and the charts from ``output_dir``'s ``results.csv`` and
    ``curves.csv`` (no training), under the lock of the directory's tables (a comparison
    spread over processes may be writing them). Where runs of the plan have no row yet,
    the report is provisional (it says so first) and ``say`` names them, ``(loss,
    seed)``."""
    from tfrs_logq.studies.compare_report import check_results, write_report

    plan = load_plan(output_dir)
    path = os.path.join(output_dir, "results.csv")
    with _tables(output_dir):
        plan = load_plan(output_dir)  # as it is now that no process writes it
        rows = read_rows(path)
        check_results(rows, path)
        if not rows:
            raise CompareError(f"{output_dir}/results.csv holds no finished run: nothing to "
                               f"report.")
        left = missing_runs(plan, rows)
        if left:
            say(f"compare: partial report: {len(left)} of the plan's {len(plan_runs(plan))} "
                f"runs have no row in results.csv yet: "
                + ", ".join(f"({loss}, {seed})" for loss, seed in left[:20])
                + (f" and {len(left) - 20} more" if len(left) > 20 else "")
                + "; the report is provisional until they finish")
        return write_report(plan, rows, read_rows(os.path.join(output_dir, "curves.csv")),
                            output_dir, say=say, margin=margin, **_primary(primary))


def _primary(primary: Optional[tuple]) -> dict:
    """``(metric, baseline)`` (either None: the report's default) as `write_report`'s
    keyword arguments."""
    metric, baseline = primary or (None, None)
    return {"primary_metric": metric, "primary_baseline": baseline}


def _differences(old, new, prefix: str = "") -> list[str]:
    """The keys (dotted) whose values differ between two plans' fixed fields."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            out += _differences(old.get(key, "(none)"), new.get(key, "(none)"),
                                f"{prefix}{key}.")
        return out
    if old == new:
        return []
    def shown(value):
        text = json.dumps(value) if not isinstance(value, str) else value
        return text if len(text) <= 40 else text[:37] + "..."
    return [f"{prefix.rstrip('.')} {shown(old)} there, {shown(new)} now"]


def _check_plan(plan: Plan, output_dir: str, write: bool = True) -> Plan:
    """Refuses a directory of another plan (every fixed field, the data's included, must
    match); returns the plan with the seeds and losses of the directory's plan added (a
    rerun adds seeds or losses, never drops those already planned), written to
    ``plan.json`` when ``write``."""
    path = os.path.join(output_dir, "plan.json")
    saved = read_plan_json(output_dir)
    if saved is not None:
        fixed = json.loads(json.dumps(plan.fixed_fields()))
        old = saved["fixed"]
        if "data" not in old:  # written before plans held the data
            fixed.pop("data", None)
        if old.get("model") != fixed["model"]:  # the model first: its settings differ anyway
            raise CompareError(
                f"{output_dir} holds a {old.get('model')} comparison, not {fixed['model']}: "
                f"rerun it with `compare {old.get('model')}` and its settings, or use another "
                f"--output-dir.")
        diffs = _differences(old, fixed)
        if diffs:
            raise CompareError(
                f"{output_dir} holds a comparison with another plan ({'; '.join(diffs[:3])}"
                f"{f'; {len(diffs) - 3} more' if len(diffs) > 3 else ''}): rerun with its "
                f"settings and data, or use another --output-dir.")
        try:
            plan = dataclasses.replace(
                plan, losses=tuple(dict.fromkeys([*saved["losses"], *plan.losses])),
                seeds=tuple(dict.fromkeys([*saved["seeds"], *plan.seeds])))
        except CompareError as error:
            raise _plan_error(path, str(error).rstrip(".")[:160]) from None
    if write:
        write_json(path, {"fixed": plan.fixed_fields(), "losses": list(plan.losses),
                          "seeds": list(plan.seeds), "baseline": plan.baseline})
    return plan


OUTPUT_FILES = ("results.csv", "curves.csv", "report.md", "runs", "hits", "served_index.json")


def check_output_dir_contents(plan: Plan, output_dir: str) -> Plan:
    """Reads, writing nothing, what ``output_dir`` holds: refuses a folder with a
    comparison's files but no plan.json (another tool's), another plan, a damaged
    plan.json or results.csv; returns the plan `_check_plan` will write."""
    if not os.path.isdir(output_dir):
        return plan
    if not os.path.exists(os.path.join(output_dir, "plan.json")):
        found = [n for n in OUTPUT_FILES if os.path.exists(os.path.join(output_dir, n))]
        if found:
            raise CompareError(f"{output_dir} holds {found[0]} but no plan.json: it is not a "
                               f"directory `tfrs-logq compare` wrote; give a new or empty "
                               f"--output-dir.")
        return plan
    plan = _check_plan(plan, output_dir, write=False)
    results = os.path.join(output_dir, "results.csv")
    if os.path.exists(results):
        from tfrs_logq.studies.compare_report import check_results

        check_results(read_rows(results), results)
    return plan


def _run_dir(output_dir: str, key: str) -> str:
    return os.path.join(output_dir, "runs", hashlib.sha256(key.encode()).hexdigest()[:16])


HITS_DIR = "hits"
FINAL_RANKS = "_final_ranks"
"""The key of a `Trainer`'s row holding the 0-based rank of every test target at the run's
last evaluation (in the order of `Trainer.test_users`); `run_plan` saves it as the run's
hits (`save_hits`) and leaves it out of results.csv."""
FINAL_EMBEDDINGS = "_final_embeddings"
"""The key of a `Trainer`'s row holding ``(item_embeddings [n, d], query_embeddings [m,
d])``: the vectors the run's last evaluation ranked (every candidate, no padding row; a
query per test target, in the order of `FINAL_RANKS`); `run_plan` hands them to its
``served_index`` hook and leaves them out of results.csv."""


def hits_path(output_dir: str, loss: str, seed: int) -> str:
    """Where a run's hits per test user are (`save_hits`)."""
    return os.path.join(output_dir, HITS_DIR, f"{loss}-seed{int(seed)}.npz")


def save_hits(path: str, users, ranks, ks: Sequence[int]) -> None:
    """Writes, atomically, a run's hits per test user at one evaluation: ``users`` (the
    sorted distinct test users' indices), ``targets`` (each user's test targets) and
    ``hits@k`` (of them, those ranked in the top ``k``) and ``gain@k`` (their DCG gains'
    sum) for each ``k`` of ``ks``, from ``users`` (the test user of each target) and
    ``ranks`` (each target's 0-based rank). Recall@k is ``sum(hits@k) / sum(targets)``,
    NDCG@k ``sum(gain@k) / sum(targets)``."""
    users, ranks = np.asarray(users, np.int64), np.asarray(ranks, np.int64)
    if users.shape != ranks.shape:
        raise ValueError(f"`users` and `ranks` must be paired, received shapes "
                         f"{users.shape} and {ranks.shape}.")
    distinct, where = np.unique(users, return_inverse=True)
    arrays = {"users": distinct,
              "targets": np.bincount(where, minlength=len(distinct)).astype(np.int32)}
    gains = dcg_gain(ranks)
    for k in ks:
        hit = ranks < int(k)
        arrays[f"hits@{int(k)}"] = np.bincount(where, weights=hit,
                                               minlength=len(distinct)).astype(np.int32)
        arrays[f"gain@{int(k)}"] = np.bincount(where, weights=np.where(hit, gains, 0.0),
                                               minlength=len(distinct))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_write(path, "wb") as f:
        np.savez_compressed(f, **arrays)


def load_hits(path: str) -> Optional[dict]:
    """A run's hits (`save_hits`) as ``{"users", "targets", "hits@k"...}`` arrays, or None
    when the run has none (finished before hits were saved).

    Raises:
      CompareError: a file that is not a hits file, naming it.
    """
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            out = {name: np.asarray(data[name]) for name in data.files}
    except (OSError, ValueError, EOFError) as error:
        raise CompareError(f"{path} is not a hits file compare wrote "
                           f"({' '.join(str(error).split())[:80]}): delete it (the report "
                           f"then uses the seeds alone for that run).") from None
    lengths = {len(v) for v in out.values() if v.ndim == 1}
    if "users" not in out or "targets" not in out or len(lengths) != 1:
        raise CompareError(f"{path} is not a hits file compare wrote (no users, targets "
                           f"or arrays of one length): delete it (the report then uses the "
                           f"seeds alone for that run).")
    return out


def window_row(plan: Plan, loss: str, seed: int, evaluations: list[dict], last: dict) -> dict:
    """The result of one run: the mean of its last ``plan.window`` evaluations' metrics,
    the regime and timing of its last one."""
    scored = sorted(evaluations, key=lambda r: int(r["steps"]))[-plan.window:]
    row = {"loss": loss, "seed": seed, "steps": plan.config.steps, "window": len(scored),
           "window_steps": " ".join(str(int(r["steps"])) for r in scored)}
    for name in metric_names(scored) + band_names(scored):
        values = [float(r[name]) for r in scored if r.get(name) not in (None, "")]
        # NaN stays NaN (a diverged run, or a band with no target): never a mean of the rest.
        row[name] = float(np.mean(values)) if values else float("nan")
    for key in ("positive_share_q10", "positive_share_q50", "positive_share_q90",
                "model_p_q50", "seconds_per_step", "resumed_from_step", "num_targets",
                "num_users", "repeat_share", "sent_repeat_share", "cold_share", "diverged"):
        if key in last and last[key] not in ("", None):
            row[key] = last[key]
    row["machine"] = machine_description()
    return row


def id_storage_bytes(split: Split) -> int:
    """The bytes the log's ids take as a run holds them: every distinct user and item id at
    its stored width (`tfrs_logq.pipelines.user_log` keeps text ids as NumPy text of the
    longest id's width, 4 bytes a character; integer ids as int64; Python objects at their
    own size and a pointer)."""
    total = 0
    for ids in (split.interactions.raw_users, split.interactions.raw_items):
        ids = np.asarray(ids)
        if ids.dtype == object:
            total += sum(sys.getsizeof(v) for v in ids.ravel()) + ids.nbytes
        else:
            total += ids.nbytes
    return int(total)


def _id_words(split: Split) -> str:
    parts = []
    for name, ids in (("user", split.interactions.raw_users),
                      ("item", split.interactions.raw_items)):
        ids = np.asarray(ids)
        width = (f"{ids.dtype.itemsize // 4:,} characters" if ids.dtype.kind == "U"
                 else f"{ids.dtype.itemsize} bytes" if ids.dtype != object else "objects")
        parts.append(f"{len(ids):,} {name} ids of {width}")
    return ", ".join(parts)


def _duplicates(split: Split) -> dict:
    """The log's duplicate rows and repeated (user, item) pairs after preprocessing, for
    the report's run facts."""
    counts = duplicate_counts(split.interactions)
    return {"duplicate_rows": counts["rows"], "repeated_pairs": counts["pairs"]}


def run_compare(plan: Plan, split: Split, output_dir: str, say: Callable[[str], None] = print,
                max_runs: Optional[int] = None, margin=None,
                primary: Optional[tuple] = None,
                served_index: Optional[ServedIndex] = None,
                share: Optional[RunShare] = None) -> list[dict]:
    """Trains the plan's unfinished runs into ``output_dir`` (seed by seed, so that an
    interrupted comparison holds whole pairs), then writes the report. Returns the rows
    of results.csv. One process per directory (`RunLock`), unless ``share``: this
    process's `RunShare` of a comparison spread over processes (`run_plan`).
    ``served_index``: `run_plan`'s hook (None: the served index is not measured)."""
    if plan.model == "sasrec" and split.interactions.weight is not None:
        raise CompareError("a weight column weights the loss of compare two-tower only; "
                           "SASRec trains unweighted: leave out --weight-column.")
    # Checked and built (weights too) before the output directory is touched.
    check_evaluable(split, split.test)
    sent = (plan.config.history_length if plan.model == "two-tower"
            else plan.sasrec_config(plan.losses[0], plan.seeds[0]).max_length)
    if plan.config.exclude_seen and target_facts(split, split.test, sent)[
            "sent_repeat_share"] == 1.0:
        raise CompareError("every test target is among the items its request sends, which "
                           "the served top_k leaves out: every model scores 0; compare with "
                           "--no-exclude-seen (and serve with exclude_history false).")
    if plan.model == "two-tower":
        examples = Examples(split, plan.config.history_length)
        try:
            towers.check_trainable(plan.config, split, examples)
        except ValueError as exc:
            raise CompareError(str(exc)) from None
        need = towers.estimated_peak_bytes(plan.config, split.num_items, len(examples),
                                           len(split.test))
        lower = "--batch-size (a step's scores grow with its square), --num-negatives or " \
                "--embedding-dim"
    else:
        from tfrs_logq.sasrec.training import estimated_peak_bytes

        examples = None
        need = max(estimated_peak_bytes(plan.sasrec_config(loss, plan.seeds[0]),
                                        split.num_items) for loss in plan.losses)
        lower = "--preset (its batch, history length and negatives)"
    ids = id_storage_bytes(split)
    need += ids
    have = available_memory_bytes()
    held = (f", {ids / 2**30:.1f} GiB of it the ids as held ({_id_words(split)})"
            if ids >= 2**26 else "")
    if need > have:
        if ids > need / 2:  # the ids dominate: shorter ids are the fix
            lower = ("the ids' width: map long text ids to integers or short codes before "
                     "compare (a text id is held at the longest id's width, 4 bytes a "
                     "character)")
        raise CompareError(f"a run needs about {need / 2**30:.1f} GiB at its peak{held} and "
                           f"this machine has {have / 2**30:.1f} GiB available: lower "
                           f"{lower}.")
    say(f"compare: estimated peak memory of a run {need / 2**30:.1f} GiB{held} "
        f"({have / 2**30:.1f} GiB available)")
    if plan.model == "sasrec":
        trainer = Trainer(
            catalog=f"compare: {split.num_items:,} items, {len(split.test):,} test targets",
            key=lambda loss, seed: repr(plan.sasrec_config(loss, seed)),
            train=lambda loss, seed, run_dir, on_eval, on_step, evaluations: _sasrec_row(
                plan, loss, seed, split, run_dir, on_eval, evaluations),
            test_users=np.asarray(split.test.users, np.int64))
    else:
        trainer = _two_tower_trainer(plan, split, examples)
    return run_plan(plan, output_dir, trainer, say=say, max_runs=max_runs, margin=margin,
                    primary=primary, served_index=served_index, share=share)


@dataclasses.dataclass(frozen=True)
class Trainer:
    """How `run_plan` trains one run of a plan's model family.

    Attributes:
      catalog: str. The line said before the first run is trained (the data's sizes).
      key: ``(loss, seed) -> str``. What identifies a run: its checkpoint directory under
        ``runs/`` is named after it.
      train: ``(loss, seed, run_dir, on_eval, on_step, evaluations) -> dict``. Trains the
        run (resuming from ``run_dir``'s checkpoint) and returns its results row.
        ``on_eval(row)`` takes each evaluation ``{"steps", metrics...}`` as it is made, but
        those already in ``evaluations`` (the run's rows of curves.csv, made before a kill;
        ``on_eval`` appends to it); ``on_step(i)`` is called after step ``i`` (0-based).
        The row may hold `FINAL_RANKS`: the rank of every test target at the last
        evaluation, saved as the run's hits (`save_hits`) before the row is written.
      test_users: ``[targets]`` the index of each test target's user (the order of
        `FINAL_RANKS`); None: no hits are saved.
    """

    catalog: str
    key: Callable[[str, int], str]
    train: Callable[..., dict]
    test_users: Optional[np.ndarray] = None


def final_evaluation(query_fn, item_embeddings, arrays: dict, row: dict) -> None:
    """Ranks the test targets as `tfrs_logq.pipelines.sequential.evaluate` does and puts
    in ``row`` their ranks (`FINAL_RANKS`) and the vectors ranked (`FINAL_EMBEDDINGS`:
    the candidates', padding row 0 left out, and the queries')"""
    from tfrs_logq.pipelines.sequential import evaluate

    queries: list = []

    def recorded(history):
        out = query_fn(history)
        queries.append(np.asarray(out, np.float32))
        return out

    ranks: list = []
    evaluate(recorded, item_embeddings, arrays, ks=(), per_target=ranks)
    row[FINAL_RANKS] = np.asarray(ranks, np.int64)
    row[FINAL_EMBEDDINGS] = (np.asarray(item_embeddings, np.float32)[1:],
                             np.concatenate(queries) if queries else np.zeros((0, 0)))


def _two_tower_trainer(plan: Plan, split: Split, examples: Examples) -> Trainer:
    from tfrs_logq.pipelines.sequential import evaluation_arrays

    arrays = evaluation_arrays(split, split.test, plan.config.history_length,
                               plan.config.exclude_seen)

    def train(loss, seed, run_dir, on_eval, on_step, evaluations) -> dict:
        final: dict = {}

        def final_ranks(model) -> None:  # the trained model, as its last evaluation ranks
            final_evaluation(model.query_tower, model.item_tower.embeddings, arrays, final)

        last = towers.train(plan.run_config(loss, seed), split, checkpoint_dir=run_dir,
                            on_eval=on_eval, done=tuple(int(r["steps"]) for r in evaluations),
                            on_step=on_step, examples=examples, on_trained=final_ranks)
        return {**window_row(plan, loss, seed, evaluations, last), **_duplicates(split),
                **final}

    return Trainer(catalog=f"compare: {split.num_items:,} items, {len(split.test):,} test "
                           f"targets, {len(examples):,} training examples",
                   key=lambda loss, seed: plan.run_config(loss, seed).run_id, train=train,
                   test_users=np.asarray(split.test.users, np.int64))


def run_plan(plan: Plan, output_dir: str, trainer: Trainer,
             say: Callable[[str], None] = print, max_runs: Optional[int] = None,
             margin=None, primary: Optional[tuple] = None,
             served_index: Optional[ServedIndex] = None,
             share: Optional[RunShare] = None) -> list[dict]:
    """Trains the plan's unfinished runs with ``trainer`` into ``output_dir`` (seed by
    seed, so that an interrupted comparison holds whole pairs), then writes the report;
    returns the rows of results.csv. Without a ``share``, holds the directory's lock (one
    such process per directory); refuses a directory of another plan (``plan.json``).
    `run_compare` runs the built-in models through it, `tfrs_logq.studies.user_model` a
    user's own.

    ``served_index``: ``served_index(item_embeddings, query_embeddings, ks) -> record``,
    called after each run of the first seed that the trainer gives its vectors
    (`FINAL_EMBEDDINGS`: the candidates' ``[n, d]`` and the test queries' ``[m, d]``
    that its last evaluation ranked exactly) with the run's Recall@k cut-offs; the
    record (``kind``, ``parameters``, ``recall`` by k against exact top-k, ...:
    `tfrs_logq.serving.served_recall.served_recall` measures the index ``tfrs-logq export
    --index auto`` builds) goes to ``served_index.json`` (`record_served`) and the report
    says in one sentence how far a served figure can move. None: nothing is measured.

    ``share`` (None: the one `spread` set, if any): this process trains the runs of its
    `RunShare` alone, the directory shared with the other processes of the comparison
    (no directory lock: a lock per run, and one for each table's write); results.csv keeps
    the plan's order; the report is written where every run of the plan is done and
    report.md is missing or older than results.csv, else the runs left are said."""
    share = share if share is not None else _SHARE.get()
    check_output_dir(output_dir)
    plan = check_output_dir_contents(plan, output_dir)  # before anything is written
    if share is not None:
        return _run_share(plan, output_dir, trainer, say, max_runs, margin, primary,
                          served_index, share)
    with exclusive_output_dir(output_dir):
        with _tables(output_dir):
            plan = _check_plan(plan, output_dir)
        _run_all(plan, output_dir, trainer, say, max_runs, served_index)
        rows = read_rows(os.path.join(output_dir, "results.csv"))
        if rows:
            from tfrs_logq.studies.compare_report import write_report

            write_report(plan, rows, read_rows(os.path.join(output_dir, "curves.csv")),
                         output_dir, say=say, margin=margin, **_primary(primary))
    return rows


def _run_share(plan: Plan, output_dir: str, trainer: Trainer, say, max_runs, margin,
               primary, served_index, share: RunShare) -> list[dict]:
    os.makedirs(output_dir, exist_ok=True)
    with _tables(output_dir):
        plan = _check_plan(plan, output_dir)
    _run_all(plan, output_dir, trainer, say, max_runs, served_index, share)
    results = os.path.join(output_dir, "results.csv")
    with _tables(output_dir):  # what is left now, the other processes' runs counted
        plan = _check_plan(plan, output_dir, write=False)
        rows = read_rows(results)
        left = missing_runs(plan, rows)
        if left:
            total = len(plan_runs(plan))
            say(f"compare: index {share.index}'s runs are done or held elsewhere; {len(left)} "
                f"of the plan's {total} runs remain: "
                + ", ".join(f"{loss} seed {seed}" for loss, seed in left[:10])
                + (f" and {len(left) - 10} more" if len(left) > 10 else "")
                + " (the process that finishes the last writes report.md; `tfrs-logq "
                  f"compare --report-only --output-dir {output_dir}` reports those done)")
            return rows
        report = os.path.join(output_dir, "report.md")
        if os.path.exists(report) and os.stat(report).st_mtime_ns >= os.stat(
                results).st_mtime_ns:
            say(f"compare: every run of the plan is done and {report} is up to date "
                f"(`tfrs-logq compare --report-only` rebuilds it)")
            return rows
        from tfrs_logq.studies.compare_report import write_report

        say("compare: every run of the plan is done: writing the report")
        write_report(plan, rows, read_rows(os.path.join(output_dir, "curves.csv")),
                     output_dir, say=say, margin=margin, **_primary(primary))
    return rows


def missing_runs(plan: Plan, rows: Sequence[dict]) -> list[tuple]:
    """The plan's runs ``(loss, seed)`` without a row in ``rows`` (results.csv's), in the
    plan's order."""
    done = {(r["loss"], int(r["seed"])) for r in rows}
    return [run for run in plan_runs(plan) if run not in done]


TABLES_LOCK = ".tables.lock"
RUN_LOCKS = ".locks"
log = logging.getLogger(__name__)


@contextlib.contextmanager
def _tables(output_dir: str) -> Iterator[None]:
    """Holds ``output_dir``'s ``.tables.lock`` (waiting for it) for a read and write of
    its tables: two processes sharing the directory never lose each other's rows. A
    filesystem that cannot lock: a warning, and the block runs."""
    lock = ExclusiveLock(os.path.join(output_dir, TABLES_LOCK), wait=True)
    try:
        lock.acquire()
    except LockUnsupported as error:
        log.warning("cannot lock %s (%s): this filesystem has no flock, so processes "
                    "sharing the directory may overwrite each other's rows",
                    lock.path, error.strerror)
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _claim(output_dir: str, key: str):
    """The lock of the run ``key`` (``.locks/`` in ``output_dir``, never removed), taken,
    or `LockHeld` (another process trains it); None where the filesystem cannot lock."""
    os.makedirs(os.path.join(output_dir, RUN_LOCKS), exist_ok=True)
    name = os.path.basename(_run_dir(output_dir, key))
    lock = ExclusiveLock(os.path.join(output_dir, RUN_LOCKS, name + ".lock"), wait=False)
    try:
        return lock.acquire()
    except LockUnsupported:
        return None
    except LockHeld as held:
        return held


def _append_result(path: str, row: dict, plan: Plan, in_plan_order: bool) -> None:
    """Appends ``row`` to results.csv (atomically), in the plan's order where
    ``in_plan_order`` (a comparison spread over processes finishes runs in any order)."""
    rows = read_rows(path) + [row]
    if in_plan_order:
        order = {run: k for k, run in enumerate(plan_runs(plan))}
        rows.sort(key=lambda r: order.get((r["loss"], int(r["seed"])), len(order)))
    write_rows(path, rows)


def _run_all(plan: Plan, output_dir: str, trainer: Trainer, say, max_runs,
             served_index: Optional[ServedIndex] = None,
             share: Optional[RunShare] = None) -> None:
    results_path = os.path.join(output_dir, "results.csv")

    def done() -> set:
        return {(r["loss"], int(r["seed"])) for r in read_rows(results_path)}

    runs = plan_runs(plan) if share is None else share.runs(plan)
    todo = missing(runs, done(), lambda loss_seed: [loss_seed])
    total = len(plan.losses) * len(plan.seeds)
    mine = "" if share is None else f"index {share.index} of {share.count}: {len(runs)} of "
    partly = sum(os.path.isdir(_run_dir(output_dir, trainer.key(loss, seed)))
                 for loss, seed in todo)
    say(f"compare: {mine}{total} runs ({len(plan.losses)} losses x {len(plan.seeds)} seeds) "
        f"of {plan.config.steps:,} steps; {len(runs) - len(todo)} already in {output_dir}, "
        f"{len(todo)} to train" + (f" ({partly} of them resumed from their checkpoints)"
                                   if partly else ""))
    if max_runs is not None:
        todo = todo[:max_runs]
    if not todo:
        return
    say(trainer.catalog)
    pace: dict = {}
    for number, (loss, seed) in enumerate(todo, 1):
        claim = _claim(output_dir, trainer.key(loss, seed))
        if isinstance(claim, LockHeld):
            say(f"run {number}/{len(todo)}: {loss}, seed {seed} is being trained by "
                f"{describe_holder(claim.holder)}: left to it")
            continue
        try:
            if (loss, seed) in done():  # finished by another process since
                say(f"run {number}/{len(todo)}: {loss}, seed {seed} finished elsewhere")
                continue
            _train_run(plan, output_dir, trainer, say, served_index, share, pace, loss,
                       seed, number, len(todo))
        finally:
            if claim is not None:
                claim.release()


def _train_run(plan: Plan, output_dir: str, trainer: Trainer, say, served_index, share,
               pace: dict, loss: str, seed: int, number: int, runs: int) -> None:
    results_path = os.path.join(output_dir, "results.csv")
    curves_path = os.path.join(output_dir, "curves.csv")
    run_start = time.perf_counter()
    run_dir = _run_dir(output_dir, trainer.key(loss, seed))
    old = [r for r in read_rows(curves_path) if r["loss"] == loss and int(r["seed"]) == seed]
    resuming = os.path.isdir(run_dir)
    say(f"run {number}/{runs}: {loss}, seed {seed}"
        + (f" (resumed: its checkpoint in {run_dir}, {len(old)} evaluation(s) made)"
           if resuming else ""))
    evaluations = list(old)

    def on_eval(row: dict) -> None:
        _evaluation_pace(plan, number, runs, pace, say)
        full = {"loss": loss, "seed": seed, **row}
        evaluations.append(full)
        with _tables(output_dir):
            append_row(curves_path, full)
        say(f"  step {int(row['steps']):,}: " + _evaluation_words(row))

    def on_step(i: int) -> None:
        _progress(i, plan.config.steps, number, runs, pace, say)

    row = trainer.train(loss, seed, run_dir, on_eval, on_step, evaluations)
    ranks = row.pop(FINAL_RANKS, None)
    embeddings = row.pop(FINAL_EMBEDDINGS, None)
    ks = [int(m.split("@")[1]) for m in metric_names([row]) if m.startswith("recall@")]
    if ranks is not None and trainer.test_users is not None \
            and len(ranks) == len(trainer.test_users):
        save_hits(hits_path(output_dir, loss, seed), trainer.test_users, ranks, ks)
    else:  # its comparisons use the seeds alone (the report says so)
        say(f"  no hits per test user saved for {loss} seed {seed}")
    with _tables(output_dir):
        _append_result(results_path, row, plan, in_plan_order=share is not None)
    shutil.rmtree(run_dir, ignore_errors=True)
    if served_index is not None and seed == plan.seeds[0]:
        _measure_served(served_index, output_dir, loss, seed, embeddings, ks, say)
    if number < runs:  # the measured run, evaluations included: SASRec's estimate
        took = (time.perf_counter() - run_start) / 60
        first = int(row.get("resumed_from_step") or 0)
        trained = plan.config.steps - first
        # A resumed run trained only its last steps: the runs left train all of theirs.
        whole = took * plan.config.steps / trained if 0 < first and trained > 0 else took
        say(f"  run {number} took {took:.1f} min: about {whole * (runs - number):.1f} "
            f"min for the {runs - number} run(s) left")


def _measure_served(served_index: ServedIndex, output_dir: str, loss: str, seed: int,
                    embeddings, ks: Sequence[int], say) -> None:
    """Calls the ``served_index`` hook on a run's final vectors and records its answer
    (`record_served`); a run without them (resumed after its last evaluation), or a hook
    that fails, costs the record alone, said in one line."""
    if embeddings is None or not ks:
        say(f"  served index not measured for {loss} seed {seed} (no final vectors)")
        return
    items, queries = embeddings
    try:
        record = served_index(items, queries, tuple(ks))
    except Exception as error:  # noqa: BLE001 (the comparison stands without it)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        say(f"  served index not measured for {loss} seed {seed}: {reason}")
        return
    with _tables(output_dir):  # the other losses' records, another process's too, stay
        record_served(output_dir, loss, seed, record)
    recall = ", ".join(f"recall@{k} {float(r):.3f}" for k, r in
                       sorted((record.get("recall") or {}).items(), key=lambda kv: int(kv[0])))
    said = record.get("description") or f"{record.get('kind')}, {recall} of the exact top-k"
    say(f"  served: {said}")


SERVED_INDEX = "served_index.json"
ServedIndex = Callable[[np.ndarray, np.ndarray, Sequence[int]], dict]
"""``served_index(item_embeddings, query_embeddings, ks) -> record`` (`run_plan`)."""


def record_served(output_dir: str, loss: str, seed: int, record: dict) -> None:
    """Adds ``record`` (a ``served_index`` hook's answer on the final model of ``loss`` at
    ``seed``) to ``output_dir``'s ``served_index.json``, ``{"losses": {loss: {"seed",
    **record}}}``, written atomically; the other losses' records stay."""
    saved = load_served(output_dir) or {"losses": {}}
    saved["losses"][loss] = {"seed": int(seed), **json.loads(json.dumps(record))}
    write_json(os.path.join(output_dir, SERVED_INDEX), saved)


def load_served(output_dir: str) -> Optional[dict]:
    """``output_dir``'s ``served_index.json`` (`record_served`), or None when there is
    none (no ``served_index`` hook was given).

    Raises:
      CompareError: a file that is not one compare wrote, naming it.
    """
    path = os.path.join(output_dir, SERVED_INDEX)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        saved = error
    if not (isinstance(saved, dict) and isinstance(saved.get("losses"), dict)
            and all(isinstance(r, dict) and isinstance(r.get("recall"), dict)
                    for r in saved["losses"].values())):
        raise CompareError(f"{path} is not a record compare wrote (a `losses` object of "
                           f"records with a `recall` each): delete it (the report then says "
                           f"nothing of the served index).")
    return saved


def _sasrec_row(plan: Plan, loss: str, seed: int, split: Split, run_dir: str,
                on_eval: Callable[[dict], None], evaluations: Sequence[dict] = ()) -> dict:
    """Trains one SASRec run (`tfrs_logq.sasrec.training.train`, which resumes a killed
    run from its last epoch) and returns its results row: the test metrics averaged
    over the last ``window`` epochs, and the ranks of the test targets at the last epoch
    (`FINAL_RANKS`); its validation curve goes to curves.csv. An epoch is at most one
    pass over the training users, so its steps (and the run's) are those it trained,
    which may be fewer than ``eval_every``."""
    import tensorflow as tf

    from tfrs_logq.pipelines.sequential import evaluation_arrays
    from tfrs_logq.sasrec.training import train

    config = plan.sasrec_config(loss, seed)
    arrays = evaluation_arrays(split, split.test, config.max_length)
    final: dict = {}

    class FinalRanks(tf.keras.callbacks.Callback):
        """The ranks of the test targets after the last epoch (before the best epoch's
        weights are restored), and the vectors ranked."""

        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == config.max_epochs:
                final_evaluation(self.model.query, self.model.encoder.item_embeddings(),
                                 arrays, final)

    result = train(config, run_dir, verbose=0, split=split, extra_callbacks=[FinalRanks()])
    window = dict(result["test_window"] or {})
    epochs = window.pop("epochs", [])
    per_epoch = result["steps"] // max(result["epochs"], 1)  # the steps an epoch trained
    done = {int(r["steps"]) for r in evaluations}
    for epoch, value in enumerate(result["validation_curve"], 1):
        if epoch * per_epoch not in done:
            on_eval({"steps": epoch * per_epoch, "validation_monitor": value})
    row = {"loss": loss, "seed": seed, "steps": result["steps"], "window": len(epochs),
           "window_steps": " ".join(str(e * per_epoch) for e in epochs),
           # The test window's band metrics are logged as head_recall@10: head:recall@10 here.
           **{(k.replace("_", ":", 1) if k.split("_", 1)[0] in BANDS else k): float(v)
              for k, v in window.items()},
           "seconds_per_step": round(result["train_seconds"] / max(result["steps"], 1), 5),
           **target_facts(split, split.test, config.max_length),
           **_duplicates(split), "diverged": int(bool(result.get("diverged"))),
           "machine": machine_description()}
    if len(final.get(FINAL_RANKS, ())) == len(arrays["targets"]):  # none when resumed
        row.update(final)  # after the last epoch
    return row


def _evaluation_words(row: dict) -> str:
    """An evaluation in a progress line: its first test metrics, or SASRec's validation
    monitor (its test metrics are scored over the last epochs, after training)."""
    shown = [f"{n} {float(row[n]):.4f}" for n in metric_names([row])[:4]]
    if not shown and row.get("validation_monitor") not in (None, ""):
        from tfrs_logq.sasrec.config import MONITOR

        shown = [f"validation {MONITOR.removeprefix('val_')} "
                 f"{float(row['validation_monitor']):.4f}"]
    return ", ".join(shown) or "evaluated"


def _evaluation_pace(plan: Plan, number: int, runs: int, pace: dict, say) -> None:
    """At the first evaluation trained here: its time, and the estimate of the time left
    with every evaluation counted."""
    now = time.perf_counter()
    if "evaluation" in pace or "last_step" not in pace or "per_step" not in pace:
        return
    pace["evaluation"] = max(0.0, now - pace["last_step"] - pace["per_step"])
    steps, evaluations = plan.config.steps, len(plan.config.eval_steps)
    done = pace["last_index"] + 2  # the step before this evaluation finished too
    left_steps = steps - done + (runs - number) * steps
    left_evaluations = (sum(1 for e in plan.config.eval_steps if e > done)
                        + (runs - number) * evaluations)
    left = left_steps * pace["per_step"] + left_evaluations * pace["evaluation"]
    say(f"  an evaluation takes {pace['evaluation']:.1f} s here: about {left / 60:.1f} min "
        f"left in all ({left_evaluations} evaluations counted)")


def _progress(i: int, steps: int, number: int, runs: int, pace: dict, say) -> None:
    """20 steps into the first run trained here: an estimate of the time left; then a
    line every tenth of a run."""
    now = time.perf_counter()
    pace["last_step"], pace["last_index"] = now, i
    if "start" not in pace:
        pace["start"], pace["first"] = now, i
    elif "per_step" not in pace and i - pace["first"] == 20:
        pace["per_step"] = (now - pace["start"]) / 20
        left = (steps - i - 1 + (runs - number) * steps) * pace["per_step"]
        say(f"  {pace['per_step'] * 1000:.0f} ms/step here: about {left / 60:.1f} min of "
            f"training for the {runs - number + 1} run(s) left (evaluations counted at the "
            f"first one)")
    if steps >= 10 and (i + 1) % max(1, steps // 10) == 0 and i + 1 < steps:
        say(f"  {100 * (i + 1) // steps}% ({i + 1:,}/{steps:,} steps)")


__all__ = ["CompareError", "FINAL_EMBEDDINGS", "FINAL_RANKS", "LOSSES", "MAX_SEED", "MODELS",
           "Plan", "RUN_COUNT_VARIABLE", "RunShare", "SERVED_INDEX", "ServedIndex",
           "TFRS_MODEL_LOSSES", "Trainer", "band_names", "check_output_dir_contents",
           "final_evaluation", "load_plan", "load_served", "metric_names", "missing_runs",
           "plan_runs", "read_plan_json", "record_served", "report_only", "resolve_share",
           "split_fingerprint", "spread", "run_compare", "run_plan", "window_row"]
