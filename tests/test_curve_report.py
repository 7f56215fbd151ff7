"""`benchmarks/accelerator/curve_report.py`: the learning curve's paired tables, against
numpy and SciPy computed here."""

import csv

import numpy as np
import pytest
from scipy import stats

from benchmarks.accelerator import curve_report

FIELDS = ["num_items", "proposal", "correction", "seed", "steps", "exact_recall@10",
          "exact_recall@100", "exact_recall@1000", "model_p_q50", "seconds_per_step"]


def _write(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def _row(correction, seed, steps, r10, num_items=1000, proposal="mixture"):
    return {"num_items": num_items, "proposal": proposal, "correction": correction,
            "seed": seed, "steps": steps, "exact_recall@10": r10, "exact_recall@100": 0.5,
            "exact_recall@1000": 0.9, "model_p_q50": 0.01, "seconds_per_step": 0.001}


def test_paired_differences_and_intervals_match_scipy(tmp_path, capsys):
    rng = np.random.default_rng(0)
    corrected, standard = rng.uniform(0.3, 0.6, 3), rng.uniform(0.3, 0.6, 3)
    rows = [_row("corrected", s, 100, corrected[s]) for s in range(3)]
    rows += [_row("logq-tfrs", s, 100, standard[s]) for s in range(3)]
    rows += [_row("corrected", 0, 300, 0.7), _row("none", 0, 300, 0.25)]
    rows += [_row("corrected", 0, 100, 0.1, num_items=5)]  # another world: left out
    path = tmp_path / "results.csv"
    _write(path, rows)
    assert curve_report.main([str(path), "--synthetic-items", "1000"]) == 0
    levels, paired = capsys.readouterr().out.strip().split("\n\n")
    text = levels + "\n" + paired
    diff = corrected - standard
    half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
    line = next(x for x in paired.splitlines() if x.startswith("| 100 | logq-tfrs | 0,1,2 |"))
    assert f"{diff.mean():+.4f} ± {half:.4f}" in line
    assert " / ".join(["%+.4f" % diff[0], "+0.0000", "+0.0000"]) in line
    single = next(x for x in paired.splitlines() if x.startswith("| 300 | none | 0 |"))
    assert "+0.4500" in single and "±" not in single  # one seed: no interval
    assert "| 100 | corrected | 0 | 0.1000" not in text
    assert len([x for x in levels.splitlines() if x.startswith("| 100 | ")]) == 6
    assert len([x for x in paired.splitlines() if x.startswith("| 100 | ")]) == 1


def test_no_rows_for_the_world_is_a_one_line_error(tmp_path):
    path = tmp_path / "results.csv"
    _write(path, [_row("corrected", 0, 100, 0.5)])
    with pytest.raises(SystemExit, match="no rows with num_items=7"):
        curve_report.main([str(path), "--synthetic-items", "7"])


def test_importing_the_report_leaves_keras_backend_alone():
    # The package once set KERAS_BACKEND=jax on import: in this TensorFlow process it
    # leaked to every later subprocess, whose Keras 3 then could not import (no JAX here).
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", "import os\n"
                           "import benchmarks.accelerator.curve_report\n"
                           "print(os.environ.get('KERAS_BACKEND'))"],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "None"
