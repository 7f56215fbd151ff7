"""`tfrs-logq train` through the command line, end to end on data the tests write (the
library's training: test_training.py; the lab's grid of runs: tests/lab/test_experiment_grid.py)."""

import json
import os
import shutil
import subprocess
import sys

from cli_process import cli_in_process


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tfrs_logq.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def test_train_cli_smoke_writes_model_dir_and_json(data_dir, tmp_path):
    model_dir = tmp_path / "model"
    proc = _cli("train", "--dataset", "ml-1m", "--split", "temporal", "--loss", "mns-corrected",
                "--preset", "smoke", "--model-dir", str(model_dir), "--data-dir", data_dir,
                "--seed", "3", "--length-buckets", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loss"] == "mns-corrected" and result["seed"] == 3
    # The path is recorded: on this CPU host the kernels run when they can be built.
    native_possible = (shutil.which(os.environ.get("CXX", "g++").split()[0]) is not None
                       and os.environ.get("TFRS_LOGQ_NATIVE", "").lower()
                       not in ("0", "off", "false", "no"))
    assert result["native_kernels"] is native_possible
    for part in ("validation", "test"):
        for key in ("recall@10", "ndcg@10", "recall@20", "ndcg@20"):
            assert 0.0 <= result[part][key] <= 1.0
    for name in ("config.json", "metrics.json", "vocabulary.json", "best.weights.index"):
        assert (model_dir / name).exists(), name
    assert any((model_dir / "logs").rglob("events.out.tfevents*"))
    config = json.loads((model_dir / "config.json").read_text())
    assert config["preset"] == "smoke" and config["num_items"] > 0


def test_train_cli_refuses_out_of_range_sizes_at_once_and_writes_nothing(data_dir, tmp_path,
                                                                          capsys, monkeypatch):
    # Before: `--max-length 100000000 --preset smoke` ran 87 s to a 21 GB peak, then a
    # traceback, exit 1, and a config.json that blocked the retry. Now the config is
    # refused before any model is built (counted) or any file written.
    from tfrs_logq.sasrec import training

    built = []

    def build_model(*args, **kwargs):
        built.append(args)
        raise AssertionError("a model was built")

    monkeypatch.setattr(training, "build_model", build_model)
    for flags, fragment in ((["--max-length", "100000000"], "--max-length"),
                            (["--max-length", "10000"], "--max-tensor-gib"),  # 11.9 GiB
                            (["--embedding-dim", "100000"], "--embedding-dim"),
                            (["--num-negatives", "2000000"], "--num-negatives"),
                            (["--embedding-dim", "30", "--num-heads", "4"], "--num-heads")):
        model_dir = tmp_path / "m"
        proc = cli_in_process(capsys, "train", "--preset", "smoke", "--split", "loo",
                           "--data-dir", data_dir, "--model-dir", str(model_dir), *flags)
        assert proc.returncode == 2, (flags, proc.stderr[-2000:])
        lines = [line for line in proc.stderr.splitlines() if "error" in line]
        assert len(lines) == 1 and fragment in lines[0], (flags, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
        assert not model_dir.exists() or not any(model_dir.iterdir()), flags
        assert built == [], flags


def test_train_cli_config_file_and_bad_input(data_dir, tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"preset": "smoke", "loss": "gbce", "max_epochs": 1,
                               "length_buckets": 1}))
    proc = cli_in_process(capsys, "train", "--config", str(cfg), "--model-dir",
                       str(tmp_path / "m"), "--data-dir", data_dir, "--split", "loo", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["epochs"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"lossy": 1}))
    proc = cli_in_process(capsys, "train", "--config", str(bad), "--model-dir",
                       str(tmp_path / "m2"), "--data-dir", data_dir)
    assert proc.returncode == 2 and "lossy" in proc.stderr
