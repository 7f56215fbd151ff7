"""What a comparison is and where it stands: the `Plan` (every setting that changes a
result, the data's identity, `ModelFnConfig` for a user's own model), ``plan.json`` (read,
checked against a rerun, written), the run list and its share over processes
(`plan_runs`, `RunShare`, `resolve_share`, `spread`), the output directory's contents and
``results.csv``'s checks (`check_output_dir_contents`, `check_results`, `missing_runs`), and
the lock of its tables (`_tables`). The lowest layer of `tfrs_logq.studies.compare`: it
imports nothing of the runner, the report or a user's model.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from typing import Iterator, Mapping, Optional, Sequence

import numpy as np

from tfrs_logq._util.atomic import write_json
from tfrs_logq._util.locks import ExclusiveLock, LockUnsupported
from tfrs_logq.corrections import LossNameError, parse_loss_name
from tfrs_logq.pipelines.splits import Split
from tfrs_logq.studies._grid import (
    read_rows,
)
from tfrs_logq.towers.config import LOSSES, TwoTowerConfig

log = logging.getLogger(__name__)


MAX_SEED = 2**32 - 1
"""The largest seed (NumPy's and TensorFlow's seeds are 32-bit)."""


MODELS = ("two-tower", "sasrec", "tfrs-model")


TFRS_MODEL_LOSSES = tuple(loss for loss in LOSSES if loss.startswith("inbatch-"))
"""The losses of a user's own TFRS model (`tfrs_logq.studies.compare.model_fn`): its task scores
the batch's candidates, in-batch negatives only."""


class CompareError(ValueError):
    """A plan that cannot run, or an output directory holding another plan."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `run_compare` trains: ``losses`` x ``seeds`` runs of ``config``'s model
    (``model="tfrs-model"``: a user's own model, `tfrs_logq.studies.compare.model_fn`, whose
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
    `tfrs_logq.studies.compare.model_fn.compare_split`)."""
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
        config_class = ModelFnConfig
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
        check_results(read_rows(results), results)
    return plan


def missing_runs(plan: Plan, rows: Sequence[dict]) -> list[tuple]:
    """The plan's runs ``(loss, seed)`` without a row in ``rows`` (results.csv's), in the
    plan's order."""
    done = {(r["loss"], int(r["seed"])) for r in rows}
    return [run for run in plan_runs(plan) if run not in done]


TABLES_LOCK = ".tables.lock"


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
class ReportError(ValueError):
    """Input the report cannot read (a results row without a seed, a primary metric or
    baseline the comparison did not record): one line that names the fix."""


EVALUATED_KS = (10, 20, 100, 1000)
"""The cut-offs a comparison evaluates (two-tower and a user's model: 10, 100, 1000 below
the catalog's size; SASRec: 10 and 20)."""


def check_results(rows: list[dict], path: str = "results.csv") -> None:
    """Refuses, in one line naming ``path``, the row and the fix, a damaged results table:
    a truncated or overlong row, a loss or seed missing, a seed or metric that is not a
    number, a recall or NDCG outside [0, 1], a (loss, seed) twice, a metric column of a
    cut-off no comparison evaluates. A damaged row is never read as a diverged run (a run
    that diverged writes NaN, which stays allowed)."""
    fix = (f"restore {path} (or delete that line to retrain the run), then rerun "
           f"`tfrs-logq compare`")
    if rows:
        for name in rows[0]:
            if name is None:
                continue
            base = name.split(":", 1)[1] if ":" in name else name
            match = re.fullmatch(r"(recall|ndcg)@([0-9]+)", base)
            if base.startswith(("recall@", "ndcg@")) and (
                    not match or int(match.group(2)) not in EVALUATED_KS):
                raise ReportError(f"{path} has a column {name!r}, which no comparison "
                                  f"writes (cut-offs {', '.join(map(str, EVALUATED_KS))}): "
                                  f"{fix}.")
        for required in ("loss", "seed"):
            if required not in rows[0]:
                raise ReportError(f"{path} has no {required!r} column: it is not a "
                                  f"comparison's results table; {fix}.")
    seen: dict = {}
    for number, row in enumerate(rows, 2):  # line 1 of results.csv is its header
        where = f"{path} line {number}"
        if None in row or any(value is None for value in row.values()):
            raise ReportError(f"{where} has {'more' if None in row else 'fewer'} cells than "
                              f"the header (a damaged row, not a diverged run): {fix}.")
        seed = str(row.get("seed", "")).strip()
        if not row.get("loss") or not re.fullmatch(r"[0-9]+", seed) \
                or int(seed) > 2**32 - 1:
            raise ReportError(f"{where} has no loss or no seed in [0, 2**32-1] (loss "
                              f"{row.get('loss')!r}, seed {row.get('seed')!r}): {fix}.")
        key = (row["loss"], int(seed))
        if key in seen:
            raise ReportError(f"{where} repeats the run {key[0]} seed {key[1]} of line "
                              f"{seen[key]}: {fix}.")
        seen[key] = number
        for name in [n for n in row if n is not None and n.split(":", 1)[-1].startswith(
                ("recall@", "ndcg@"))]:
            text = str(row[name]).strip()
            if text == "" and ":" in name:  # a band with no target
                continue
            try:
                value = float(text)
            except ValueError:
                raise ReportError(f"{where}: {name} is {text[:20]!r}, not a number (a "
                                  f"damaged row, not a diverged run): {fix}.") from None
            if math.isfinite(value) and not 0.0 <= value <= 1.0:
                raise ReportError(f"{where}: {name} is {value:g}, outside [0, 1]: {fix}.")
DEFAULT_SHUFFLE_BUFFER = 100_000
"""The training set's shuffle buffer, as in TFRS's tutorials."""


@dataclasses.dataclass(frozen=True)
class ModelFnConfig:
    """One run of a user's model: the plan's ``config`` for ``model="tfrs-model"``, what
    `compare_model` was given and what it measured of the model (so that ``plan.json``
    refuses a rerun with another model or settings, and the report says what trained)."""

    loss: str = "inbatch-corrected"
    """one of `tfrs_logq.studies.compare.plan.TFRS_MODEL_LOSSES`"""
    seed: int = 0
    """initial weights, batches and dropout masks (common random numbers across losses)"""
    steps: int = 3000
    """training steps (fixed: no early stopping)"""
    batch_size: int = 512
    """training examples per step"""
    eval_every: int = 500
    """evaluate the test queries every this many steps (and at the last step)"""
    exclude_seen: bool = True
    """the test set gives a history per query, left out of the ranking"""
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    """the training set's shuffle buffer"""
    model_fn: str = ""
    """``module:function`` of the function that builds the model"""
    query_model: str = "query_model"
    """the model's attribute (or the function) that embeds a query"""
    candidate_model: str = "candidate_model"
    """the model's attribute (or the function) that embeds a candidate"""
    optimizer: str = ""
    """the class of the optimizer ``model_fn`` compiled the model with"""
    learning_rate: Optional[float] = None
    """its learning rate (None: a schedule)"""
    embedding_dim: int = 0
    """the size of the towers' embeddings"""
    history_length: int = 0
    """the longest history a test query gives (the items a request sends)"""
    model_source: str = ""
    """the file that defines ``model_fn`` and a digest of its code (`model_source`):
    comments and blank lines do not count, every other edit (docstrings too) does"""
    architecture: str = ""
    """the model as built: its layers, parameters and a digest of every layer's class and
    configuration, every weight's shape and dtype and the optimizer's configuration
    (`architecture`)"""

    def __post_init__(self) -> None:
        parse_loss_name(self.loss, TFRS_MODEL_LOSSES)  # the one check of the name
        for name, low in (("steps", 1), ("batch_size", 2), ("eval_every", 1),
                          ("shuffle_buffer", 1)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                    or value < low:
                raise CompareError(f"`{name}` must be an integer >= {low}, received "
                                   f"{str(value)[:40]}.")

    @property
    def eval_steps(self) -> tuple:
        """The steps at which the test queries are evaluated, the last one included."""
        return (*range(self.eval_every, self.steps, self.eval_every), self.steps)

    @property
    def run_id(self) -> str:
        return "|".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


__all__ = ["DEFAULT_SHUFFLE_BUFFER", "EVALUATED_KS", "LOSSES", "MAX_SEED", "MODELS",
           "OUTPUT_FILES", "RUN_COUNT_VARIABLE", "TFRS_MODEL_LOSSES", "CompareError",
           "ModelFnConfig", "Plan", "ReportError", "RunShare", "band_names",
           "check_output_dir_contents", "check_results", "load_plan", "metric_names",
           "missing_runs", "plan_runs", "read_plan_json", "resolve_share",
           "split_fingerprint", "spread"]
