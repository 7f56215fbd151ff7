"""`benchmarks/study_scann.py --quick`: its output's structure and the exact rows' sanity."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("scann")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "study_scann.py")


def test_quick_mode_compares_scann_with_brute_force_on_a_tree_index(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--quick", "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.startswith("machine: ")
    number = r"([0-9.]+)"
    rows = re.findall(r"^\| (corrected|logq-paper) \(mixture\) \| (brute force|scann) \| "
                      + r" \| ".join([number] * 6) + r" \| ([0-9. /]+) \| [0-9.]+ \|$",
                      text, re.M)
    assert [(r[0], r[1]) for r in rows] == [("logq-paper", "brute force"),
                                            ("logq-paper", "scann"),
                                            ("corrected", "brute force"),
                                            ("corrected", "scann")]
    for row in rows:
        exact = [float(x) for x in row[2:5]]
        assert 0 < exact[0] <= exact[1] <= exact[2] <= 1
    overlaps = [float(x) for x in rows[1][8].split(" / ")]
    # 20 steps leave the embeddings near random, which is hard for any ANN index: only
    # the range and the head of the list are checked, not the index's quality.
    assert all(0.0 < o <= 1.0 for o in overlaps) and overlaps[0] > 0.5, overlaps
    assert "corrected − logq-paper, scann: Δ exact R@10/100/1000" in text
    assert (tmp_path / "scann.md").read_text() == text
    assert '"num_leaves"' in (tmp_path / "scann.json").read_text()  # the tree was used
