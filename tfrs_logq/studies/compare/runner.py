"""The comparison's runs: `run_plan` trains a plan's unfinished runs through a `Trainer`
(the built-in two-tower and SASRec models: `builtin_trainer`; a user's own model:
`tfrs_logq.studies.compare.model_fn`) seed by seed, each run under its lock in its run
directory, resumable; it appends each finished run to ``results.csv`` and ``curves.csv``,
saves its hits per test user (`save_hits`) and what the served index keeps
(`record_served`), and hands the rows to the report step it is given (`Report`: the report
lives above it, in `tfrs_logq.studies.compare.report`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from tfrs_logq._util.atomic import atomic_write, write_json
from tfrs_logq._util.board import EventBoard, write_experiment
from tfrs_logq._util.hostinfo import available_memory_bytes, machine_description
from tfrs_logq._util.locks import ExclusiveLock, LockHeld, LockUnsupported, describe_holder
from tfrs_logq._util.tracking import Tracking
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
from tfrs_logq.studies.compare.plan import (
    _SHARE,
    CompareError,
    Plan,
    RunShare,
    _check_plan,
    _tables,
    band_names,
    check_output_dir_contents,
    metric_names,
    missing_runs,
    plan_runs,
)
from tfrs_logq.towers import training as towers
from tfrs_logq.towers.training import Examples


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


Report = Callable[[Plan, list, list, str, Callable[[str], None]], object]
"""``report(plan, rows, curves, output_dir, say)``: what `run_plan` calls with results.csv's
and curves.csv's rows once the plan's runs are done (the report lives above the runner)."""


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


def builtin_trainer(plan: Plan, split: Split, say: Callable[[str], None] = print) -> Trainer:
    """The `Trainer` of a built-in model (``plan.model``: ``"two-tower"`` or ``"sasrec"``)
    on ``split``, checked before the output directory is touched: the split evaluable, a
    test target left to rank, the model trainable on it, a run's peak memory within what
    this machine has (``say`` tells the estimate)."""
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
    return trainer


def run_plan(plan: Plan, output_dir: str, trainer: Trainer,
             say: Callable[[str], None] = print, max_runs: Optional[int] = None,
             served_index: Optional[ServedIndex] = None,
             share: Optional[RunShare] = None,
             report: Optional[Report] = None,
             tracking: Optional[Tracking] = None) -> list[dict]:
    """Trains the plan's unfinished runs with ``trainer`` into ``output_dir`` (seed by
    seed, so that an interrupted comparison holds whole pairs), then hands the finished
    rows to ``report`` (`Report`: ``report(plan, rows, curves, output_dir, say)``, the
    comparison's `tfrs_logq.studies.compare.builtin.reporter`; None: no report); returns the
    rows of results.csv. Without a ``share``, holds the directory's lock (one such process
    per directory); refuses a directory of another plan (``plan.json``).
    `tfrs_logq.studies.compare.builtin.run_compare` runs the built-in models through it,
    `tfrs_logq.studies.compare.model_fn` a user's own.

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
    report.md is missing or older than results.csv, else the runs left are said.

    ``tracking`` (`tfrs_logq._util.tracking`): this process's comparison is also an MLflow
    parent run (the plan's settings; report.md, plan.json, results.csv and the charts as
    artifacts), each run it trains a child (its settings, evaluations and result)."""
    share = share if share is not None else _SHARE.get()
    check_output_dir(output_dir)
    plan = check_output_dir_contents(plan, output_dir)  # before anything is written
    tracked = None
    if tracking is not None:
        tracked = (tracking, tracking.start(
            f"compare {os.path.basename(os.path.abspath(output_dir))}",
            {**plan.fixed_fields(), "losses": ",".join(plan.losses),
             "seeds": ",".join(str(seed) for seed in plan.seeds)},
            tags={"tfrs_logq.output_dir": os.path.abspath(output_dir)}))
    try:
        rows = _run_plan(plan, output_dir, trainer, say, max_runs, served_index, share,
                         report, tracked)
    except BaseException as exc:
        if tracked is not None:
            tracking.end(tracked[1], "KILLED" if isinstance(exc, KeyboardInterrupt)
                         else "FAILED")
        raise
    if tracked is not None:
        tracking.artifacts(tracked[1], [os.path.join(output_dir, name) for name in (
            "report.md", "paired.png", "learning_curves.png", "plan.json", "results.csv")])
        tracking.end(tracked[1])
    return rows


def _run_plan(plan, output_dir, trainer, say, max_runs, served_index, share, report,
              tracked) -> list[dict]:
    if share is not None:
        return _run_share(plan, output_dir, trainer, say, max_runs, report, served_index,
                          share, tracked)
    with exclusive_output_dir(output_dir):
        with _tables(output_dir):
            plan = _check_plan(plan, output_dir)
        _run_all(plan, output_dir, trainer, say, max_runs, served_index, tracked=tracked)
        rows = read_rows(os.path.join(output_dir, "results.csv"))
        if rows and report is not None:
            report(plan, rows, read_rows(os.path.join(output_dir, "curves.csv")),
                   output_dir, say)
    return rows


def _run_share(plan: Plan, output_dir: str, trainer: Trainer, say, max_runs,
               report: Optional[Report], served_index, share: RunShare,
               tracked=None) -> list[dict]:
    os.makedirs(output_dir, exist_ok=True)
    with _tables(output_dir):
        plan = _check_plan(plan, output_dir)
    _run_all(plan, output_dir, trainer, say, max_runs, served_index, share, tracked)
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
        if report is None:
            return rows
        written = os.path.join(output_dir, "report.md")
        if os.path.exists(written) and os.stat(written).st_mtime_ns >= os.stat(
                results).st_mtime_ns:
            say(f"compare: every run of the plan is done and {written} is up to date "
                f"(`tfrs-logq compare --report-only` rebuilds it)")
            return rows
        say("compare: every run of the plan is done: writing the report")
        report(plan, rows, read_rows(os.path.join(output_dir, "curves.csv")), output_dir,
               say)
    return rows


RUN_LOCKS = ".locks"
log = logging.getLogger(__name__)


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
             share: Optional[RunShare] = None, tracked=None) -> None:
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
    started = time.perf_counter()
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
                       seed, number, len(todo), tracked)
        finally:
            if claim is not None:
                claim.release()
    if pace.get("time"):
        wall = time.perf_counter() - started
        say("compare: where this process's time went, " + time_words(pace["time"], wall))
        with _tables(output_dir):
            record_timing(output_dir, pace["time"], wall)


def _train_run(plan: Plan, output_dir: str, trainer: Trainer, say, served_index, share,
               pace: dict, loss: str, seed: int, number: int, runs: int,
               tracked=None) -> None:
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
    board = EventBoard(run_logdir(output_dir, loss, seed),
                       getattr(plan.config, "learning_rate", None))
    child = None
    if tracked is not None:
        tracking, parent = tracked
        child = tracking.start(f"{loss} seed {seed}", run_hparams(plan, loss, seed), parent)

    def on_eval(row: dict) -> None:
        _evaluation_pace(plan, number, runs, pace, say)
        full = {"loss": loss, "seed": seed, **row}
        evaluations.append(full)
        with _tables(output_dir):
            append_row(curves_path, full)
        board.write(row)  # after curves.csv: a kill between loses the event, never repeats it
        if child is not None:
            tracking.evaluation(child, row)
        say(f"  step {int(row['steps']):,}: " + _evaluation_words(row))

    def on_step(i: int) -> None:
        _progress(i, plan.config.steps, number, runs, pace, say)

    trained_at = time.perf_counter()
    try:
        row = trainer.train(loss, seed, run_dir, on_eval, on_step, evaluations)
    except BaseException as exc:
        if child is not None:
            tracking.end(child, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    train_wall = time.perf_counter() - trained_at
    written_at = time.perf_counter()
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
        board.write_trial(run_hparams(plan, loss, seed), row, f"{loss}-seed{seed}")
        _write_experiment(plan, output_dir, metric_names([row]))
    if child is not None:
        tracking.evaluation(child, row, step=int(row.get("steps") or 0), prefix="result.")
        tracking.end(child)
    shutil.rmtree(run_dir, ignore_errors=True)
    writing = time.perf_counter() - written_at
    served_at = time.perf_counter()
    if served_index is not None and seed == plan.seeds[0]:
        _measure_served(served_index, output_dir, loss, seed, embeddings, ks, say)
    _add_timing(pace, row, plan.config.steps, train_wall, writing,
                time.perf_counter() - served_at, time.perf_counter() - run_start)
    if number < runs:  # the measured run, evaluations included: SASRec's estimate
        took = (time.perf_counter() - run_start) / 60
        first = int(row.get("resumed_from_step") or 0)
        trained = plan.config.steps - first
        # A resumed run trained only its last steps: the runs left train all of theirs.
        whole = took * plan.config.steps / trained if 0 < first and trained > 0 else took
        say(f"  run {number} took {took:.1f} min: about {whole * (runs - number):.1f} "
            f"min for the {runs - number} run(s) left")


TIME_PARTS = ("training steps", "evaluations, checkpoints and tracing", "the served index",
              "writing the results", "the rest")


def _add_timing(pace: dict, row: dict, steps: int, train_wall: float, writing: float,
                served: float, run_wall: float) -> None:
    """Adds a run's seconds to ``pace["time"]`` by part (`TIME_PARTS`): its training steps
    (seconds per step, the first step and saves left out, times the steps it trained
    here), the rest of its trainer's time (evaluations, checkpoints, tracing), the served
    index, the writes, and what remains of the run's wall time."""
    per_step = row.get("seconds_per_step")
    trained = steps - int(row.get("resumed_from_step") or 0)
    try:
        stepping = min(float(per_step) * trained, train_wall)
    except (TypeError, ValueError):
        stepping = float("nan")
    if not math.isfinite(stepping):
        stepping = 0.0
    parts = (stepping, train_wall - stepping, served, writing,
             max(run_wall - train_wall - served - writing, 0.0))
    totals = pace.setdefault("time", dict.fromkeys(TIME_PARTS, 0.0))
    for name, seconds in zip(TIME_PARTS, parts):
        totals[name] += seconds


def time_words(totals: dict, wall: float) -> str:
    """``totals`` (seconds by `TIME_PARTS`) in one line: each part's minutes and share of
    ``wall``, and the wall time as a multiple of the training steps' time."""
    def duration(seconds: float) -> str:
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    shown = ", ".join(f"{name} {duration(seconds)} ({100 * seconds / wall:.0f} %)"
                      for name, seconds in totals.items()
                      if seconds >= 0.005 * wall or name == TIME_PARTS[0])
    steps = totals.get(TIME_PARTS[0], 0.0)
    ratio = f"; {wall / steps:.2f}x the training steps' time" if steps > 0 else ""
    return f"{duration(wall)}: {shown}{ratio}"


TIMINGS = "timings.json"
"""Where each process's time went (`record_timing`): a list, one entry a `run_plan`."""


def record_timing(output_dir: str, totals: dict, wall: float) -> None:
    """Appends a process's seconds by part and its wall time to ``timings.json`` (under the
    tables' lock, which the caller holds)."""
    path = os.path.join(output_dir, TIMINGS)
    entries = load_timings(output_dir)
    entries.append({"seconds": {k: round(v, 2) for k, v in totals.items()},
                    "wall_seconds": round(wall, 2), "machine": machine_description()})
    write_json(path, entries)


def load_timings(output_dir: str) -> list:
    """``timings.json``'s entries; [] where there is none or it cannot be read (the
    report's sentence on time is left out, nothing else depends on it)."""
    try:
        with open(os.path.join(output_dir, TIMINGS)) as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return []
    return entries if isinstance(entries, list) else []


LOGS_DIR = "logs"
"""TensorBoard's event files of a comparison (`tfrs_logq._util.board`): a folder a run
(``<loss>-seed<seed>``), the HParams experiment at its root."""


def run_logdir(output_dir: str, loss: str, seed: int) -> str:
    """The run's TensorBoard log directory: ``OUTPUT_DIR/logs/<loss>-seed<seed>``."""
    return os.path.join(output_dir, LOGS_DIR, f"{loss}-seed{seed}")


def run_hparams(plan: Plan, loss: str, seed: int) -> dict:
    """The run's HParams: its loss and seed, the model, and every setting of the plan's
    config that is a number, a string or a bool (its TensorBoard table's columns)."""
    fixed = plan.fixed_fields()
    settings = {k: v for k, v in fixed["config"].items()
                if isinstance(v, (str, int, float, bool)) and v is not None}
    return {"loss": loss, "seed": int(seed), "model": plan.model, **settings}


def _write_experiment(plan: Plan, output_dir: str, metrics: Sequence[str]) -> None:
    """The comparison's HParams experiment at ``logs/``, rewritten (the older one removed)
    for the plan as it stands: its losses, seeds and settings, the runs' metrics."""
    root = os.path.join(output_dir, LOGS_DIR)
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # the experiment's event files alone: runs are folders
        if name.startswith("events.out.tfevents.") and os.path.isfile(os.path.join(root, name)):
            os.remove(os.path.join(root, name))
    trials = [run_hparams(plan, loss, seed) for seed in plan.seeds for loss in plan.losses]
    write_experiment(root, {k: [t[k] for t in trials] for k in trials[0]}, metrics)


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


__all__ = ["FINAL_EMBEDDINGS", "FINAL_RANKS", "LOGS_DIR", "Report", "SERVED_INDEX", "ServedIndex",
           "TIMINGS", "TIME_PARTS", "Trainer", "builtin_trainer", "final_evaluation",
           "hits_path", "load_hits", "load_served", "load_timings", "record_served",
           "record_timing", "run_hparams", "run_logdir", "run_plan", "save_hits",
           "time_words", "window_row"]
