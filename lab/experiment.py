"""`python -m lab experiment`: a grid of datasets x splits x losses x seeds, as the paper's Table 1.

Each run is `tfrs_logq.sasrec.training.train` in its own model directory. A finished
run (its ``metrics.json`` exists) is reused only when its saved ``config.json``
equals the requested config; an interrupted one resumes from its last epoch; a
directory holding a run of another config is an error (choose another
``--output-dir``), so results are never relabelled. Results go to ``results.csv``
(one row per run), ``table.md`` (mean and standard deviation over seeds of
Recall@20 and NDCG@20 on the test split, losses as rows and dataset/split as
columns, like the paper's Table 1) and ``table.png``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import multiprocessing
import os
from typing import Optional, Sequence

import numpy as np

from tfrs_logq._util.atomic import save_figure, write_csv, write_text
from tfrs_logq.sasrec.training import resolve_config, same_run, train
from tfrs_logq.studies._grid import read_rows

ROW_LABELS = {
    "bce": "BCE (1 uniform negative)",
    "gbce": "gBCE (256 negatives, t=0.75)",
    "full-softmax": "Full softmax",
    "uniform": "Sampled softmax, uniform",
    "inbatch-none": "In-batch, without logQ",
    "inbatch-logq-tfrs": "In-batch, standard logQ (TFRS)",
    "inbatch-logq-official": "In-batch, standard logQ",
    "inbatch-corrected": "In-batch, improved logQ",
    "mns-none": "MNS, without logQ",
    "mns-logq-tfrs": "MNS, standard logQ (TFRS)",
    "mns-logq-official": "MNS, standard logQ",
    "mns-corrected": "MNS, improved logQ",
}
METRICS = ("recall@20", "ndcg@20")
CURVE_FIELDS = ("dataset", "split", "loss", "seed", "preset", "epoch", "val_ndcg@10")


def _row(config, preset: str, result: dict) -> dict:
    return {"dataset": config.dataset, "split": config.split, "loss": config.loss,
            "seed": config.seed, "preset": preset, "epochs": result["epochs"],
            "best_epoch": result.get("best_epoch"),
            "steps": result["steps"], "train_seconds": result["train_seconds"],
            **{f"test_{m}": result["test"][m] for m in METRICS},
            **{f"val_{m}": result["validation"][m] for m in METRICS},
            # The fixed-length protocol's score: mean test metric over the last epochs.
            **{f"window_test_{m}": (result.get("test_window") or {}).get(m) for m in METRICS}}


_EMPTY_RESULT = {"epochs": 0, "steps": 0, "train_seconds": 0.0,
                 "test": {m: 0.0 for m in METRICS}, "validation": {m: 0.0 for m in METRICS}}


def _row_fields() -> list:
    from tfrs_logq.sasrec.training import resolve_config

    return list(_row(resolve_config(None), "", _EMPTY_RESULT))


def _key(row: dict) -> tuple:
    return (row["dataset"], row["split"], row["loss"], int(row["seed"]), row["preset"])


def _loss_order(loss: str) -> int:
    return list(ROW_LABELS).index(loss) if loss in ROW_LABELS else len(ROW_LABELS)


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text == "" else text


def read_outputs(output_dir: str) -> list[tuple[dict, list]]:
    """The rows of ``output_dir/results.csv`` with their validation curves (from
    ``curves.csv``; empty when absent), or [] when there is no table yet."""
    rows = [{k: _number(v) for k, v in row.items()}
            for row in read_rows(os.path.join(output_dir, "results.csv"))]
    curves: dict = {}
    for line in read_rows(os.path.join(output_dir, "curves.csv")):
        curves.setdefault(_key(line), []).append(float(line["val_ndcg@10"]))
    return [(row, curves.get(_key(row), [])) for row in rows]


def _train_in_subprocess(config_fields: dict, run_dir: str, verbose) -> dict:
    # A worker process of `run_grid(parallel > 1)`: several runs share one GPU.
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    from tfrs_logq.sasrec.training import TrainConfig

    return train(TrainConfig(**config_fields), run_dir, verbose=verbose)


def run_grid(output_dir: str, datasets: Sequence[str], splits: Sequence[str],
             losses: Sequence[str], seeds: Sequence[int], preset: str,
             data_dir: Optional[str] = None, verbose=0, parallel: int = 1,
             **overrides) -> list[dict]:
    """Runs the grid and writes its outputs after every finished run.

    Args:
      parallel: int. Runs trained at once, each in its own process (one process
        per run, GPU memory growth on): a model as small as the paper's SASRec
        leaves most of a GPU idle, so several runs share it. Defaults to 1 (in
        this process).
    """
    if int(parallel) < 1:
        raise ValueError(f"`parallel` (--parallel) must be >= 1, received {parallel}.")
    # Seed-major: an interrupted grid still has every loss for the first seeds.
    jobs = []
    for seed, dataset, split, loss in itertools.product(seeds, datasets, splits, losses):
        run_dir = os.path.join(output_dir, "runs", f"{dataset}_{split}_{loss}_seed{seed}")
        config = resolve_config(preset, dataset=dataset, split=split, loss=loss, seed=seed,
                                data_dir=data_dir, **overrides)
        jobs.append((config, run_dir))
    results: dict = {}
    curves: dict = {}
    # Rows of earlier grids in ``output_dir`` (other losses or seeds) stay in the table.
    keys = {_key(_row(config, preset, _EMPTY_RESULT)) for config, _ in jobs}
    earlier = [(row, curve) for row, curve in read_outputs(output_dir) if _key(row) not in keys]

    def finished(index: int, result: dict) -> None:
        results[index] = _row(jobs[index][0], preset, result)
        curves[index] = result.get("validation_curve", [])
        print(json.dumps(results[index]), flush=True)
        merged = earlier + [(results[i], curves[i]) for i in sorted(results)]
        merged.sort(key=lambda rc: (rc[0]["seed"], _loss_order(rc[0]["loss"])))
        write_outputs([r for r, _ in merged], output_dir, [c for _, c in merged])

    pending = []
    for index, (config, run_dir) in enumerate(jobs):
        metrics_path = os.path.join(run_dir, "metrics.json")
        if os.path.exists(metrics_path) and same_run(config, run_dir):
            with open(metrics_path) as f:
                finished(index, json.load(f))
        else:  # new, or interrupted (resumes); another config raises RunDirectoryError
            pending.append(index)
    if int(parallel) == 1:
        for index in pending:
            finished(index, train(jobs[index][0], jobs[index][1], verbose=verbose))
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(int(parallel), mp_context=context,
                                                    max_tasks_per_child=1) as pool:
            futures = {pool.submit(_train_in_subprocess, dataclasses.asdict(jobs[i][0]),
                                   jobs[i][1], verbose): i for i in pending}
            for future in concurrent.futures.as_completed(futures):
                finished(futures[future], future.result())
    return [results[i] for i in sorted(results)]


def write_outputs(rows: list[dict], output_dir: str,
                  curves: Optional[Sequence[Sequence[float]]] = None) -> None:
    """``results.csv``, ``table.md``, ``table.png`` and, with ``curves`` (each row's
    validation NDCG@10 per epoch), ``curves.csv`` and ``curves.png``; each file is
    replaced atomically."""
    os.makedirs(output_dir, exist_ok=True)
    if curves is not None:
        _write_curves(rows, curves, output_dir)
    # Rows read from an older table may lack newer columns: this release's columns
    # first, in their order, then any others.
    fields = list(dict.fromkeys([*_row_fields(), *(k for row in rows for k in row)]))
    write_csv(os.path.join(output_dir, "results.csv"), rows, fields, restval="")
    write_text(os.path.join(output_dir, "table.md"), markdown_table(rows) + "\n")
    _chart(rows, os.path.join(output_dir, "table.png"))


def _write_curves(rows, curves, output_dir: str) -> None:
    write_csv(os.path.join(output_dir, "curves.csv"),
              (dict(zip(CURVE_FIELDS, (*_key(row), epoch, value)))
               for row, curve in zip(rows, curves) for epoch, value in enumerate(curve)),
              CURVE_FIELDS)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row, curve in zip(rows, curves):
        ax.plot(range(len(curve)), curve, lw=1,
                label=f"{ROW_LABELS.get(row['loss'], row['loss'])}, seed {row['seed']}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation NDCG@10")
    ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, os.path.join(output_dir, "curves.png"), format="png", dpi=110)
    plt.close(fig)


def _summary(rows):
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["loss"], r["dataset"], r["split"]), []).append(r)
    return groups


def markdown_table(rows: list[dict]) -> str:
    groups = _summary(rows)
    columns = sorted({(r["dataset"], r["split"]) for r in rows})
    losses = [k for k in ROW_LABELS if any(r["loss"] == k for r in rows)]
    header = "| Loss | " + " | ".join(f"{d} {s} R@20 | {d} {s} N@20" for d, s in columns) + " |"
    lines = [header, "|---|" + "---|" * (2 * len(columns))]
    for loss in losses:
        cells = []
        for d, s in columns:
            runs = groups.get((loss, d, s), [])
            for m in METRICS:
                values = np.array([r[f"test_{m}"] for r in runs], float)
                if len(values) == 0:
                    cells.append("")
                elif len(values) == 1:
                    cells.append(f"{values[0]:.4f}")
                else:
                    cells.append(f"{values.mean():.4f} ± {values.std(ddof=1):.4f}")
        lines.append(f"| {ROW_LABELS[loss]} | " + " | ".join(cells) + " |")
    seeds = sorted({r["seed"] for r in rows})
    lines.append("")
    lines.append(f"Test split; mean ± sample std over seeds {seeds}; preset "
                 f"{sorted({r['preset'] for r in rows})}.")
    return "\n".join(lines)


def _chart_figure(rows: list[dict]):
    """The figure of ``table.png``: test NDCG@20 per loss, one panel per dataset and split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    groups = _summary(rows)
    columns = sorted({(r["dataset"], r["split"]) for r in rows})
    losses = [k for k in ROW_LABELS if any(r["loss"] == k for r in rows)]
    fig, axes = plt.subplots(1, len(columns), figsize=(6 * len(columns), 4.5), squeeze=False)
    for ax, (d, s) in zip(axes[0], columns):
        means, errs = [], []
        for loss in losses:
            values = np.array([r["test_ndcg@20"] for r in groups.get((loss, d, s), [])], float)
            means.append(values.mean() if len(values) else 0.0)
            errs.append(values.std(ddof=1) if len(values) > 1 else 0.0)
        ax.barh(range(len(losses)), means, xerr=errs, color="tab:blue")
        ax.set_yticks(range(len(losses)), [ROW_LABELS[k] for k in losses], fontsize=8)
        ax.invert_yaxis()
        # At most 5 x ticks: with small figures (a smoke run's 0.0035) the default ~10
        # labels of 6 characters each overlapped in the panel left of the loss names.
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, min_n_ticks=3))
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlabel("test NDCG@20")
        ax.set_title(f"{d}, {s} split", fontsize=9)
    fig.tight_layout()
    return fig


def _chart(rows: list[dict], path: str) -> None:
    import matplotlib.pyplot as plt

    fig = _chart_figure(rows)
    save_figure(fig, path, format="png", dpi=110)
    plt.close(fig)


__all__ = ["CURVE_FIELDS", "METRICS", "ROW_LABELS", "markdown_table", "read_outputs", "run_grid",
           "write_outputs"]
