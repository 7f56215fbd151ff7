"""`benchmarks.accelerator.torch_step` on CPU, tiny: both corrections train, time and make
no tensor from a Python number (the device run counts the GPU's synchronisations too).

Runs as a subprocess with ``KERAS_BACKEND=torch`` (this directory's other tests hold JAX)."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_torch_step_runs_both_corrections_on_cpu():
    env = dict(os.environ, KERAS_BACKEND="torch", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator.torch_step", "--device", "cpu",
         "--synthetic-items", "500", "--synthetic-users", "50", "--batch", "16",
         "--negatives", "16", "--dim", "4", "--steps", "2", "--rounds", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {m.group(1): m.group(0) for m in
             re.finditer(r"^\s*(logq-tfrs|corrected): .*$", proc.stdout, re.MULTILINE)}
    assert set(lines) == {"logq-tfrs", "corrected"}, proc.stdout
    for line in lines.values():
        assert "tensors from Python numbers/step 0" in line, line
        assert "n/a (not CUDA)" in line, line
    ratio = float(re.search(r"corrected / logq-tfrs: ([0-9.]+)", proc.stdout).group(1))
    assert 0.1 < ratio < 10, proc.stdout
