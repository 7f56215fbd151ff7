"""`tfrs-logq experiment`: a grid of datasets x splits x losses x seeds, as the paper's Table 1.

Each run is `tfrs_logq.training.train` in its own model directory. A finished
run (its ``metrics.json`` exists) is reused only when its saved ``config.json``
equals the requested config; an interrupted one resumes from its last epoch; a
directory holding a run of another config is an error (choose another
``--output-dir``), so results are never relabelled. Results go to ``results.csv``
(one row per run), ``table.md`` (mean and standard deviation over seeds of
Recall@20 and NDCG@20 on the test split, losses as rows and dataset/split as
columns, like the paper's Table 1) and ``table.png``.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from typing import Optional, Sequence

import numpy as np

from tfrs_logq.training import resolve_config, same_run, train

ROW_LABELS = {
    "bce": "BCE (1 uniform negative)",
    "gbce": "gBCE (256 negatives, t=0.75)",
    "full-softmax": "Full softmax",
    "uniform": "Sampled softmax, uniform",
    "inbatch-none": "In-batch, without logQ",
    "inbatch-logq": "In-batch, standard logQ",
    "inbatch-corrected": "In-batch, improved logQ",
    "mns-none": "MNS, without logQ",
    "mns-logq": "MNS, standard logQ",
    "mns-corrected": "MNS, improved logQ",
}
METRICS = ("recall@20", "ndcg@20")


def run_grid(output_dir: str, datasets: Sequence[str], splits: Sequence[str],
             losses: Sequence[str], seeds: Sequence[int], preset: str,
             data_dir: Optional[str] = None, verbose=0, **overrides) -> list[dict]:
    rows = []
    # Seed-major: an interrupted grid still has every loss for the first seeds.
    for seed, dataset, split, loss in itertools.product(seeds, datasets, splits, losses):
        run_dir = os.path.join(output_dir, "runs", f"{dataset}_{split}_{loss}_seed{seed}")
        metrics_path = os.path.join(run_dir, "metrics.json")
        config = resolve_config(preset, dataset=dataset, split=split, loss=loss, seed=seed,
                                data_dir=data_dir, **overrides)
        if os.path.exists(metrics_path) and same_run(config, run_dir):
            with open(metrics_path) as f:
                result = json.load(f)
        else:  # new, or interrupted (resumes); another config raises RunDirectoryError
            result = train(config, run_dir, verbose=verbose)
        row = {"dataset": dataset, "split": split, "loss": loss, "seed": seed,
               "preset": preset, "epochs": result["epochs"], "steps": result["steps"],
               "train_seconds": result["train_seconds"],
               **{f"test_{m}": result["test"][m] for m in METRICS},
               **{f"val_{m}": result["validation"][m] for m in METRICS}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_outputs(rows, output_dir)
    return rows


def write_outputs(rows: list[dict], output_dir: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    tmp = os.path.join(output_dir, ".results.csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, os.path.join(output_dir, "results.csv"))
    table = markdown_table(rows)
    with open(os.path.join(output_dir, ".table.md.tmp"), "w") as f:
        f.write(table + "\n")
    os.replace(os.path.join(output_dir, ".table.md.tmp"), os.path.join(output_dir, "table.md"))
    _chart(rows, os.path.join(output_dir, "table.png"))


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


def _chart(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.set_xlabel("test NDCG@20")
        ax.set_title(f"{d}, {s} split", fontsize=9)
    fig.tight_layout()
    tmp = path + ".tmp"
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
