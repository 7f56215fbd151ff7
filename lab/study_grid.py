"""The study's resumable driver: results.csv row by row, checkpoints, one driver at a time.

`run_grid` runs the unfinished runs of a grid (`lab.study.preset_runs`) into an
output directory: a row is appended to ``results.csv`` when a run finishes (a run
whose ``run_id`` is there is skipped), a run killed while training goes on from its
`StepCheckpoint` in ``runs/`` (`checkpoint_directory`; deleted once its row is
written), and ``table.md`` and the charts are rewritten at the end
(`lab.study_report`). ``benchmarks/synthetic_study.sh`` calls it run by run
from a pinned commit and commits the directory after each.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Iterable, Optional, Sequence

from lab.study import Run, World, checkpoint_key, execute
from tfrs_logq._util.step_checkpoint import StepCheckpoint, source_fingerprint
from tfrs_logq.studies._grid import append_row, exclusive_output_dir, missing, read_rows


def checkpoint_directory(output_dir: str, run: Run) -> str:
    """Where a grid keeps a run's `StepCheckpoint` while it trains (``runs/`` is not
    committed): named by its `checkpoint_key` (the package's code) and the lab's own code
    (this directory's `source_fingerprint`), so other code writes elsewhere."""
    lab = source_fingerprint(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256(f"{checkpoint_key(run)}|lab={lab}".encode()).hexdigest()[:16]
    return os.path.join(output_dir, "runs", digest)


def remove_stale_checkpoints(output_dir: str, todo: Sequence[Run], say=print) -> None:
    """Deletes the study checkpoints in ``output_dir/runs`` that no run of ``todo``
    will resume: finished runs' (a kill between the row and the clean-up) and other
    code's or other runs' (each holds weights and moments, 770 MB at 1M items)."""
    runs_dir = os.path.join(output_dir, "runs")
    if not os.path.isdir(runs_dir):
        return
    keep = {os.path.basename(checkpoint_directory(output_dir, run)) for run in todo}
    for name in sorted(os.listdir(runs_dir)):
        path = os.path.join(runs_dir, name)
        if (name not in keep and os.path.isfile(os.path.join(path, StepCheckpoint.KEY_FILE))):
            shutil.rmtree(path, ignore_errors=True)
            say(f"study: removed {path}, a checkpoint no unfinished run resumes")


def read_results(output_dir: str) -> list[dict]:
    """The rows of ``output_dir/results.csv`` (strings; [] before the first)."""
    return read_rows(os.path.join(output_dir, "results.csv"))


def pending(runs: Iterable[Run], output_dir: str) -> list[Run]:
    """The runs with a row missing (a run with ``eval_at`` writes one per evaluation)."""
    done = {row["run_id"] for row in read_results(output_dir)}
    return missing(runs, done, lambda run: run.evaluations)


def run_grid(runs: Sequence[Run], output_dir: str, max_runs: Optional[int] = None,
             say=print) -> list[dict]:
    """Runs the unfinished runs in order (at most ``max_runs``), appending each row to
    ``results.csv`` as it finishes, then rewrites table.md and the chart. Resumable: a
    run whose ``run_id`` is in results.csv is skipped, and a run killed while training
    goes on from its last `StepCheckpoint` (`checkpoint_directory`, every 2 minutes).
    A second driver on the same ``output_dir`` is refused (`RunLock`)."""
    with exclusive_output_dir(output_dir):  # one driver per output directory
        return _run_grid(runs, output_dir, max_runs, say)


def _run_grid(runs: Sequence[Run], output_dir: str, max_runs: Optional[int], say) -> list[dict]:
    from lab.study_report import write_report

    todo = pending(runs, output_dir)
    say(f"study: {len(runs) - len(todo)} of {len(runs)} runs already in {output_dir}")
    remove_stale_checkpoints(output_dir, todo, say)
    worlds: dict = {}
    for number, run in enumerate(todo[:max_runs] if max_runs is not None else todo, 1):
        key = run.world()
        if key not in worlds:
            worlds = {key: World(run, os.path.join(output_dir, "truth.json"))}  # one at a time
        say(f"run {number}/{len(todo)}: V={run.num_items:,} {run.sampler} "
            f"({run.num_in_batch_negatives}+{run.num_uniform_negatives}) {run.proposal} "
            f"{run.correction} seed {run.seed}, {run.steps} steps, {run.optimizer}")
        checkpoint_dir = checkpoint_directory(output_dir, run)
        done = {r["run_id"] for r in read_results(output_dir)}

        def append(new: dict) -> None:
            if new["run_id"] not in done:
                append_row(os.path.join(output_dir, "results.csv"), new)
                done.add(new["run_id"])
                if new["steps"] != run.steps:
                    say(f"  step {new['steps']:,}: exact Recall@10/100/1000 "
                        f"{new['exact_recall@10']:.4f} / {new['exact_recall@100']:.4f} / "
                        f"{new['exact_recall@1000']:.4f}")

        row = execute(run, worlds[key], checkpoint_dir, on_row=append, done=tuple(done))
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        if row["resumed_from_step"]:
            say(f"  resumed from step {row['resumed_from_step']:,}")
        say(f"  exact Recall@10/100/1000 {row['exact_recall@10']:.4f} / "
            f"{row['exact_recall@100']:.4f} / {row['exact_recall@1000']:.4f}, "
            f"{row['seconds_per_step']} s/step")
    rows = read_results(output_dir)
    if rows:
        write_report(rows, output_dir)
    return rows


__all__ = ["checkpoint_directory", "pending", "read_results", "remove_stale_checkpoints",
           "run_grid"]
