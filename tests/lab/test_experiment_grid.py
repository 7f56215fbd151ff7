"""``python -m lab experiment``, the SASRec grid, end to end on data the tests write: the
table, the curves, resuming and refusing another config, and runs in parallel processes."""

import os

import pytest
from cli_process import cli_in_process

from lab.cli import main
from lab.experiment import run_grid


def experiment(capsys, *args):
    return cli_in_process(capsys, "experiment", *args, main=main)


@pytest.mark.slow  # a grid of smoke trainings: 51 s on 2 cores; make test-slow runs it
def test_experiment_grid_writes_table(data_dir, tmp_path, capsys):
    # In this process (lab.cli.main): four interpreters importing TensorFlow cost about
    # 20 s of the suite.
    out = tmp_path / "exp"
    proc = experiment(capsys, "--output-dir", str(out), "--preset", "smoke",
                      "--data-dir", data_dir, "--loss",
                      "inbatch-logq-official", "inbatch-corrected", "--seeds", "0", "1",
                      "--max-epochs", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert "In-batch, standard logQ" in table and "In-batch, improved logQ" in table
    assert "±" in table  # two seeds -> mean ± std
    assert (out / "table.png").read_bytes()[:4] == b"\x89PNG"
    assert len((out / "results.csv").read_text().strip().splitlines()) == 1 + 4
    # Validation curves: one line per run and epoch (1 epoch each here), and a chart.
    curves = (out / "curves.csv").read_text().strip().splitlines()
    assert curves[0] == "dataset,split,loss,seed,preset,epoch,val_ndcg@10"
    assert len(curves) == 1 + 4
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # A finished grid is not run again.
    again = experiment(capsys, "--output-dir", str(out), "--preset", "smoke",
                       "--data-dir", data_dir, "--loss", "inbatch-logq-official",
                       "--seeds", "0", "--max-epochs", "1", "--json")
    assert again.returncode == 0 and "Epoch" not in again.stdout
    # A later grid in the same directory keeps the earlier rows and curves in its table.
    more = experiment(capsys, "--output-dir", str(out), "--preset", "smoke",
                      "--data-dir", data_dir, "--loss", "mns-none", "--seeds", "0",
                      "--max-epochs", "1", "--json")
    assert more.returncode == 0, more.stderr[-3000:]
    lines = (out / "results.csv").read_text().strip().splitlines()
    assert len(lines) == 1 + 5 and sum(",mns-none," in line for line in lines) == 1
    assert len((out / "curves.csv").read_text().strip().splitlines()) == 1 + 5
    assert "MNS, without logQ" in (out / "table.md").read_text()
    # A grid asking for another config never relabels the finished runs.
    other = experiment(capsys, "--output-dir", str(out), "--preset", "smoke",
                       "--data-dir", data_dir, "--loss", "inbatch-logq-official",
                       "--seeds", "0", "--max-epochs", "2", "--json")
    assert other.returncode != 0 and "another config" in other.stderr


@pytest.mark.slow  # a grid in worker processes: 19 s on 2 cores; make test-slow (CI) runs it
def test_experiment_runs_in_parallel_processes(data_dir, tmp_path):
    out = str(tmp_path / "grid")
    rows = run_grid(out, ["ml-1m"], ["loo"], ["inbatch-none", "mns-corrected"], [0], "smoke",
                    data_dir=data_dir, parallel=2, max_epochs=1, steps_per_epoch=2)
    assert [r["loss"] for r in rows] == ["inbatch-none", "mns-corrected"]
    for row in rows:
        assert 0.0 <= row["test_ndcg@20"] <= 1.0 and row["epochs"] == 1
    assert len(open(os.path.join(out, "results.csv")).read().strip().splitlines()) == 3
    with pytest.raises(ValueError, match="parallel"):
        run_grid(out, ["ml-1m"], ["loo"], ["inbatch-none"], [0], "smoke", parallel=0)
