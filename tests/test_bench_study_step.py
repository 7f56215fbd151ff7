"""`benchmarks/bench_study_step.py --quick`: the output's structure (never its timings)."""

import os
import re
import subprocess
import sys

import pytest

# A benchmark's smoke run (25-45 s): `make test-slow` (CI runs it after `make test`).
pytestmark = pytest.mark.slow

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_study_step.py")


def test_quick_mode_prints_the_ratio_and_the_catalog_table():
    out = subprocess.run([sys.executable, SCRIPT, "--quick"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.startswith("machine: ") and "load average" in text
    assert "## Study step vs stock TFRS" in text
    for variant in ("ours corrected", "stock TFRS logQ", "stock TFRS logQ + hits + mask"):
        assert re.search(rf"^\| {re.escape(variant)} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$",
                         text, re.M), variant
    assert re.search(r"^ratio corrected / stock TFRS logQ: [0-9.]+$", text, re.M)
    assert "## Study step against catalog size" in text
    rows = re.findall(r"^\| ([0-9,]+) \| (lazy-adam|adam) \| ([0-9.]+) \| ([0-9,]+) \| "
                      r"([0-9,]+) \|$", text, re.M)
    assert [(r[0], r[1]) for r in rows] == [("1,000", "lazy-adam"), ("10,000", "adam")]
    for _, _, _, setup, peak in rows:
        assert int(peak.replace(",", "")) >= int(setup.replace(",", "")) > 0
