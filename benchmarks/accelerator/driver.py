"""The resumable driver: runs a list of `Run`s into ``OUT/results.csv``.

- A row is written (atomically: the whole file to a temporary, then renamed) when a run
  has been evaluated at one of its ``eval_at`` step counts; rows already in the file are
  not run again.
- A run's state (weights, Adam moments, step) is saved to ``OUT/runs/<key>.npz``
  (atomically) every ``checkpoint_seconds``, after every evaluation and when the time
  budget (``max_seconds``) is spent; a run finds it there and goes on from it, ending
  exactly as an uninterrupted run (every draw is a function of ``(seed, step)``). The
  state after the last evaluation is kept, so a run asked later for more steps (a
  longer ``--eval-at``) continues instead of starting again. A
  checkpoint belongs to its run's training fields and to a digest of this package's and
  keras-logq's loss source; other code starts the run from step 0.
- Hits per held-out user of every evaluation (`evaluate.evaluate_with_hits`: exact and
  observed, per cut-off, and the target's band) go to ``OUT/hits/<key>.npz`` (compressed,
  atomically, before the row; `hits_path`, `load_hits`), so that seeds x users intervals
  (`tfrs_logq.studies.compare.stats.seed_user_interval`) can be taken from a run; a resumed
  run writes the same hits as an uninterrupted one.
- ``max_seconds``: before each block of steps, evaluation or save, the driver checks
  that it fits in what is left (from measured times), else saves and returns, so a
  job of 10 minutes ends with its progress on disk.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import glob
import hashlib
import io
import json
import os
import platform
import subprocess
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import evaluate as eval_lib
from . import model as model_lib
from .runs import Run, proposal_log_q
from .world import BANDS, KS, World, device_tables

METRIC_COLUMNS = (
    [f"exact_recall@{k}" for k in KS] + [f"observed_recall@{k}" for k in KS]
    + [f"{b}_recall@{k}" for b in BANDS for k in KS]
    + [f"model_p_q{q}" for q in eval_lib.QUANTILES]
    + [f"model_p_over_q_q{q}" for q in eval_lib.QUANTILES])
TRUTH_COLUMNS = (
    [f"oracle_exact_recall@{k}" for k in KS] + [f"truth_p_q{q}" for q in eval_lib.QUANTILES]
    + [f"truth_p_over_q_q{q}" for q in eval_lib.QUANTILES] + [f"{b}_targets" for b in BANDS])
TIMING_COLUMNS = ["seconds_per_step", "train_seconds", "eval_seconds", "resumed_from_step",
                  "device", "backend", "machine", "code"]
COLUMNS = (["run_id"] + list(Run().fields(0)) + METRIC_COLUMNS + TRUTH_COLUMNS
           + TIMING_COLUMNS)


class OutOfTime(Exception):
    """The time budget is spent; progress is on disk."""


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 (12 hex) of this package's sources and keras-logq's loss, read once (at
    import of this module): the code this process runs, not later edits on disk."""
    import keras_logq.losses

    here = os.path.dirname(__file__)
    files = sorted(glob.glob(os.path.join(here, "*.py"))) + [keras_logq.losses.__file__]
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + f.read())
    return h.hexdigest()[:12]


code_digest()  # now, while the files on disk are the ones imported


def machine_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                      if line.startswith("Model name")), platform.processor())
    except (OSError, subprocess.SubprocessError):
        model = platform.processor()
    return f"{model}, {os.cpu_count()} cores"


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', d.platform)}"


# ---------------------------------------------------------------------------- files

def write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def finished_rows(path: str) -> set:
    if not os.path.exists(path):
        return set()
    with open(path, newline="") as f:
        return {row["run_id"] for row in csv.DictReader(f)}


def append_row(path: str, row: dict) -> None:
    """Appends ``row`` to the CSV at ``path`` by rewriting the file atomically."""
    old = b""
    if os.path.exists(path):
        with open(path, "rb") as f:
            old = f.read()
        header = old.split(b"\n", 1)[0].decode().strip()
        if header.split(",") != COLUMNS:
            raise ValueError(f"{path} has other columns than this code writes; use another "
                             "--output-dir.")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    if not old:
        writer.writeheader()
    writer.writerow({c: row.get(c, "") for c in COLUMNS})
    write_atomic(path, old + buf.getvalue().encode())


def hits_path(out_dir: str, row_id: str) -> str:
    """Where the hits per user of the row ``row_id`` are: ``OUT/hits/<sha256[:16]>.npz``."""
    return os.path.join(out_dir, "hits", hashlib.sha256(row_id.encode()).hexdigest()[:16]
                        + ".npz")


def save_hits(out_dir: str, row_id: str, hits: dict, world: World) -> None:
    """Writes ``hits`` (`evaluate.evaluate_with_hits`'s) with the row's id and the held-out
    users' ids and targets, compressed, atomically."""
    os.makedirs(os.path.join(out_dir, "hits"), exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, row_id=np.array(row_id),
                        user_id=np.asarray(world.eval_batch["user_id"], np.int64),
                        target=np.asarray(world.eval_batch["target"], np.int64), **hits)
    write_atomic(hits_path(out_dir, row_id), buf.getvalue())


def load_hits(out_dir: str, row_id: str) -> dict:
    """The saved hits of the row ``row_id``: ``exact`` `[users, len(ks)]` float64,
    ``observed`` `[users, len(ks)]` bool, ``band``, ``ks``, ``user_id``, ``target``."""
    path = hits_path(out_dir, row_id)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no hits for {row_id} (rows written before hits "
                                "were saved have none; rerun the run into a new --output-dir).")
    with np.load(path) as data:
        out = {name: data[name] for name in data.files}
    if str(out.pop("row_id")) != row_id:
        raise ValueError(f"{path} holds the hits of another row; delete it and rerun.")
    return out


def save_checkpoint(path: str, key: str, state: dict) -> None:
    arrays = {"key": np.array(key), "step": np.asarray(state["step"])}
    for part in ("params", "m", "v"):
        for name, value in state[part].items():
            arrays[f"{part}/{name}"] = np.asarray(value)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(path, buf.getvalue())


def load_checkpoint(path: str, key: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    with np.load(path) as data:
        if str(data["key"]) != key:
            return None
        state = {"params": {}, "m": {}, "v": {}, "step": jnp.asarray(data["step"])}
        for name in data.files:
            if "/" in name:
                part, field = name.split("/", 1)
                state[part][field] = jnp.asarray(data[name])
    return state


# ---------------------------------------------------------------------------- a run

def step_config(run: Run) -> model_lib.StepConfig:
    return model_lib.StepConfig(
        world=run.world(), batch_size=run.batch_size, embedding_dim=run.embedding_dim,
        num_uniform=run.num_uniform_negatives, num_in_batch=run.num_in_batch_negatives,
        correction=run.correction, inclusion=run.proposal == "inclusion",
        learning_rate=run.learning_rate, seed=run.seed)


class Clock:
    """The process's time budget."""

    def __init__(self, max_seconds: Optional[float], started_at: Optional[float] = None) -> None:
        self.start = time.time() if started_at is None else started_at
        self.max_seconds = max_seconds
        self.compile_seconds = 30.0  # a run's set-up and compilation: the last one measured

    def left(self) -> float:
        if self.max_seconds is None:
            return float("inf")
        return self.max_seconds - (time.time() - self.start)


@dataclasses.dataclass
class Context:
    out_dir: str
    world: World
    truth: dict
    clock: Clock
    checkpoint_seconds: float = 120.0
    chunk_floats: int = eval_lib.DEFAULT_CHUNK_FLOATS
    log: callable = print


def run_one(run: Run, ctx: Context, done: set) -> int:
    """Trains ``run`` to its last pending ``eval_at`` point, writing a row at each;
    returns the rows written. Raises `OutOfTime` (after saving) when the budget ends."""
    pending = [s for s in run.eval_at if run.row_id(s) not in done]
    if not pending:
        return 0
    results = os.path.join(ctx.out_dir, "results.csv")
    code = code_digest()
    key = f"{run.training_key}|code={code}"
    os.makedirs(os.path.join(ctx.out_dir, "runs"), exist_ok=True)
    ckpt = os.path.join(ctx.out_dir, "runs",
                        hashlib.sha256(run.training_key.encode()).hexdigest()[:16] + ".npz")
    config = step_config(run)
    state = load_checkpoint(ckpt, key)
    resumed_from = int(state["step"]) if state is not None else 0
    if state is None:
        state = model_lib.init_state(config)
    lost = [s for s in pending if s < resumed_from]
    if lost:  # cannot happen with this driver (it evaluates before it saves a step)
        raise ValueError(f"{ckpt} is at step {resumed_from}, past the run's pending "
                         f"evaluation points {lost}: delete it to retrain.")
    if ctx.clock.left() < ctx.clock.compile_seconds + 5.0:
        raise OutOfTime(f"no time to start {run.row_id(run.steps)} (set-up and compilation "
                        f"took {ctx.clock.compile_seconds:.0f} s)")
    ctx.log(f"run {run.row_id(run.steps)}: from step {resumed_from}, evaluations at {pending}")
    t_setup = time.perf_counter()
    tables = device_tables(ctx.world)
    log_q = proposal_log_q(run, ctx.world.log_q)
    # Checked once here, on the host: the jitted loss skips keras_logq's per-step check
    # (a host callback under jax.jit, 4-6 ms of a 23-30 ms CPU step).
    if np.nanmax(np.where(np.isfinite(log_q), log_q, -np.inf)) > 1e-5:
        raise ValueError(f"the proposal's log Q exceeds 0 (Q > 1): max "
                         f"{np.nanmax(log_q):.4g}.")
    log_q_table = jnp.asarray(np.where(np.isfinite(log_q), log_q, 0.0), jnp.float32)
    loop = model_lib.make_train_loop(config)
    state, _ = loop(tables, log_q_table, state, 0)  # compiles
    jax.block_until_ready(state)
    ctx.clock.compile_seconds = time.perf_counter() - t_setup
    trained, train_time, save_time, eval_time = 0, 0.0, 1.0, None
    per_step = None
    last_save = time.perf_counter()
    chunk = 10
    written = 0
    step = resumed_from

    def save():
        nonlocal save_time, last_save
        t0 = time.perf_counter()
        save_checkpoint(ckpt, key, state)
        save_time, last_save = time.perf_counter() - t0, time.perf_counter()

    for target in pending:
        while step < target:
            n = min(chunk, target - step)
            needed = (n * per_step if per_step else 0.0) + save_time + 1.0
            if ctx.clock.left() < needed:
                save()
                raise OutOfTime(f"stopped at step {step} of {run.row_id(run.steps)}")
            t0 = time.perf_counter()
            state, loss = loop(tables, log_q_table, state, n)
            jax.block_until_ready(loss)
            dt = time.perf_counter() - t0
            step += n
            trained += n
            train_time += dt
            per_step = train_time / trained
            chunk = int(np.clip(5.0 / max(per_step, 1e-6), 1, 2000))
            if not np.isfinite(float(loss)):
                raise FloatingPointError(f"loss {float(loss)} at step {step} of {run.row_id(step)}")
            if time.perf_counter() - last_save > ctx.checkpoint_seconds and step < target:
                save()
                ctx.log(f"  step {step}: {per_step * 1e3:.2f} ms/step, saved")
        if ctx.clock.left() < (eval_time or 0.0) + save_time + 1.0:
            save()
            raise OutOfTime(f"stopped at step {step} of {run.row_id(run.steps)}, "
                            "before its evaluation")
        t0 = time.perf_counter()
        metrics, hits = eval_lib.evaluate_with_hits(state["params"], ctx.world,
                                                    ctx.chunk_floats)
        eval_time = time.perf_counter() - t0
        save_hits(ctx.out_dir, run.row_id(target), hits, ctx.world)
        row = {"run_id": run.row_id(target), **run.fields(target), **metrics, **ctx.truth,
               "seconds_per_step": round(per_step, 5) if per_step else "",
               "train_seconds": round(train_time, 1), "eval_seconds": round(eval_time, 1),
               "resumed_from_step": resumed_from, "device": device_name(),
               "backend": f"jax {jax.__version__}", "machine": machine_name(), "code": code}
        append_row(results, row)
        done.add(run.row_id(target))
        written += 1
        ctx.log(f"  step {target}: exact R@10/100/1000 "
                + " / ".join(f"{metrics[f'exact_recall@{k}']:.4f}" for k in KS)
                + f", {per_step * 1e3 if per_step else float('nan'):.2f} ms/step, "
                  f"eval {eval_time:.1f} s")
        save()  # also after the last: a longer --eval-at later goes on from here
    return written


def world_truth(world: World, out_dir: str, chunk_floats: int) -> dict:
    """The truth columns, cached in ``OUT/truth.json`` by world."""
    path = os.path.join(out_dir, "truth.json")
    key = f"{world.config!r} num_eval_users={len(world.eval_batch['target'])}"
    cached = {}
    if os.path.exists(path):
        with open(path) as f:
            cached = json.load(f)
    if key not in cached:
        cached[key] = eval_lib.truth_columns(world, chunk_floats)
        write_atomic(path, (json.dumps(cached, indent=1, sort_keys=True) + "\n").encode())
    return cached[key]


def run_all(runs: list, out_dir: str, max_seconds: Optional[float] = None,
            max_runs: Optional[int] = None, checkpoint_seconds: float = 120.0,
            chunk_floats: int = eval_lib.DEFAULT_CHUNK_FLOATS, log=print,
            started_at: Optional[float] = None) -> dict:
    """Runs every pending run in order; returns ``{"rows": written, "pending": runs left,
    "stopped": reason or None}``. ``max_seconds`` counts from ``started_at`` (a
    `time.time()`; the process's start in the command line), else from now."""
    os.makedirs(out_dir, exist_ok=True)
    clock = Clock(max_seconds, started_at)
    done = finished_rows(os.path.join(out_dir, "results.csv"))
    todo = [r for r in runs if any(r.row_id(s) not in done for s in r.eval_at)]
    if max_runs is not None:
        todo = todo[:max_runs]
    worlds: dict = {}
    stopped = None
    rows_before = len(done)
    for i, run in enumerate(todo):
        wkey = (run.world(), run.num_eval_users)
        if wkey not in worlds:
            worlds.clear()  # one world in memory at a time
            t0 = time.perf_counter()
            world = World(run.world(), run.num_eval_users)
            truth = world_truth(world, out_dir, chunk_floats)
            worlds[wkey] = (world, truth)
            log(f"world {run.world()}: set up in {time.perf_counter() - t0:.1f} s")
        world, truth = worlds[wkey]
        ctx = Context(out_dir, world, truth, clock, checkpoint_seconds, chunk_floats, log)
        try:
            run_one(run, ctx, done)
        except OutOfTime as stop:
            stopped = str(stop)
            log(f"out of time: {stop}")
            break
    pending = [r for r in runs if any(r.row_id(s) not in done for s in r.eval_at)]
    return {"rows": len(done) - rows_before, "pending": len(pending), "stopped": stopped}


__all__ = ["COLUMNS", "OutOfTime", "append_row", "hits_path", "load_checkpoint", "load_hits",
           "run_all", "run_one", "save_checkpoint", "save_hits"]
